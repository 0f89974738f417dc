"""YOLO-format data: data YAMLs, label checks with a cache, and the training/validation dataset.

A data YAML names image folders or ``.txt`` lists; labels live beside them (``.../images/...`` ->
``.../labels/....txt``), one ``class cx cy w h`` row per object, normalised to [0, 1]. Every image
and label file is checked once; the result is cached in ``<labels dir>.cache`` (an ``.npz`` of
plain arrays, loaded without unpickling) and rebuilt when any file changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import multiprocessing
import os
import shutil
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import yaml
from PIL import Image
from tqdm import tqdm

from utils import dist
from utils.augment import (
    augment_hsv,
    flip_lr,
    flip_ud,
    letterbox,
    mixup,
    mosaic4,
    random_perspective,
    xywhn_to_xyxy,
    xyxy_to_xywhn,
)
from utils.errors import UserError
from utils.logging import LOGGER
from utils.paths import ROOT, data_home

IMG_FORMATS = ("bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp")
CACHE_VERSION = 1
COORD_TOLERANCE = 1e-3  # a normalised coordinate up to this far outside [0, 1] is clipped, not rejected
MIN_IMAGE_SIDE = 10
PROCESS_POOL_MIN = 128  # scans of fewer images use threads
STATES = ("found", "missing", "empty", "corrupt")  # index = state code stored in the cache
DEFAULT_DATA = ROOT / "data" / "synthetic.yaml"
DEFAULT_HYP = ROOT / "data" / "hyps" / "hyp.scratch.yaml"


class DataError(UserError):
    """A data set problem the user can fix: a missing or malformed YAML, split or image list."""


def num_threads() -> int:
    """The cores this process may use (the label scan's pool size)."""
    with contextlib.suppress(AttributeError):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


# ----------------------------------------------------------------------------------------------- data YAML
@dataclass
class DataConfig:
    """A resolved data YAML: absolute split paths, class names and where it came from."""

    root: Path
    train: list[Path]
    val: list[Path]
    test: list[Path] | None
    nc: int
    names: list[str]
    yaml_file: Path
    is_coco: bool = False
    download: Any = None


def _find_yaml(path: str | Path | None) -> Path:
    """The YAML file for ``--data``: as given, else under ``data/`` (so ``--data coco128.yaml`` works)."""
    if path in (None, ""):
        return DEFAULT_DATA
    candidates = [Path(path), ROOT / "data" / Path(path).name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise DataError(f"--data {path}: file not found (give a data YAML path such as data/synthetic.yaml)")


def _read_yaml(path: Path) -> dict:
    try:
        content = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DataError(f"{path}: not a readable YAML file ({type(e).__name__}); fix its syntax") from None
    if not isinstance(content, dict):
        raise DataError(f"{path}: expected a mapping with keys path, train, val, nc, names")
    return content


def _parse_names(data: dict, yaml_file: Path) -> tuple[int, list[str]]:
    names = data.get("names")
    if isinstance(names, dict):
        try:
            names = [str(names[k]) for k in sorted(names, key=int)]
        except (TypeError, ValueError):
            raise DataError(f"{yaml_file}: 'names' keys must be class indices 0..nc-1") from None
    nc = data.get("nc", len(names) if names else None)
    if not isinstance(nc, int) or nc < 1:
        raise DataError(f"{yaml_file}: 'nc' must be a positive class count (got {nc!r})")
    names = [str(n) for n in names] if names else [f"class{i}" for i in range(nc)]
    if len(names) != nc:
        raise DataError(f"{yaml_file}: nc is {nc} but 'names' lists {len(names)} classes; make them agree")
    return nc, names


def _dataset_root(data: dict, yaml_file: Path) -> Path:
    """``synthetic:`` generates the built-in set; relative ``path`` is tried beside the YAML, then in data_home()."""
    if "synthetic" in data:
        params = data["synthetic"] or {}
        if not isinstance(params, dict):
            raise DataError(f"{yaml_file}: 'synthetic' must be a mapping (n_train, n_val, img_size, seed)")
        from utils.synthetic import ensure_synthetic  # local: synthetic imports nothing from here

        try:
            return ensure_synthetic(root=data.get("path"), **params)
        except (TypeError, ValueError) as e:
            raise DataError(f"{yaml_file}: bad 'synthetic' parameters: {e}") from None
    if not data.get("path"):
        return yaml_file.parent
    path = Path(str(data["path"])).expanduser()
    if path.is_absolute():
        return path
    beside = (yaml_file.parent / path).resolve()
    return beside if beside.exists() or not data.get("download") else data_home() / path


def _split_paths(value: Any, root: Path) -> list[Path]:
    values = value if isinstance(value, list | tuple) else [value]
    return [p if (p := Path(str(v)).expanduser()).is_absolute() else root / p for v in values]


def load_data_config(path: str | Path | None = None) -> DataConfig:
    """Read and resolve a data YAML (default: the built-in synthetic set, generated on first use).

    Missing splits are downloaded when the YAML has a ``download`` key (zero-first), otherwise a
    DataError names the resolved path. All ranks must call it (it may run zero-first sections).
    """
    yaml_file = _find_yaml(path)
    data = _read_yaml(yaml_file)
    nc, names = _parse_names(data, yaml_file)
    for key in ("train", "val"):
        if not data.get(key):
            raise DataError(f"{yaml_file}: missing '{key}' (a folder of images, a .txt list, or a list of them)")
    root = _dataset_root(data, yaml_file)
    splits = {k: _split_paths(data[k], root) for k in ("train", "val", "test") if data.get(k)}
    missing = [p for paths in splits.values() for p in paths if not p.exists()]
    if missing and data.get("download"):
        with dist.zero_first(local=True):
            if dist.is_local_main_process() and not all(p.exists() for p in missing):
                download_dataset(data["download"], root)
        missing = [p for p in missing if not p.exists()]
    if missing:
        raise DataError(f"{yaml_file}: split path {missing[0]} does not exist; check 'path' and the split entries")
    return DataConfig(root=root, train=splits["train"], val=splits["val"], test=splits.get("test"), nc=nc,
                      names=names, yaml_file=yaml_file, is_coco=yaml_file.name == "coco.yaml" and nc == 80,
                      download=data.get("download"))


def load_hyp(path: str | Path | None = None) -> dict[str, float]:
    """Hyperparameters from a hyp YAML (default ``data/hyps/hyp.scratch.yaml``)."""
    hyp_file = Path(path) if path else DEFAULT_HYP
    if not hyp_file.is_file() and (ROOT / "data" / "hyps" / hyp_file.name).is_file():
        hyp_file = ROOT / "data" / "hyps" / hyp_file.name
    if not hyp_file.is_file():
        raise DataError(f"--hyp {path}: file not found (e.g. data/hyps/hyp.scratch.yaml)")
    hyp = _read_yaml(hyp_file)
    bad = [k for k, v in hyp.items() if not isinstance(v, int | float)]
    if bad:
        raise DataError(f"{hyp_file}: hyperparameter {bad[0]!r} must be a number")
    return {k: float(v) for k, v in hyp.items()}


# ------------------------------------------------------------------------------------------------ download
def safe_extract(zip_path: str | Path, dest: str | Path) -> list[Path]:
    """Extract a zip into ``dest``, refusing any member that would land outside it (``../``, absolute paths)."""
    dest = Path(dest).resolve()
    with zipfile.ZipFile(zip_path) as archive:
        for member in archive.namelist():
            target = (dest / member).resolve()
            if target != dest and dest not in target.parents:
                raise DataError(f"{zip_path}: member {member!r} would be written outside {dest}; refusing to extract")
        archive.extractall(dest)
        return [dest / m for m in archive.namelist()]


def download_dataset(spec: Any, root: Path) -> None:
    """Fetch and unzip what a YAML's ``download`` key names: a URL, a list of URLs, or {url, dir} mappings.

    A bare URL's zip is extracted into the dataset folder's parent (the zip holds the folder itself).
    """
    entries = spec if isinstance(spec, list) else [spec]
    for entry in entries:
        url, to = (entry.get("url"), entry.get("dir")) if isinstance(entry, dict) else (str(entry), None)
        dest = (root / to) if to else root.parent
        dest.mkdir(parents=True, exist_ok=True)
        zip_path = dest / Path(str(url).split("?")[0]).name
        LOGGER.info(f"Downloading {url} to {zip_path} ...")
        tmp = zip_path.with_name(zip_path.name + ".part")
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
                shutil.copyfileobj(response, out)
        except OSError as e:
            raise DataError(f"download of {url} failed ({e}); fetch it by hand into {dest}") from None
        os.replace(tmp, zip_path)
        if zip_path.suffix == ".zip":
            safe_extract(zip_path, dest)
            zip_path.unlink()


# -------------------------------------------------------------------------------------- image/label lists
def list_image_files(sources: str | Path | Sequence[str | Path]) -> list[str]:
    """Image paths from folders (searched recursively), ``.txt`` lists, or single image files; sorted."""
    files: list[str] = []
    for source in [sources] if isinstance(sources, str | Path) else sources:
        path = Path(source)
        if path.is_dir():
            files += [str(p) for p in path.rglob("*") if p.suffix[1:].lower() in IMG_FORMATS and p.is_file()]
        elif path.is_file() and path.suffix == ".txt":
            for line in path.read_text().splitlines():
                entry = Path(line.strip())
                if line.strip():
                    files.append(str(entry if entry.is_absolute() else (path.parent / entry).resolve()))
        elif path.is_file() and path.suffix[1:].lower() in IMG_FORMATS:
            files.append(str(path))
        else:
            raise DataError(f"{path}: not a folder, a .txt list or an image file")
    files = sorted(f for f in files if Path(f).suffix[1:].lower() in IMG_FORMATS)
    if not files:
        raise DataError(f"no images found in {sources}")
    return files


def img2label_paths(im_files: Sequence[str]) -> list[str]:
    """``.../images/x/a.jpg`` -> ``.../labels/x/a.txt`` (the last ``/images/`` is replaced)."""
    images, labels = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    out = []
    for f in im_files:
        head, sep, tail = f.rpartition(images)
        out.append(str(Path(head + labels + tail if sep else f).with_suffix(".txt")))
    return out


# ------------------------------------------------------------------------------------------- label checks
def exif_size(img: Image.Image) -> tuple[int, int]:
    """(w, h) after the EXIF orientation is applied (rotations by 90 degrees swap the sides)."""
    with contextlib.suppress(Exception):
        if img.getexif().get(0x0112) in (5, 6, 7, 8):
            return img.size[1], img.size[0]
    return img.size


def _repair_jpeg(path: str) -> None:
    """Re-encode a JPEG whose end marker is missing (decoders fill the lost tail); atomic rewrite."""
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError("truncated JPEG that cannot be decoded")
    ok, encoded = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 100])
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(encoded.tobytes())
    os.replace(tmp, path)


