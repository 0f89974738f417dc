"""Official YOLOv5 release weights (``yolov5{n,s,m,l,x}{,6}.pt`` of v5.0 ... v7.0, ``yolov5{n,...,x}-seg.pt`` of v7.0)
read without running pickled code.

The release files are torch zip pickles of whole ``models.yolo.Model`` / ``DetectionModel`` / ``SegmentationModel`` in
fp16. Unpickling them normally imports and calls whatever the file names. Here :mod:`utils.weights.safe_pickle`
reads them: every class of the model namespaces (``models.*``, ``torch.nn.modules.*``, ...) becomes an inert
:class:`Record` that keeps its pickled state and is never imported or called; tensors are checked views of the
file's storages; any other global (``os.system``, ``builtins.eval``, ``subprocess.*``) is refused before it is
resolved. From the records we rebuild the flat state dict and the architecture (the model's ``yaml`` dict), check
that the yaml builds exactly the stored tensors (on the meta device), build our own ``models.yolo.Model``, load every
tensor strictly and return a checkpoint in this project's format.
"""

from __future__ import annotations

import pickle
import pickletools
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.yolo import Model, ModelConfigError
from utils.tasks.registry import all_tasks
from utils.weights.checkpoint import CheckpointError, new_checkpoint, plain_names, register_release_reader, to_plain
from utils.weights.safe_pickle import (
    _LEGACY_MODULES,
    Record,
    UnsafeGlobalError,
    data_pickle_name,
    numpy_array,
    safe_load,
)
from utils.weights.untrusted import (
    UntrustedFileError,
    check_config_against_state,
    check_state_fits,
    check_zip_members,
    walk,
)

RELEASE_SOURCE = "yolov5-release"
MODEL_CLASSES = ("models.yolo.Model", "models.yolo.DetectionModel")  # v5.0/v6.x and v7.0 detection models
RELEASE_MARKERS = ("models.yolo.", "models.common.", "ultralytics.")  # globals of YOLOv5's and ultralytics' pickles
__all__ = ["Record", "UnsafeGlobalError", "load_release_checkpoint", "read_records", "is_release_file"]


# ------------------------------------------------------------------------------------------ reading the file
def pickle_globals(path: str | Path) -> list[str]:
    """The globals (``module.name``) a torch zip file's data.pkl names, found by reading opcodes, never by running."""
    try:
        names = [m.filename for m in check_zip_members(path)]  # stored members only: no decompression bombs
        with zipfile.ZipFile(path) as archive:
            data = archive.read(data_pickle_name(names))
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError):
        return []
    found, last, stack, memo = [], None, [], {}
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("GLOBAL", "INST"):
                found.append(str(arg).replace(" ", "."))
            elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
                last = arg
                stack.append(arg)
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                memo[arg if op.name != "MEMOIZE" else len(memo)] = last
            elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                last = memo.get(arg)
                stack.append(last)
            elif op.name == "STACK_GLOBAL" and len(stack) >= 2:
                found.append(f"{stack[-2]}.{stack[-1]}")
            else:
                last = None
    except (ValueError, EOFError):  # a damaged pickle: report what was read so far
        pass
    return list(dict.fromkeys(_normalise_global(g) for g in found))


def _normalise_global(name: str) -> str:
    module, _, rest = name.partition(".")
    return f"{_LEGACY_MODULES.get(module, module)}.{rest}"


def is_release_file(path: str | Path) -> bool:
    """True when ``path`` pickles classes of the reference YOLOv5 (``models.yolo.*`` / ``models.common.*``) or of
    ultralytics (``ultralytics.*``: read by :mod:`utils.weights.ultralytics_reader`)."""
    return any(g.startswith(RELEASE_MARKERS) for g in pickle_globals(path))


