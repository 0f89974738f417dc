"""Data set YAMLs: reading and checking them, resolving split paths, and downloading missing data sets.

A data YAML names image folders or ``.txt`` lists (``train``, ``val``, optional ``test``) relative to its
``path``, the class count ``nc`` and ``names``, and optionally a ``download`` URL used when a split is missing
(then the registered converter named by ``convert``). A split may instead be a mapping naming a COCO JSON file or a
folder of VOC XML files (utils.data.formats), or tar shards by local path or URL (utils.data.shard_urls).
YAMLs may come from strangers: class names must be plain one-line strings of at most MAX_NAME_LENGTH
characters (never lists that aliases could expand); downloads go through utils.data.download, only into the
data set's folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from utils.data.download import download_dataset
from utils.data.errors import MAX_NAME_LENGTH, DataError
from utils.data.formats import split_from_mapping
from utils.data.shard_urls import ShardSpec, ShardSpecError, check_split_budget, is_shard_spec, parse_shard_spec
from utils.data.zoo import CONVERTERS
from utils.distributed import comm as dist
from utils.log import LOGGER
from utils.paths import ROOT, confined, confined_to_any, data_home
from utils.safe_yaml import YamlError, load_yaml, shown
from utils.tasks.registry import BASE_TASK, all_tasks, get_task, task_names

DEFAULT_DATA = ROOT / "data" / "synthetic.yaml"
MAX_CLASSES = 10_000
MAX_SPLIT_ENTRIES = 1000


@dataclass
class DataConfig:
    """A resolved data YAML: absolute split paths, class names and where it came from."""

    root: Path
    train: list[Any]  # paths (YOLO folders, .txt lists) and annotation splits (utils.data.formats)
    val: list[Any]
    test: list[Any] | None
    nc: int
    names: list[str]
    yaml_file: Path
    is_coco: bool = False
    download: Any = None
    task_options: dict = field(default_factory=dict)  # the keys registered tasks read (Task.data_keys), as given


def _find_yaml(path: str | Path | None) -> Path:
    """The YAML file for ``--data``: as given, else under ``data/`` (so ``--data coco128.yaml`` works); or a data
    folder as given (``--data imagenet10/``: see _folder_data)."""
    if path in (None, ""):
        return DEFAULT_DATA
    if Path(path).is_dir():
        return Path(path).resolve()
    candidates = [Path(path), ROOT / "data" / Path(path).name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise DataError(f"--data {path}: file not found (give a data YAML path such as data/synthetic.yaml)")


def _folder_data(folder: Path) -> dict:
    """``--data FOLDER`` for a data set laid out as ``FOLDER/train``, ``FOLDER/val`` (else ``FOLDER/test`` validates)
    and an optional ``FOLDER/test``: the data YAML it stands for, whose classes come from what the training split
    holds (Task.class_names: a classifier's class folders)."""
    splits = [s for s in ("train", "val", "test") if (folder / s).is_dir()]
    if "train" not in splits or len(splits) < 2:
        raise DataError(f"--data {folder}: a data folder holds train/ and val/ (or test/) folders; for any other "
                        "layout give a data YAML")
    return {"path": str(folder), "train": "train", "val": "val" if "val" in splits else "test",
            **({"test": "test"} if "test" in splits else {})}


def _names_in_folders(data: dict, root: Path, yaml_file: Path) -> list[str] | None:
    """Class names for data that gives neither ``nc`` nor ``names``: those its training split (one folder) holds in
    the layout of a task that reads them from its data (Task.class_names), else None."""
    split = data.get("train")
    if data.get("nc") is not None or data.get("names") is not None or not isinstance(split, str) \
            or is_shard_spec(split):
        return None
    folder = confined(split, root, f"{yaml_file}: 'train' entry", DataError)
    readers = (task.load("class_names") for task in all_tasks() if task.class_names)
    return next((names for names in (reader(folder) for reader in readers) if names), None)


def _read_yaml(path: Path) -> dict:
    if path.is_dir():
        return _folder_data(path)
    try:
        content = load_yaml(path)
    except YamlError as e:
        raise DataError(str(e)) from None
    if not isinstance(content, dict):
        raise DataError(f"{path}: expected a mapping with keys path, train, val, nc, names")
    return content


def _parse_names(data: dict, yaml_file: Path) -> tuple[int, list[str]]:
    names = data.get("names")
    if isinstance(names, dict):
        try:
            names = [names[k] for k in sorted(names, key=int)]
        except (TypeError, ValueError):
            raise DataError(f"{yaml_file}: 'names' keys must be class indices 0..nc-1") from None
    if names is not None and not isinstance(names, list):
        raise DataError(f"{yaml_file}: 'names' must be a list or a mapping of class index to name")
    nc = data.get("nc", len(names) if names else None)
    if not isinstance(nc, int) or isinstance(nc, bool) or not 1 <= nc <= MAX_CLASSES:
        raise DataError(f"{yaml_file}: 'nc' must be a class count in 1..{MAX_CLASSES} (got {shown(nc)})"
                        + ("; or name class folders (train/<class>/<image>)" if nc is None else ""))
    names = [_plain_name(n, yaml_file) for n in names] if names else [f"class{i}" for i in range(nc)]
    if len(names) != nc:
        raise DataError(f"{yaml_file}: nc is {nc} but 'names' lists {len(names)} classes; make them agree")
    return nc, names


def _plain_name(name: Any, yaml_file: Path) -> str:
    """A class name as a one-line string of bounded length (a list or mapping from a YAML alias is refused)."""
    if isinstance(name, bool) or not isinstance(name, (str, int, float)):
        raise DataError(f"{yaml_file}: class names must be plain strings, found a {type(name).__name__}")
    text = str(name)
    if not 0 < len(text) <= MAX_NAME_LENGTH or not text.isprintable():
        raise DataError(f"{yaml_file}: class name {text[:40]!r}... must be 1..{MAX_NAME_LENGTH} printable characters "
                        "on one line")
    return text


def _dataset_root(data: dict, yaml_file: Path) -> Path:
    """The data set's folder: ``path`` beside the YAML (relative paths), else in data_home() when it is to be
    downloaded; ``synthetic:`` generates the built-in set there (or in its default folder). A ``path`` must lie in
    the YAML's folder, the data home or the project's ``datasets/`` (confined_to_any), so a YAML cannot aim reads,
    downloads or generation at ``..`` or ``/``."""
    homes = list(dict.fromkeys([yaml_file.parent, data_home(), ROOT / "datasets"]))  # also the default data home
    if "synthetic" in data:
        params = data["synthetic"] or {}
        if not isinstance(params, dict):
            raise DataError(f"{yaml_file}: 'synthetic' must be a mapping (task, n_train, n_val, img_size, seed)")
        from utils.data.synthetic import SyntheticError

        root = None if data.get("path") in (None, "") else confined_to_any(data["path"], homes, f"{yaml_file}: path",
                                                                      DataError)
        params = dict(params)
        task = params.pop("task", BASE_TASK)
        if not isinstance(task, str) or task not in task_names():
            raise DataError(f"{yaml_file}: synthetic task {shown(task)} is not one of {', '.join(task_names())}")
        try:
            return get_task(task).load("synthetic")(root=root, **params)
        except (TypeError, ValueError) as e:
            raise DataError(f"{yaml_file}: bad 'synthetic' parameters: {str(e)[:200]}") from None
        except SyntheticError as e:
            raise DataError(f"{yaml_file}: {e}") from None
    if data.get("path") in (None, ""):
        return yaml_file.parent
    value, what = data["path"], f"{yaml_file}: path"
    if isinstance(value, str) and not Path(value).expanduser().is_absolute() and data.get("download"):
        try:
            beside = (yaml_file.parent / value).resolve()
        except (OSError, RuntimeError, ValueError):  # not a usable path: confined_to_any says so below
            beside = None
        if beside is None or not beside.exists():  # a data set to download goes to the data home
            return confined_to_any(value, [data_home()], what, DataError)
    return confined_to_any(value, homes, what, DataError)


def _split_paths(value: Any, root: Path, names: list[str], yaml_file: Path, key: str = "split") -> list[Any]:
    """A split's entries: YOLO folders and lists as paths, mappings as annotation splits (utils.data.formats); each
    path resolved and confined to the data set's folder ``root``."""
    values = value if isinstance(value, list | tuple) else [value]
    if len(values) > MAX_SPLIT_ENTRIES or not all((isinstance(v, str) and v) or isinstance(v, dict) for v in values):
        raise DataError(f"{yaml_file}: '{key}' must be a path or a list of paths (or an annotation mapping), at "
                        f"most {MAX_SPLIT_ENTRIES} entries")
    try:  # a split streams one shard set, of at most MAX_SHARDS shards: counted before any is expanded
        check_split_budget([v for v in values if is_shard_spec(v)], f"'{key}'")
    except ShardSpecError as e:
        raise DataError(f"{yaml_file}: {e}") from None
    return [split_from_mapping(v, root, names, yaml_file) if isinstance(v, dict) else
            _shards(v, root, yaml_file, key) if is_shard_spec(v) else
            confined(v, root, f"{yaml_file}: '{key}' entry", DataError) for v in values]


def _shards(value: str, root: Path, yaml_file: Path, key: str) -> ShardSpec:
    """A split entry naming tar shards (utils.data.shard_urls): local ones confined to the data set's folder."""
    try:
        return parse_shard_spec(value, root, lambda p: confined(p, root, f"{yaml_file}: '{key}' shards", DataError))
    except ShardSpecError as e:
        raise DataError(f"{yaml_file}: '{key}': {e}") from None


def check_converter(name: Any, yaml_file: Path) -> None:
    """A YAML's ``convert`` must name a registered converter (utils.data.zoo); None means none."""
    if name is not None and (not isinstance(name, str) or name not in CONVERTERS):
        raise DataError(f"{yaml_file}: convert: {shown(name)} is not a known converter "
                        f"({', '.join(sorted(CONVERTERS))})")


def run_converter(name: Any, root: Path, names: list[str], yaml_file: Path) -> None:
    """Run the YAML's named converter on freshly downloaded files (never code from the YAML)."""
    if name is not None:
        LOGGER.info(f"Converting {root} with the '{name}' converter of {yaml_file.name} ...")
        CONVERTERS[name](root, names)


def task_options(data: dict) -> dict:
    """The values of the keys registered tasks read from a data YAML (``Task.data_keys``; each task's sample part
    checks its own), as the YAML gives them."""
    keys = {key for task in all_tasks() for key in task.data_keys}
    return {key: data[key] for key in sorted(keys) if key in data}


def load_data_config(path: str | Path | None = None) -> DataConfig:
    """Read and resolve a data YAML (default: the built-in synthetic set, generated on first use).

    Missing splits are downloaded when the YAML has a ``download`` key (zero-first), otherwise a
    DataError names the resolved path. All ranks must call it (it may run zero-first sections).
    """
    yaml_file = _find_yaml(path)
    data = _read_yaml(yaml_file)
    for key in ("train", "val"):
        if not data.get(key):
            raise DataError(f"{yaml_file}: missing '{key}' (a folder of images, a .txt list, or a list of them)")
    root = _dataset_root(data, yaml_file)
    found = _names_in_folders(data, root, yaml_file)
    nc, names = _parse_names(data if found is None else {**data, "names": found}, yaml_file)
    check_converter(data.get("convert"), yaml_file)
    splits = {k: _split_paths(data[k], root, names, yaml_file, k) for k in ("train", "val", "test") if data.get(k)}
    missing = [p for paths in splits.values() for p in paths if not p.exists()]
    if missing and data.get("download"):
        with dist.zero_first(local=True):
            if dist.is_local_main_process() and not all(p.exists() for p in missing):
                download_dataset(data["download"], root, homes=[data_home(), yaml_file.parent])
                run_converter(data.get("convert"), root, names, yaml_file)
        missing = [p for p in missing if not p.exists()]
    if missing:
        raise DataError(f"{yaml_file}: split path {missing[0]} does not exist; check 'path' and the split entries")
    return DataConfig(root=root, train=splits["train"], val=splits["val"], test=splits.get("test"), nc=nc,
                      names=names, yaml_file=yaml_file, is_coco=yaml_file.name == "coco.yaml" and nc == 80,
                      download=data.get("download"), task_options=task_options(data))