def check_image(path: str) -> tuple[tuple[int, int], str]:
    """Size (w, h) of a decodable image of a known format, and a note; raises ValueError with the reason."""
    try:
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            fmt, size = (img.format or "").lower(), exif_size(img)
    except Exception as e:  # PIL raises many types for bad files
        raise ValueError(f"cannot decode image ({type(e).__name__})") from None
    if fmt not in IMG_FORMATS:
        raise ValueError(f"unsupported image format {fmt!r}")
    if min(size) < MIN_IMAGE_SIDE:
        raise ValueError(f"image size {size[0]}x{size[1]} < {MIN_IMAGE_SIDE} pixels")
    note = ""
    if fmt in ("jpeg", "mpo"):
        with open(path, "rb") as f:
            f.seek(-2, os.SEEK_END)
            if f.read() != b"\xff\xd9":
                _repair_jpeg(path)
                note = "corrupt JPEG restored and saved"
    return size, note


def read_label_file(path: str, nc: int | None) -> tuple[np.ndarray, str, int, str]:
    """Parse and check one label file -> (labels (n, 5), state, duplicates removed, note).

    State is 'found', 'missing' or 'empty'; invalid content raises ValueError with the reason.
    """
    if not os.path.isfile(path):
        return np.zeros((0, 5), np.float32), "missing", 0, ""
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = [line.split() for line in f.read().splitlines() if line.strip()]
    if not rows:
        return np.zeros((0, 5), np.float32), "empty", 0, ""
    bad_width = next((len(r) for r in rows if len(r) != 5), None)
    if bad_width is not None:
        raise ValueError(f"labels require 5 columns, {bad_width} columns detected")
    try:
        labels = np.array(rows, dtype=np.float64)
    except ValueError:
        raise ValueError("non-numeric label values") from None
    if not np.isfinite(labels).all():
        raise ValueError("non-finite label values")
    classes = labels[:, 0]
    if (classes < 0).any():
        raise ValueError(f"negative class label {classes.min():g}")
    if (classes != np.round(classes)).any():
        raise ValueError("non-integer class label")
    if nc is not None and (classes >= nc).any():
        raise ValueError(f"class label {int(classes.max())} >= nc {nc}")
    coords = labels[:, 1:]
    if (coords < -COORD_TOLERANCE).any() or (coords > 1 + COORD_TOLERANCE).any():
        raise ValueError(f"non-normalized or out of bounds coordinates {coords[(coords < 0) | (coords > 1)][0]:g}")
    labels[:, 1:] = coords.clip(0, 1)
    if (labels[:, 3:5] <= 0).any():
        raise ValueError("box with zero width or height")
    _, first = np.unique(labels, axis=0, return_index=True)
    duplicates = len(labels) - len(first)
    if duplicates:
        labels = labels[np.sort(first)]
    note = f"{duplicates} duplicate labels removed" if duplicates else ""
    return labels.astype(np.float32), "found", duplicates, note