def read_records(path: str | Path) -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler`: tensors are real, every object of a class is a Record.

    Raises CheckpointError (one line, naming the file and the global) for anything outside the allow-list.
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path} is not a PyTorch zip file; only zip-format release files can be read safely")
    with zipfile.ZipFile(path) as archive:
        if any(name.endswith("constants.pkl") for name in archive.namelist()):  # a TorchScript archive
            raise CheckpointError(f"{path} is a TorchScript archive, not a release checkpoint; run it with detect.py")
    try:
        return _arrays(safe_load(path))
    except UnsafeGlobalError as e:
        raise CheckpointError(f"{path}: refused: {e}; nothing from the file was run or changed") from None
    except UntrustedFileError as e:
        raise CheckpointError(f"{path}: refused: {e}") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError,
            KeyError, IndexError, RecursionError, MemoryError, OverflowError, zipfile.BadZipFile) as e:
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise CheckpointError(f"{path} cannot be read as a release file ({reason})") from None


def _arrays(raw: Any) -> Any:
    """The unpickled structure with each pickled numpy array (an inert record until now) as a real array."""
    for _, value in walk(raw, children=_record_children):
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in list(items):
            if isinstance(item, Record) and item.global_name == "numpy.ndarray":
                value[key] = numpy_array(item)
    return raw


def _record_children(value: Any) -> dict | None:
    """What :func:`utils.weights.untrusted.walk` descends into inside a record: its pickled attributes."""
    return value.attrs if isinstance(value, Record) else None


# ------------------------------------------------------------------------------------------ records -> our model
class _FormatError(ValueError):
    """The records do not describe a model we can build; converted to a CheckpointError naming the file."""


# Constructor settings that change the output without changing any tensor's shape, compared module by module.
_SETTINGS = {
    "Conv2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"),
    "MaxPool2d": ("kernel_size", "stride", "padding", "dilation", "ceil_mode"),
    "Upsample": ("scale_factor", "mode"),
    "BatchNorm2d": ("eps",),
    "Bottleneck": ("add",),
    "Concat": ("d",),
    "Detect": ("nc", "na", "nl"),
}
_CLASS_ALIASES = {"DetectionModel": ("Model",)}  # v7.0's name for our Model


def release_classes(reader: str, models: Sequence[str] = (), settings: Mapping[str, tuple] | None = None,
                    aliases: Mapping[str, tuple] | None = None, heads: Sequence[str] = ()) -> dict[str, Any]:
    """A weights reader's class tables (``reader``: ``yolov5`` or ``ultralytics``): the base task's given here,
    joined with every registered task's own (its ``releases`` part): ``models`` and ``heads`` (pickled global
    names it reads), ``settings`` (our class -> constructor settings compared), ``aliases`` (their class -> ours),
    ``strideless`` (heads that keep no strides in the file, a classifier's: the model keeps those its yaml builds)."""
    tables = {"models": list(models), "heads": list(heads), "settings": dict(settings or {}),
              "aliases": dict(aliases or {}), "strideless": []}
    for task in all_tasks():
        own = (task.load("releases") or {}).get(reader, {})
        for key in ("models", "heads", "strideless"):
            tables[key] += own.get(key, ())
        tables["settings"].update(own.get("settings", {}))
        tables["aliases"].update(own.get("aliases", {}))
    return tables


def load_release_checkpoint(path: str | Path) -> dict:
    """Read an official YOLOv5 (or ultralytics) release file safely and return it as a checkpoint of this project
    (float32).

    The result is what :func:`utils.weights.checkpoint.new_checkpoint` makes, with the file's class ``names``,
    ``source: "yolov5-release"`` and ``release`` (model class, date, git, epoch, the reference's options); an
    ultralytics file gets :func:`utils.weights.ultralytics_reader.convert_records`' checkpoint instead.
    """
    raw = read_records(path)
    for matches, convert in RECORD_CONVERTERS:
        if matches(raw):
            return convert(raw, path)
    return convert_records(raw, path)


# Other projects' pickled models read by this module's records (ultralytics: utils/weights/ultralytics_reader.py,
# which registers itself): (whether the records are theirs, their checkpoint of this project).
RECORD_CONVERTERS: list[tuple[Callable[[Any], bool], Callable[[Any, str | Path], dict]]] = []


def convert_records(raw: Any, path: str | Path = "<records>") -> dict:
    """The checkpoint of this project for what :func:`read_records` returned; CheckpointError when it does not map."""
    try:
        record = model_record(raw)
        model = release_model(record)
    except (_FormatError, UntrustedFileError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    except ModelConfigError as e:
        raise CheckpointError(f"{path}: the model it describes cannot be built here ({e})") from None
    info = {"model_class": record.global_name, "epoch": _plain(raw.get("epoch")), "date": _plain(raw.get("date")),
            "git": _plain(raw.get("git")), "opt": _plain(raw.get("opt") or {})}
    return new_checkpoint(model, epoch=-1, source=RELEASE_SOURCE, release=info)


def model_record(raw: Any) -> Record:
    """The pickled detection or segmentation model of a release file (its EMA when the file has one, as the
    reference loads it)."""
    if not isinstance(raw, dict):
        raise _FormatError(f"expected a dict with a 'model' entry, found a {type(raw).__name__}")
    record = raw.get("ema") if isinstance(raw.get("ema"), Record) else raw.get("model")
    if not isinstance(record, Record):
        raise _FormatError(f"no pickled model under 'model' or 'ema' (keys: {sorted(map(str, raw))[:8]})")
    models = release_classes("yolov5", MODEL_CLASSES)["models"]
    if record.global_name not in models:
        raise _FormatError(f"holds a {record.global_name}; only YOLOv5 models ({' or '.join(models)}) can be "
                           "loaded")
    return record


def release_model(record: Record) -> Model:
    """Our Model built from the record's ``yaml``, checked module by module, holding every tensor of the file."""
    state = flat_state(record)
    layers = _child(record, "model")
    detect_index = list(_children(layers))[-1]
    detect, prefix = _children(layers)[detect_index], f"model.{detect_index}."
    stride = detect.attrs.get("stride", record.attrs.get("stride"))
    if not isinstance(stride, torch.Tensor) or prefix + "anchors" not in state:
        raise _FormatError(f"the last layer ({detect.global_name}) has no stride or anchors")
    anchors = state.pop(prefix + "anchors")
    if stride.numel() > 16 or anchors.numel() > 16 * 64 * 2 or anchors.dim() != 3 or anchors.shape[0] != stride.numel():
        raise _FormatError(f"the strides {tuple(stride.shape)} and anchors {tuple(anchors.shape)} do not match")
    stride = stride.detach().float().view(-1)
    anchors = anchors.float() * stride.view(-1, 1, 1)  # grid units -> input pixels
    anchor_grid = state.pop(prefix + "anchor_grid", None)  # v5.0 also kept (and decoded with) pixel anchors
    if anchor_grid is not None:
        if anchor_grid.numel() != anchors.numel() or not torch.allclose(
                anchor_grid.float().reshape(anchors.shape), anchors, rtol=4e-3, atol=0.05):
            raise _FormatError(f"{prefix}anchor_grid disagrees with {prefix}anchors x stride")
        anchors = anchor_grid.float().reshape(anchors.shape)  # fp16-rounded in pixels, as v5.0 used them
    state[prefix + "anchors"], state[prefix + "stride"] = anchors, stride
    cfg, ch = release_config(record, detect, anchors), record.attrs.get("yaml", {}).get("ch", 3)
    if not isinstance(ch, int) or not 1 <= ch <= 64:
        raise _FormatError(f"the yaml's input channels {ch!r} must be an integer in 1..64")
    check_config_against_state(cfg, state, ch=ch)  # before building: the yaml makes exactly these tensors
    model = Model(cfg, ch=ch)
    if not torch.equal(model.stride.float(), stride):
        raise _FormatError(f"strides {stride.tolist()} in the file but {model.stride.tolist()} for its yaml")
    check_structure(record, model)
    load_exact(model, state)
    model.names = release_names(record, model.nc)
    return model


def release_config(record: Record, detect: Record, anchors: torch.Tensor) -> dict:
    """The model YAML dict of the file, with the anchors it was trained with (pixels) and its class count."""
    cfg = record.attrs.get("yaml")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("backbone"), list) or not isinstance(cfg.get("head"), list):
        raise _FormatError(f"the {record.global_name} has no model yaml (backbone/head rows)")
    cfg = _plain(cfg)
    cfg["anchors"] = [[int(v) if float(v).is_integer() else float(v) for v in level.flatten().tolist()]
                      for level in anchors]
    if isinstance(detect.attrs.get("nc"), int):
        cfg["nc"] = detect.attrs["nc"]
    cfg["yaml_file"] = str(record.attrs.get("yaml_file") or cfg.get("yaml_file") or "yolov5-release.yaml")
    return cfg


def release_names(record: Record, nc: int) -> list[str]:
    """Class names as the file stores them (a list, or a dict keyed 0..nc-1), as :func:`plain_names` bounds them."""
    return plain_names(record.attrs.get("names"), nc)


def flat_state(record: Record, prefix: str = "", depth: int = 0) -> dict[str, torch.Tensor]:
    """What ``nn.Module.state_dict()`` gives for the pickled module tree: parameters, persistent buffers, children."""
    if depth > 64:
        raise _FormatError(f"module tree nested deeper than 64 levels at {prefix!r}")
    attrs, state = record.attrs, {}
    non_persistent = attrs.get("_non_persistent_buffers_set") or set()
    for group in ("_parameters", "_buffers"):
        for name, tensor in (attrs.get(group) or {}).items():
            if tensor is None or (group == "_buffers" and name in non_persistent):
                continue
            if not isinstance(tensor, torch.Tensor):
                raise _FormatError(f"{prefix}{name} is a {type(tensor).__name__}, not a tensor")
            state[prefix + str(name)] = tensor.detach()
    for name, child in _children(record).items():
        state.update(flat_state(child, f"{prefix}{name}.", depth + 1))
    return state


def check_structure(record: Record, module: nn.Module, where: str = "model") -> None:
    """Same classes, same children and same shape-free settings (strides, padding, pooling, shortcuts) everywhere."""
    ours, tables = type(module).__name__, release_classes("yolov5", settings=_SETTINGS, aliases=_CLASS_ALIASES)
    if ours not in tables["aliases"].get(record.class_name, (record.class_name,)):
        raise _FormatError(f"{where} is a {record.global_name} in the file but a {ours} in the model its yaml builds")
    for setting in tables["settings"].get(ours, ()):
        if setting in record.attrs and _comparable(record.attrs[setting]) != _comparable(getattr(module, setting)):
            raise _FormatError(f"{where}.{setting} is {record.attrs[setting]!r} in the file but "
                               f"{getattr(module, setting)!r} in the model its yaml builds")
    theirs, mine = _children(record), dict(module.named_children())
    if list(theirs) != list(mine):
        raise _FormatError(f"{where} has children {list(theirs)} in the file but {list(mine)} in the model")
    for name, child in theirs.items():
        check_structure(child, mine[name], f"{where}.{name}")


def load_exact(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load ``state`` into ``model`` tensor for tensor (names and shapes must match exactly), as float32."""
    own = model.state_dict()
    check_state_fits({name: tuple(t.shape) for name, t in own.items()}, state)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v.to(own[k].dtype) for k, v in state.items()})
    if hasattr(model, "detect"):
        model.detect.clear_grid_cache()


def _children(record: Record) -> dict[str, Record]:
    children = {}
    for name, child in (record.attrs.get("_modules") or {}).items():
        if child is None:
            continue
        if not isinstance(child, Record):
            raise _FormatError(f"child {name!r} of {record.global_name} is a {type(child).__name__}, not a module")
        children[str(name)] = child
    return children


def _child(record: Record, name: str) -> Record:
    child = _children(record).get(name)
    if child is None or not _children(child):
        raise _FormatError(f"the {record.global_name} has no '{name}' layers")
    return child


def _comparable(value: Any) -> Any:
    """Settings as plain comparable values: ints and floats alike, tuples and lists alike."""
    if isinstance(value, (list, tuple)):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def _plain(obj: Any) -> Any:
    """Records -> their attribute dicts, then everything as plain types that ``weights_only`` loading accepts."""
    if isinstance(obj, Record):
        return _plain({k: v for k, v in obj.attrs.items() if not str(k).startswith("_")})
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.detach().float().cpu().clone() if obj.is_floating_point() else obj.detach().cpu().clone()
    return to_plain(obj)


register_release_reader("yolov5", is_release_file, load_release_checkpoint)
