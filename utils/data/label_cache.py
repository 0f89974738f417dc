"""The label scan: every image and label file checked once, in parallel, the result cached.

Labels live beside the images (``.../images/...`` -> ``.../labels/....txt``), one ``class cx cy w h`` row per
object, normalised to [0, 1]. The scan counts each image as found, missing (no label file), empty or corrupt
and caches the result in ``<labels dir>.cache`` (an ``.npz`` of plain arrays, loaded without unpickling),
rebuilt when any file changes. The user's files are never modified: a repaired copy of a damaged image goes
into the split's cache folder (``<labels dir>.cache.d``).
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import sys
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from tqdm import tqdm

from utils.data.errors import DataError
from utils.data.image_io import ImageHeader, ImageRefused, exif_size, opened_image, read_image, size_refusal
from utils.data.regular_files import FileRefused, open_regular, read_regular
from utils.device import available_cores
from utils.distributed import comm as dist
from utils.log import LOGGER
from utils.paths import IMG_SUFFIXES

CACHE_VERSION = 2  # 2: repaired copies of damaged images live in the cache folder
COORD_TOLERANCE = 1e-3  # a normalised coordinate up to this far outside [0, 1] is clipped, not rejected
MIN_IMAGE_SIDE = 10
PROCESS_POOL_MIN = 128  # scans of fewer images use threads
STATES = ("found", "missing", "empty", "corrupt")  # index = state code stored in the cache
MAX_LABEL_BYTES = 8 << 20  # one image's label file (about 250 000 rows)


def list_image_files(sources: str | Path | Sequence[str | Path]) -> list[str]:
    """Image paths from folders (searched recursively), ``.txt`` lists, or single image files; sorted."""
    files: list[str] = []
    for source in [sources] if isinstance(sources, str | Path) else sources:
        path = Path(source)
        if path.is_dir():
            files += [str(p) for p in path.rglob("*") if p.suffix.lower() in IMG_SUFFIXES and p.is_file()]
        elif path.is_file() and path.suffix == ".txt":
            for line in path.read_text().splitlines():
                entry = Path(line.strip())
                if line.strip():
                    files.append(str(entry if entry.is_absolute() else (path.parent / entry).resolve()))
        elif path.is_file() and path.suffix.lower() in IMG_SUFFIXES:
            files.append(str(path))
        else:
            raise DataError(f"{path}: not a folder, a .txt list or an image file")
    files = sorted(f for f in files if Path(f).suffix.lower() in IMG_SUFFIXES)
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


def copy_name(path: str | Path, suffix: str) -> str:
    """A file name for a cached copy of ``path``: its stem and a hash of its full path (names repeat across
    folders), e.g. ``0001-3f2a9c1b.jpg``."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return f"{Path(path).stem}-{digest}{suffix}"


def repair_jpeg(path: str, repair_dir: Path) -> Path:
    """A re-encoded copy, in ``repair_dir``, of a JPEG whose end marker is missing (the decoder fills the lost
    tail); the user's file is left as it is. Atomic write. Raises ValueError when it cannot be decoded."""
    try:
        img = read_image(path)
    except ImageRefused:
        raise ValueError("truncated JPEG that cannot be decoded") from None
    _, encoded = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 100])
    target = repair_dir / copy_name(path, ".jpg")
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    repair_dir.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(encoded.tobytes())
    os.replace(tmp, target)
    return target