def check_sample(args: tuple[str, str, int | None]) -> tuple[np.ndarray, tuple[int, int], str, int, str]:
    """Check an (image, label) pair -> (labels, (w, h), state, duplicates, warning); corrupt never raises."""
    im_file, label_file, nc = args
    try:
        shape, image_note = check_image(im_file)
        labels, state, duplicates, label_note = read_label_file(label_file, nc)
    except ValueError as e:
        return np.zeros((0, 5), np.float32), (0, 0), "corrupt", 0, f"{im_file}: ignoring corrupt image/label: {e}"
    notes = "; ".join(n for n in (image_note, label_note) if n)
    return labels, shape, state, duplicates, f"{im_file}: {notes}" if notes else ""


# ----------------------------------------------------------------------------------------------- the scan
@dataclass
class ScanSummary:
    """Counts of one split's scan. Each image is exactly one of found / missing / corrupt; empty is part of found."""

    found: int = 0
    missing: int = 0
    empty: int = 0
    corrupt: int = 0
    duplicates: int = 0
    total: int = 0
    warnings: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def line(self) -> str:
        """The counts as users know them: 'N found, M missing, K empty, C corrupt'."""
        text = f"{self.found} found, {self.missing} missing, {self.empty} empty, {self.corrupt} corrupt"
        return text + (f", {self.duplicates} duplicate rows removed" if self.duplicates else "")


@dataclass
class ScanResult:
    """Per-image results of a scan, in ``im_files`` order (what the cache stores)."""

    im_files: list[str]
    states: np.ndarray  # (n,) int8 index into STATES
    shapes: np.ndarray  # (n, 2) int32 (w, h)
    labels: list[np.ndarray]
    duplicates: np.ndarray  # (n,) int32
    messages: list[str]

    def summary(self) -> ScanSummary:
        """The split's counts and warnings."""
        counts = np.bincount(self.states, minlength=len(STATES))
        return ScanSummary(found=int(counts[0] + counts[2]), missing=int(counts[1]), empty=int(counts[2]),
                           corrupt=int(counts[3]), duplicates=int(self.duplicates.sum()), total=len(self.im_files),
                           warnings=[m for m in self.messages if m])


def files_hash(im_files: Sequence[str], label_files: Sequence[str], nc: int | None) -> str:
    """A hash of the file list, sizes and mtimes (and nc, which decides class validity)."""
    h = hashlib.sha256(f"v{CACHE_VERSION} nc={nc}".encode())
    for path in (*im_files, *label_files):
        try:
            st = os.stat(path)
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{path}\0-\n".encode())
    return h.hexdigest()


def _check_pool(n_items: int) -> Any:
    """A process pool sized to the cores (decoding and parsing hold the GIL); threads for small scans, where
    starting processes costs more than it saves, and where forking is unavailable (daemonic loader workers)."""
    workers = max(min(num_threads(), n_items), 1)
    can_fork = "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon
    if workers > 1 and n_items >= PROCESS_POOL_MIN and can_fork:
        return multiprocessing.get_context("fork").Pool(workers)
    return ThreadPool(workers)