def check_image(path: str, repair_dir: Path | None = None) -> tuple[tuple[int, int], str, str]:
    """(size (w, h), note, path of a repaired copy or '') of a regular file holding a decodable image of a listed
    format (decided from its content, utils.data.image_io); raises ValueError with the reason otherwise. A truncated
    JPEG is repaired into ``repair_dir`` when given."""
    try:
        with open_regular(path) as f:
            with opened_image(f) as img:  # the header only: the size is known before anything is decoded
                fmt, size = (img.format or "").lower(), exif_size(img)
                too_large = size_refusal(os.fstat(f.fileno()).st_size, ImageHeader(img.format or "", img.size))
            if too_large:
                raise ValueError(too_large)
            f.seek(0)
            with opened_image(f) as img:
                img.verify()
            if fmt in ("jpeg", "mpo"):
                f.seek(-2, os.SEEK_END)
                truncated = f.read() != b"\xff\xd9"
    except ValueError:  # ImageRefused, FileRefused: their reason as it is
        raise
    except OSError as e:
        raise ValueError(f"cannot read the file ({e.strerror or type(e).__name__})") from None
    except Exception as e:  # PIL raises many types for bad files
        raise ValueError(f"cannot decode image ({type(e).__name__})") from None
    if min(size) < MIN_IMAGE_SIDE:
        raise ValueError(f"image size {size[0]}x{size[1]} < {MIN_IMAGE_SIDE} pixels")
    if fmt in ("jpeg", "mpo") and truncated:
        if repair_dir is not None:
            with contextlib.suppress(OSError):  # an unwritable cache folder: train on the original as it is
                return size, f"corrupt JPEG repaired into {repair_dir.name}/ (the original is unchanged)", \
                    str(repair_jpeg(path, repair_dir))
        return size, "corrupt JPEG (missing end marker), read as it is", ""
    return size, "", ""


def read_label_rows(path: str | Path) -> tuple[list[list[str]], str]:
    """A label file's non-blank rows split into values, and its state ('found', 'missing' or 'empty'); read only
    when it is a regular file of at most MAX_LABEL_BYTES (ValueError with the reason otherwise)."""
    if not os.path.isfile(path):  # a FIFO or a folder is no label file: missing, never opened
        return [], "missing"
    try:
        text = read_regular(path, MAX_LABEL_BYTES).decode("utf-8", errors="replace")
    except OSError as e:
        raise ValueError(f"cannot read the label file ({e.strerror or type(e).__name__})") from None
    except FileRefused as e:
        raise ValueError(f"label file: {e}") from None
    rows = [line.split() for line in text.splitlines() if line.strip()]
    return rows, "found" if rows else "empty"


def read_label_file(path: str, nc: int | None) -> tuple[np.ndarray, str, int, str]:
    """Parse and check one label file -> (labels (n, 5), state, duplicates removed, note).

    State is 'found', 'missing' or 'empty'; invalid content raises ValueError with the reason.
    """
    rows, state = read_label_rows(path)
    if state != "found":
        return np.zeros((0, 5), np.float32), state, 0, ""
    bad_width = next((len(r) for r in rows if len(r) != 5), None)
    if bad_width is not None:
        raise ValueError(f"labels require 5 columns, {bad_width} columns detected")
    try:
        labels = np.array(rows, dtype=np.float64)
    except ValueError:
        raise ValueError("non-numeric label values") from None
    labels, duplicates, note = check_label_rows(labels, nc)
    return labels, "found", duplicates, note


def check_label_rows(labels: np.ndarray, nc: int | None) -> tuple[np.ndarray, int, str]:
    """The checks every label format meets: (n, 5) float64 ``class cx cy w h`` rows -> (float32 rows clipped to
    [0, 1] without duplicates, duplicates removed, note). Invalid rows raise ValueError with the reason."""
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
    labels = labels.astype(np.float32)  # checked as stored: 1e-320 is a positive float64 but 0 in float32
    labels[:, 1:] = labels[:, 1:].clip(0, 1)
    if (labels[:, 3:5] <= 0).any():
        raise ValueError("box with zero width or height")
    _, first = np.unique(labels, axis=0, return_index=True)
    duplicates = len(labels) - len(first)
    if duplicates:
        labels = labels[np.sort(first)]
    note = f"{duplicates} duplicate labels removed" if duplicates else ""
    return labels, duplicates, note