def scan_files(im_files: Sequence[str], label_files: Sequence[str], nc: int | None, desc: str = "",
               show: bool = True) -> ScanResult:
    """Check every pair on a pool sized to the cores, with a progress bar when ``show``."""
    n = len(im_files)
    states, shapes = np.zeros(n, np.int8), np.zeros((n, 2), np.int32)
    labels, duplicates, messages = [], np.zeros(n, np.int32), []
    counts = dict.fromkeys(STATES, 0)
    with _check_pool(n) as pool:
        results = pool.imap(check_sample, [(im, lb, nc) for im, lb in zip(im_files, label_files)], chunksize=16)
        bar = tqdm(results, total=n, desc=desc, disable=not show, leave=False, unit="img")
        for i, (lab, shape, state, dup, msg) in enumerate(bar):
            states[i], shapes[i], duplicates[i] = STATES.index(state), shape, dup
            labels.append(lab)
            messages.append(msg)
            counts[state] += 1
            bar.set_postfix_str(f"{counts['found'] + counts['empty']} found, {counts['missing']} missing, "
                                f"{counts['empty']} empty, {counts['corrupt']} corrupt", refresh=False)
    return ScanResult(list(im_files), states, shapes, labels, duplicates, messages)


def cache_path_for(label_files: Sequence[str]) -> Path:
    """``<labels dir>.cache`` next to the first label file's folder."""
    return Path(label_files[0]).parent.with_suffix(".cache")


def save_cache(path: Path, result: ScanResult, file_hash: str) -> bool:
    """Write the scan as an ``.npz`` of plain arrays to a temporary file, then rename; False if not writable."""
    counts = np.array([len(lab) for lab in result.labels], np.int64)
    arrays = {
        "version": np.array(CACHE_VERSION), "hash": np.array(file_hash), "im_files": np.array(result.im_files),
        "states": result.states, "shapes": result.shapes, "counts": counts, "duplicates": result.duplicates,
        "labels": np.concatenate(result.labels, 0) if result.labels else np.zeros((0, 5), np.float32),
        "messages": np.array(result.messages if result.messages else [], dtype=str),
    }
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return True
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        LOGGER.warning(f"WARNING: cache directory {path.parent} is not writeable ({e}); labels will be rescanned")
        return False