def unique_objects(labels: np.ndarray, points: Sequence[np.ndarray | None]) -> tuple[np.ndarray, list, int, str]:
    """Objects repeated exactly (the same row and the same points a task's labels add: a segmenter's outline) kept
    once, in their first place: (labels, points, duplicates removed, note)."""
    seen, keep = set(), []
    for i, (row, object_points) in enumerate(zip(labels, points)):
        key = (row.tobytes(), None if object_points is None else np.asarray(object_points).tobytes())
        if key not in seen:
            seen.add(key)
            keep.append(i)
    duplicates = len(labels) - len(keep)
    note = f"{duplicates} duplicate labels removed" if duplicates else ""
    return labels[keep], [points[i] for i in keep], duplicates, note


def check_sample(args: tuple[str, str, int | None, Path | None]) -> tuple[np.ndarray, tuple[int, int], str, int, str,
                                                                        str]:
    """Check an (image, label) pair -> (labels, (w, h), state, duplicates, warning, repaired copy or '');
    a corrupt pair never raises."""
    im_file, label_file, nc, repair_dir = args
    try:
        shape, image_note, repaired = check_image(im_file, repair_dir)
        labels, state, duplicates, label_note = read_label_file(label_file, nc)
    except (ValueError, OverflowError, TypeError) as e:
        return np.zeros((0, 5), np.float32), (0, 0), "corrupt", 0, f"{im_file}: ignoring corrupt image/label: {e}", ""
    notes = "; ".join(n for n in (image_note, label_note) if n)
    return labels, shape, state, duplicates, f"{im_file}: {notes}" if notes else "", repaired


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
    repaired: list[str] = field(default_factory=list)  # per image: a repaired copy to read instead, or ''
    extras: list[list[np.ndarray | None]] | None = None  # per image, per object what a task's labels add (points)

    def read_path(self, index: int) -> str:
        """The file to decode for image ``index``: its repaired copy when the scan made one, else the image."""
        return self.repaired[index] if self.repaired and self.repaired[index] else self.im_files[index]

    def summary(self) -> ScanSummary:
        """The split's counts and warnings."""
        counts = np.bincount(self.states, minlength=len(STATES))
        return ScanSummary(found=int(counts[0] + counts[2]), missing=int(counts[1]), empty=int(counts[2]),
                           corrupt=int(counts[3]), duplicates=int(self.duplicates.sum()), total=len(self.im_files),
                           warnings=[m for m in self.messages if m])


def files_hash(im_files: Sequence[str], label_files: Sequence[str], nc: int | None, kind: str = "") -> str:
    """A hash of the file list, sizes and mtimes (and nc, which decides class validity, and the scan's ``kind``:
    '' for boxes, a task's reader's kind for a scan that keeps what its labels add)."""
    h = hashlib.sha256(f"v{CACHE_VERSION} nc={nc}{f' {kind}' if kind else ''}".encode())
    for path in (*im_files, *label_files):
        try:
            st = os.stat(path)
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{path}\0-\n".encode())
    return h.hexdigest()


def _check_pool(n_items: int, cores: int | None = None) -> Any:
    """A process pool sized to the cores (``cores``, default all of this process's; decoding and parsing hold the
    GIL); threads for small scans, where starting processes costs more than it saves, and where forking is
    unavailable (daemonic loader workers)."""
    workers = max(min(cores or available_cores(), n_items), 1)
    can_fork = "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon
    if workers > 1 and n_items >= PROCESS_POOL_MIN and can_fork:
        return multiprocessing.get_context("fork").Pool(workers)
    return ThreadPool(workers)


def scan_files(im_files: Sequence[str], label_files: Sequence[Any], nc: int | None, desc: str = "",
               show: bool = True, repair_dir: Path | None = None, check: Any = check_sample,
               cores: int | None = None) -> ScanResult:
    """Check every pair on a pool sized to the cores (``cores``, default all), with a progress bar when ``show``;
    damaged images that can be repaired get a repaired copy in ``repair_dir``. ``check`` reads one pair's labels
    (the default: a YOLO txt file; utils.data.annotations passes the boxes an annotation file gave). A ``check``
    that returns a seventh value, per object what a task's labels add to its box (its LabelReader's points, or
    None), makes a scan that keeps them (``ScanResult.extras``)."""
    n = len(im_files)
    states, shapes = np.zeros(n, np.int8), np.zeros((n, 2), np.int32)
    labels, duplicates, messages, repaired, extras = [], np.zeros(n, np.int32), [], [], []
    counts = dict.fromkeys(STATES, 0)
    with _check_pool(n, cores) as pool:
        jobs = [(im, lb, nc, repair_dir) for im, lb in zip(im_files, label_files)]
        bar = tqdm(pool.imap(check, jobs, chunksize=16), total=n, desc=desc, leave=False, unit="img",
                   disable=not show or not sys.stderr.isatty())  # a log file gets the summary line only
        for i, (lab, shape, state, dup, msg, copy, *points) in enumerate(bar):
            states[i], shapes[i], duplicates[i] = STATES.index(state), shape, dup
            extras += points
            labels.append(lab)
            messages.append(msg)
            repaired.append(copy)
            counts[state] += 1
            bar.set_postfix_str(f"{counts['found'] + counts['empty']} found, {counts['missing']} missing, "
                                f"{counts['empty']} empty, {counts['corrupt']} corrupt", refresh=False)
    return ScanResult(list(im_files), states, shapes, labels, duplicates, messages, repaired,
                      extras if len(extras) == n and n else None)