def load_cache(path: Path, file_hash: str) -> ScanResult | None:
    """The cached scan when its version and hash match; None when missing, stale or unreadable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != CACHE_VERSION or str(z["hash"]) != file_hash:
                return None
            counts = z["counts"]
            labels = np.split(z["labels"].astype(np.float32), np.cumsum(counts)[:-1]) if len(counts) else []
            return ScanResult([str(f) for f in z["im_files"]], z["states"].astype(np.int8),
                              z["shapes"].astype(np.int32), labels, z["duplicates"].astype(np.int32),
                              [str(m) for m in z["messages"]])
    except Exception:  # any damage means: rebuild
        return None


def cached_scan(im_files: Sequence[str], label_files: Sequence[str], nc: int | None,
                prefix: str = "") -> tuple[ScanResult, Path]:
    """The scan of these files, from ``<labels dir>.cache`` when valid, else scanned and cached.

    Logs the ``Scanning '...'... N found, M missing, K empty, C corrupt`` line and the warnings once.
    """
    path = cache_path_for(label_files)
    result = load_cache(path, files_hash(im_files, label_files, nc))
    shown = path
    if result is None:
        shown = path.parent / path.stem
        desc = f"{prefix}Scanning '{shown}' images and labels..."
        result = scan_files(im_files, label_files, nc, desc=desc, show=dist.is_main_process())
        if save_cache(path, result, files_hash(im_files, label_files, nc)):  # re-hashed: repairs change files
            LOGGER.info(f"{prefix}New cache created: {path}")
    summary = result.summary()
    LOGGER.info(f"{prefix}Scanning '{shown}' images and labels... {summary.line()}")
    for message in summary.warnings:
        LOGGER.warning(f"{prefix}WARNING: {message}")
    if summary.found and not any(len(lab) for lab in result.labels):
        LOGGER.warning(f"{prefix}WARNING: no labels found in {path.parent / path.stem}; training needs labels")
    return result, path


# ------------------------------------------------------------------------------------------------ dataset
def rect_batch_shapes(shapes_wh: np.ndarray, batch_size: int, img_size: int, stride: int,
                      pad: float) -> tuple[np.ndarray, np.ndarray]:
    """For images sorted by aspect ratio: each image's batch index and each batch's (h, w) letterbox shape."""
    batch_index = np.arange(len(shapes_wh)) // batch_size
    aspect = shapes_wh[:, 1] / shapes_wh[:, 0]  # h / w
    shapes = np.ones((int(batch_index[-1]) + 1, 2))
    for b in range(len(shapes)):
        ar = aspect[batch_index == b]
        low, high = ar.min(), ar.max()
        if high < 1:
            shapes[b] = [high, 1]
        elif low > 1:
            shapes[b] = [1, 1 / low]
    return batch_index, (np.ceil(shapes * img_size / stride + pad) * stride).astype(int)


class YoloDataset(torch.utils.data.Dataset):
    """Images and YOLO labels, letterboxed (or mosaicked and augmented) to ``img_size``.

    ``dataset[i]`` -> (uint8 (3, h, w) RGB, float32 (k, 6) [0, cls, cx, cy, w, h] normalised to the
    returned image, path, ((h0, w0), ((ratio_h, ratio_w), (pad_w, pad_h))) or None after mosaic).
    """

    def __init__(self, sources: str | Path | Sequence[str | Path], img_size: int = 640, batch_size: int = 16,
                 augment: bool = False, hyp: dict | None = None, rect: bool = False, stride: int = 32,
                 pad: float = 0.0, cache: str | bool | None = None, single_cls: bool = False, prefix: str = "",
                 nc: int | None = None, seed: int = 0, names: Sequence[str] | None = None) -> None:
        self.img_size, self.augment, self.rect, self.stride = img_size, augment, rect, stride
        self.hyp = dict(load_hyp() if hyp is None and augment else hyp or {})
        self.mosaic = augment and not rect and self.hyp.get("mosaic", 0) > 0
        self.names = list(names) if names is not None else None
        self.seed = seed
        self.rng = np.random.default_rng([seed, dist.get_rank()])
        im_files = list_image_files(sources)
        result, self.cache_path = cached_scan(im_files, img2label_paths(im_files), nc, prefix)
        self.scan = result.summary()
        keep = np.flatnonzero(result.states != STATES.index("corrupt"))
        if not len(keep):
            raise DataError(f"{prefix}no usable images in {sources}: all {len(im_files)} are corrupt (see warnings)")
        self.im_files = [result.im_files[i] for i in keep]
        self.labels = [result.labels[i].copy() for i in keep]
        self.shapes = result.shapes[keep].astype(np.float64)  # (n, 2) w, h
        if single_cls:
            for lab in self.labels:
                lab[:, 0] = 0
        self.batch_index, self.batch_shapes = None, None
        if rect:
            self._sort_for_rect(batch_size, pad)
        self.label_files = img2label_paths(self.im_files)
        self.ims: list[np.ndarray | None] = [None] * len(self.im_files)
        if cache:
            self.cache_images("disk" if cache == "disk" else "ram", prefix)

    def _sort_for_rect(self, batch_size: int, pad: float) -> None:
        order = np.argsort(self.shapes[:, 1] / self.shapes[:, 0], kind="stable")
        self.im_files = [self.im_files[i] for i in order]
        self.labels = [self.labels[i] for i in order]
        self.shapes = self.shapes[order]
        self.batch_index, self.batch_shapes = rect_batch_shapes(self.shapes, batch_size, self.img_size,
                                                                self.stride, pad)

    def __len__(self) -> int:
        return len(self.im_files)

    def cache_images(self, kind: str, prefix: str = "") -> None:
        """``ram``: keep resized images in memory, each rank only its shard (i % world == rank), so a
        machine holds one copy in all; ``disk``: save decoded originals as ``.npy`` beside the images."""
        rank, world = dist.get_rank(), dist.get_world_size()
        indices = list(range(len(self))) if kind == "disk" else list(range(rank, len(self), world))
        work = self._save_npy if kind == "disk" else self._cache_one
        with ThreadPool(num_threads()) as pool:
            total = sum(pool.imap(work, indices))
        where = "disk" if kind == "disk" else f"RAM (rank {rank}: {len(indices)}/{len(self)} images)"
        LOGGER.info(f"{prefix}Cached images to {where}: {total / 1e9:.2f} GB")

    def _cache_one(self, i: int) -> int:
        self.ims[i] = self.load_image(i)[0]
        return self.ims[i].nbytes

    def _save_npy(self, i: int) -> int:
        npy = Path(self.im_files[i]).with_suffix(".npy")
        if not npy.exists() or npy.stat().st_mtime_ns < os.stat(self.im_files[i]).st_mtime_ns:
            img = self._read(i)
            tmp = npy.with_name(f"{npy.stem}.tmp{os.getpid()}.npy")
            np.save(tmp, img)
            os.replace(tmp, npy)
        return npy.stat().st_size

    def _read(self, i: int) -> np.ndarray:
        """The original decoded image (BGR, EXIF orientation applied), from .npy when cached on disk."""
        npy = Path(self.im_files[i]).with_suffix(".npy")
        with contextlib.suppress(OSError, ValueError):  # missing, damaged or older than the image: decode it
            if npy.stat().st_mtime_ns >= os.stat(self.im_files[i]).st_mtime_ns:
                return np.load(npy, allow_pickle=False)
        img = cv2.imread(self.im_files[i], cv2.IMREAD_COLOR)
        if img is None:
            raise DataError(f"{self.im_files[i]}: image could not be read (was it changed after the scan?)")
        return img

    def load_image(self, i: int) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
        """Image i resized so its long side is ``img_size`` -> (img, (h0, w0), (h, w))."""
        w0, h0 = (int(v) for v in self.shapes[i])
        if self.ims[i] is not None:
            img = self.ims[i]
            return img, (h0, w0), img.shape[:2]
        img = self._read(i)
        h0, w0 = img.shape[:2]
        ratio = self.img_size / max(h0, w0)
        if ratio != 1:
            interp = cv2.INTER_LINEAR if (self.augment or ratio > 1) else cv2.INTER_AREA
            size = (min(math.ceil(w0 * ratio), self.img_size), min(math.ceil(h0 * ratio), self.img_size))
            img = cv2.resize(img, size, interpolation=interp)
        return img, (h0, w0), img.shape[:2]

    def load_mosaic(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Mosaic of image ``index`` and 3 random others, warped and cropped back to img_size."""
        indices = [index, *self.rng.integers(0, len(self), 3).tolist()]
        images = [self.load_image(i)[0] for i in indices]
        img, labels = mosaic4(images, [self.labels[i] for i in indices], self.img_size, self.rng)
        border = (-self.img_size // 2, -self.img_size // 2)
        return random_perspective(img, labels, self.rng, border=border, **self._warp_hyp())

    def _warp_hyp(self) -> dict[str, float]:
        return {k: self.hyp.get(k, 0.0) for k in ("degrees", "translate", "scale", "shear", "perspective")}

    def _letterboxed(self, index: int) -> tuple[np.ndarray, np.ndarray, tuple]:
        img, (h0, w0), (h, w) = self.load_image(index)
        shape = self.batch_shapes[self.batch_index[index]] if self.rect else self.img_size
        img, ratio, pad = letterbox(img, tuple(shape) if self.rect else shape, auto=False, scaleup=self.augment)
        labels = xywhn_to_xyxy(self.labels[index], ratio[0] * w, ratio[1] * h, pad[0], pad[1])
        if self.augment:
            img, labels = random_perspective(img, labels, self.rng, **self._warp_hyp())
        return img, labels, ((h0, w0), ((h * ratio[1] / h0, w * ratio[0] / w0), pad))  # load resize x letterbox

    def __getitem__(self, index: int | tuple[int, tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor, str,
                                                                           tuple | None]:
        """Sample ``index``; ``(index, key)`` (from the training sampler) first seeds the augmentation from key."""
        if isinstance(index, tuple):
            index, key = index
            self.seed_sample(key)
        hyp, rng = self.hyp, self.rng
        if self.mosaic and rng.random() < hyp.get("mosaic", 0):
            img, labels = self.load_mosaic(index)
            shapes = None
            if rng.random() < hyp.get("mixup", 0):
                img, labels = mixup(img, labels, *self.load_mosaic(int(rng.integers(0, len(self)))), rng)
        else:
            img, labels, shapes = self._letterboxed(index)
        labels = xyxy_to_xywhn(labels, img.shape[1], img.shape[0])
        if self.augment:
            augment_hsv(img, rng, hyp.get("hsv_h", 0), hyp.get("hsv_s", 0), hyp.get("hsv_v", 0))
            if rng.random() < hyp.get("flipud", 0):
                img, labels = flip_ud(img, labels)
            if rng.random() < hyp.get("fliplr", 0):
                img, labels = flip_lr(img, labels)
        targets = torch.zeros((len(labels), 6))
        targets[:, 1:] = torch.from_numpy(labels)
        chw = np.ascontiguousarray(img[:, :, ::-1].transpose(2, 0, 1))  # BGR HWC -> RGB CHW
        return torch.from_numpy(chw), targets, self.im_files[index], shapes

    def seed_sample(self, key: Sequence[int]) -> None:
        """Seed the augmentation of the next sample from (seed, epoch, position in the epoch)."""
        self.rng = np.random.default_rng([self.seed, *key])

    def reseed(self, seed: int) -> None:
        """A fresh augmentation stream (called per worker with a seed unique to rank and worker)."""
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def collate_fn(batch: Sequence[tuple]) -> tuple[torch.Tensor, torch.Tensor, tuple, tuple]:
        """Stack images (padding to the largest h, w when they differ) and index targets by image."""
        imgs, targets, paths, shapes = zip(*batch)
        height, width = max(i.shape[1] for i in imgs), max(i.shape[2] for i in imgs)
        out = torch.full((len(imgs), 3, height, width), 114, dtype=torch.uint8)
        for i, (img, t) in enumerate(zip(imgs, targets)):
            out[i, :, :img.shape[1], :img.shape[2]] = img
            t[:, 0] = i
            t[:, [2, 4]] *= img.shape[2] / width  # padding on the right/bottom keeps pixel positions
            t[:, [3, 5]] *= img.shape[1] / height
        return out, torch.cat(targets, 0), paths, shapes