def pack_points(objects: Sequence[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """Per object its points (n_i, width) (None: none) -> (points (P, width) float32, offsets (k + 1,) int64): object
    i's points are ``points[offsets[i]:offsets[i + 1]]`` (none for None); plain arrays an ``.npz`` holds without
    pickles (a segmenter's outlines, a pose model's keypoints). The width is the first object's (2 without any)."""
    width = next((int(np.asarray(s).shape[-1]) for s in objects if s is not None), 2)
    lengths = [0 if s is None else len(s) for s in objects]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    arrays = [np.asarray(s, np.float32).reshape(-1, width) for s in objects if s is not None]
    points = np.concatenate(arrays) if arrays else np.zeros((0, width), np.float32)
    return points, offsets


def unpack_points(points: np.ndarray, offsets: np.ndarray) -> list[np.ndarray | None]:
    """The inverse of ``pack_points``; ValueError when the offsets do not index the points (a damaged cache)."""
    offsets = np.asarray(offsets)
    if offsets.ndim != 1 or not len(offsets) or offsets[0] != 0 or offsets[-1] != len(points) \
            or (np.diff(offsets) < 0).any():
        raise ValueError("point offsets do not index the stored points")
    return [points[a:b] if b > a else None for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def cache_path_for(label_files: Sequence[str], kind: str = "") -> Path:
    """``<labels dir>.cache`` next to the first label file's folder (``<labels dir>.<kind>.cache`` for a scan of
    another kind, so box and outline scans of one folder keep their own caches)."""
    return Path(label_files[0]).parent.with_suffix(f".{kind}.cache" if kind else ".cache")


def cache_dir_for(label_files: Sequence[str]) -> Path:
    """The split's cache folder, ``<labels dir>.cache.d`` beside the label cache: repaired images and the
    ``--cache disk`` arrays go there, never beside the user's images."""
    return Path(label_files[0]).parent.with_suffix(".cache.d")


def save_cache(path: Path, result: ScanResult, file_hash: str) -> bool:
    """Write the scan as an ``.npz`` of plain arrays to a temporary file, then rename; False if not writable."""
    counts = np.array([len(lab) for lab in result.labels], np.int64)
    arrays = {
        "version": np.array(CACHE_VERSION), "hash": np.array(file_hash), "im_files": np.array(result.im_files),
        "states": result.states, "shapes": result.shapes, "counts": counts, "duplicates": result.duplicates,
        "labels": np.concatenate(result.labels, 0) if result.labels else np.zeros((0, 5), np.float32),
        "messages": np.array(result.messages if result.messages else [], dtype=str),
        "repaired": np.array(result.repaired if result.repaired else [], dtype=str),
    }
    if result.extras is not None:  # every object's points, in label order: (P, width) points and offsets
        arrays["extra_points"], arrays["extra_offsets"] = pack_points([s for image in result.extras for s in image])
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


@contextlib.contextmanager
def cache_arrays(path: Path) -> Iterator[Any]:
    """A cache file's arrays (numpy's lazy NpzFile). A cache may come with a data set from a stranger: it must be a
    regular file whose zip members are stored, as numpy writes them (a compressed member could inflate a small file
    to gigabytes), and are loaded without unpickling. ValueError or OSError otherwise."""
    with open_regular(path) as f:
        with zipfile.ZipFile(f) as archive:
            if any(i.compress_type != zipfile.ZIP_STORED for i in archive.infolist()):
                raise ValueError("compressed cache members")
        f.seek(0)
        with np.load(f, allow_pickle=False) as z:
            yield z


def load_cache(path: Path, file_hash: str) -> ScanResult | None:
    """The cached scan when its version and hash match; None when missing, stale or unreadable."""
    try:
        with cache_arrays(path) as z:
            if int(z["version"]) != CACHE_VERSION or str(z["hash"]) != file_hash:
                return None
            counts = z["counts"]
            labels = np.split(z["labels"].astype(np.float32), np.cumsum(counts)[:-1]) if len(counts) else []
            extras = None
            if "extra_points" in z.files:
                flat = unpack_points(z["extra_points"].astype(np.float32), z["extra_offsets"])
                if len(flat) != int(counts.sum()):
                    return None
                ends = np.cumsum(counts).tolist()
                extras = [flat[end - c:end] for c, end in zip(counts.tolist(), ends)]
            return ScanResult([str(f) for f in z["im_files"]], z["states"].astype(np.int8),
                              z["shapes"].astype(np.int32), labels, z["duplicates"].astype(np.int32),
                              [str(m) for m in z["messages"]], [str(r) for r in z["repaired"]], extras)
    except Exception:  # any damage means: rebuild
        return None


def cached_scan(im_files: Sequence[str], label_files: Sequence[str], nc: int | None,
                prefix: str = "", check: Any = check_sample, kind: str = "") -> tuple[ScanResult, Path]:
    """The scan of these files, from ``<labels dir>.cache`` when valid, else scanned (``check`` reads one pair; a
    ``kind`` names a scan other than boxes, so each kind's cache is its own) and cached.

    Logs the ``Scanning '...'... N found, M missing, K empty, C corrupt`` line and the warnings once.
    """
    path, file_hash = cache_path_for(label_files, kind), files_hash(im_files, label_files, nc, kind)
    result = load_cache(path, file_hash)
    if result is not None and kind and result.extras is None:
        result = None
    shown = path
    if result is None:
        shown = path.parent / path.stem
        desc = f"{prefix}Scanning '{shown}' images and labels..."
        result = scan_files(im_files, label_files, nc, desc=desc, show=dist.is_main_process(),
                            repair_dir=cache_dir_for(label_files) / "repaired", check=check)
        if save_cache(path, result, file_hash):
            LOGGER.info(f"{prefix}New cache created: {path}")
    log_scan(result, prefix, shown, path.parent / path.stem)
    return result, path


def log_scan(result: ScanResult, prefix: str, shown: Path, source: Path) -> None:
    """The ``Scanning '...'... N found, M missing, K empty, C corrupt`` line, then each warning once."""
    summary = result.summary()
    LOGGER.info(f"{prefix}Scanning '{shown}' images and labels... {summary.line()}")
    for message in summary.warnings:
        LOGGER.warning(f"{prefix}WARNING: {message}")
    if summary.found and not any(len(lab) for lab in result.labels):
        LOGGER.warning(f"{prefix}WARNING: no labels found in {source}; training needs labels")
