"""Splits given as annotation files (a COCO JSON file, a folder of Pascal VOC XML files): their boxes go through
the same checks, counts and cache as YOLO txt labels (utils.data.label_cache).

A format's parser turns its file(s) into one ``ImageEntry`` per image: boxes as corners in the image's pixels and
class indices. ``scan_annotations`` checks every image and its boxes on the scan pool and caches the result in
``<annotations>.<list>.cache`` beside the annotations, rebuilt when the annotation files or the images change.
"""

from __future__ import annotations

import hashlib
import math
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from utils.data.errors import DataError
from utils.data.label_cache import (
    ScanResult,
    cache_arrays,
    check_image,
    check_label_rows,
    check_sample,
    files_hash,
    load_cache,
    log_scan,
    save_cache,
    scan_files,
    unique_objects,
)
from utils.distributed import comm as dist
from utils.errors import UserError
from utils.log import LOGGER
from utils.paths import confined

ANNOTATION_CACHE_VERSION = 1


@dataclass(frozen=True)
class AnnotationSplit:
    """A split read from annotation files: the ``format`` ('coco' or 'voc'), the annotation file (COCO) or folder
    (VOC), the image folder, an optional image-id list (VOC ``ImageSets/Main/*.txt``), the data set's class names,
    and whether crowd boxes and VOC ``difficult`` objects are kept as ordinary targets (default: excluded)."""

    format: str
    annotations: Path
    images: Path
    image_list: Path | None = None
    names: tuple[str, ...] = ()
    keep_crowd: bool = False

    def __str__(self) -> str:
        listed = f" (list {self.image_list})" if self.image_list else ""
        return f"{self.format} annotations {self.annotations}{listed}"

    def exists(self) -> bool:
        """Whether the annotations, the image folder and the list (when given) are all there."""
        paths = (self.annotations, self.images, *((self.image_list,) if self.image_list else ()))
        return all(p.exists() for p in paths)

    def cache_path(self) -> Path:
        """``instances_val.all.cache`` beside a COCO file; ``Annotations.val.cache`` beside a VOC folder."""
        tag = self.image_list.stem if self.image_list else "all"
        return self.annotations.with_name(f"{self.annotations.stem}.{tag}.cache")

    def cache_dir(self) -> Path:
        """The split's cache folder (repaired images, ``--cache disk`` arrays), beside the cache file."""
        return self.cache_path().with_suffix(".cache.d")


IGNORE_COLUMNS = 6  # an ignore region: class, x1, y1, x2, y2 in the image's pixels, crowd (1) or difficult (0)


def no_regions() -> np.ndarray:
    """An empty (0, 6) array of ignore regions."""
    return np.zeros((0, IGNORE_COLUMNS))


@dataclass
class ImageEntry:
    """One image of an annotation file: its boxes (k, 4) x1 y1 x2 y2 in its pixels, their class indices, the size
    the file declares (w, h) if any, and why the entry is unusable ('' when it is fine). ``ignore`` holds the
    crowd boxes / difficult objects left out of training, (r, 6) [cls, x1, y1, x2, y2, crowd], for evaluation."""

    path: str
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    classes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    size: tuple[int, int] | None = None
    problem: str = ""
    no_labels: str = "empty"  # the state of an image without boxes: 'empty', or 'missing' (no annotation file)
    ignore: np.ndarray = field(default_factory=no_regions)
    extras: list[np.ndarray | None] | None = None  # per box what a task's parser adds (points in the image's pixels)


def corner_rows(boxes: np.ndarray, classes: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(k, 4) pixel corners and (k,) classes -> (k, 5) float64 ``class cx cy w h`` normalised to ``size`` (w, h)."""
    w, h = size
    x1, y1, x2, y2 = (boxes[:, i].astype(np.float64) for i in range(4))
    return np.stack([classes.astype(np.float64), (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w,
                     (y2 - y1) / h], 1)


def check_entry(args: tuple[str, ImageEntry, int | None, Path | None]) -> tuple[np.ndarray, tuple[int, int], str,
                                                                               int, str, str]:
    """label_cache.check_sample for an annotation entry: the image checked, its boxes normalised and checked as
    YOLO rows are; a corrupt entry never raises."""
    return checked_entry(args)[:6]


PointsNormaliser = Callable[[np.ndarray, tuple[int, int]], np.ndarray]


def checked_entry(args: tuple[str, ImageEntry, int | None, Path | None],
                  normalise: PointsNormaliser | None = None) -> tuple:
    """``check_entry``'s six values and, seventh, per object what a task's parser added (``entry.extras``, each
    made relative to the image's size (w, h) by ``normalise``; None: a box without any); with ``normalise``,
    objects repeated exactly, their extras included, are kept once. A corrupt entry never raises."""
    im_file, entry, nc, repair_dir = args
    kept: list = []
    try:
        if entry.problem:
            raise ValueError(entry.problem)
        shape, note, repaired = check_image(im_file, repair_dir)
        if entry.size is not None and tuple(entry.size) != tuple(shape):
            raise ValueError(f"the annotations say {entry.size[0]}x{entry.size[1]} pixels, the image is "
                             f"{shape[0]}x{shape[1]}")
        labels, state, duplicates = np.zeros((0, 5), np.float32), entry.no_labels, 0
        if len(entry.boxes):
            rows = corner_rows(entry.boxes, entry.classes, shape)
            labels, duplicates, label_note = check_label_rows(rows, nc)
            if normalise is not None:  # the same checks; duplicates are objects repeated with their extras
                points = [None if o is None else normalise(o, shape) for o in (entry.extras or [None] * len(rows))]
                clipped = rows.astype(np.float32)
                clipped[:, 1:] = clipped[:, 1:].clip(0, 1)
                labels, kept, duplicates, label_note = unique_objects(clipped, points)
            state, note = "found", "; ".join(n for n in (note, label_note) if n)
    except (ValueError, OverflowError, TypeError) as e:
        return (np.zeros((0, 5), np.float32), (0, 0), "corrupt", 0, f"{im_file}: ignoring corrupt image/label: {e}", "",
                [])
    return labels, shape, state, duplicates, f"{im_file}: {note}" if note else "", repaired, kept


def annotation_hash(split: AnnotationSplit, im_files: Sequence[str], annotation_files: Sequence[str],
                    nc: int | None, kind: str = "") -> str:
    """What decides the cache's validity: the files (paths, sizes, mtimes), nc, names, the crowd rule and the
    scan's kind (a task's reader's, which keeps what its labels add)."""
    head = f"a{ANNOTATION_CACHE_VERSION} {split.format} {split.keep_crowd} {split.names}"
    return hashlib.sha256((head + files_hash(im_files, annotation_files, nc, kind)).encode()).hexdigest()


def _cached_files(path: Path) -> list[str]:
    """The image list a cache holds (to compute its expected hash); [] when there is no readable cache."""
    try:
        with cache_arrays(path) as z:
            return [str(f) for f in z["im_files"]]
    except Exception:  # missing or damaged: rebuild
        return []


@dataclass(frozen=True)
class AnnotationFormat:
    """A registered format: ``parse`` (split -> entries and a note to log) and ``files`` (split -> the annotation
    files whose sizes and mtimes decide the cache's validity, listed without parsing them)."""

    parse: Callable[[AnnotationSplit], tuple[list[ImageEntry], str]]
    files: Callable[[AnnotationSplit], list[str]]


Parser = Callable[[AnnotationSplit], tuple[list[ImageEntry], str]]


@dataclass(frozen=True)
class LabelReader:
    """How a task's labels are read beside the boxes (the base task's, BOXES, reads the boxes alone): ``kind`` names
    its scans' caches (each kind keeps its own); ``check`` reads one YOLO txt pair (label_cache.check_sample's six
    values and, seventh, per object its points or None), ``check_entry`` one annotation entry the same way, and
    ``parsers`` by annotation format the parse that fills ``ImageEntry.extras``; ``width`` is the coordinates per
    point. ``what``, ``who`` and ``sources`` word the refusals: "voc annotations hold no {what}; {who} needs them
    ({sources})"."""

    kind: str = ""
    check: Callable[[tuple], tuple] = check_sample
    check_entry: Callable[[tuple], tuple] = check_entry
    parsers: Mapping[str, Parser] = field(default_factory=dict)
    width: int = 2
    what: str = "boxes"
    who: str = "a detector"
    sources: str = "YOLO labels, COCO JSON or VOC XML"


BOXES = LabelReader()


def scan_annotations(split: AnnotationSplit, fmt: AnnotationFormat, nc: int | None, prefix: str = "",
                     reader: LabelReader = BOXES) -> ScanResult:
    """The checked scan of an annotation split, from its cache when valid, else parsed and cached. Logs the same
    counts line and warnings as a YOLO split. A task's ``reader`` keeps what its labels add (a format it has no
    parser for is refused), in a cache of its own."""
    parse = reader.parsers.get(split.format) if reader.kind else fmt.parse
    if parse is None:
        raise DataError(f"{prefix}{split}: {split.format} annotations hold no {reader.what}; {reader.who} needs them "
                        f"({reader.sources})")
    kind = reader.kind
    path, files = split.cache_path(), fmt.files(split)
    path = path.with_name(f"{path.stem}.{kind}.cache") if kind else path
    listed = _cached_files(path)
    result = load_cache(path, annotation_hash(split, listed, files, nc, kind)) if listed else None
    if result is not None and kind and result.extras is None:
        result = None
    shown = path
    if result is None:
        shown = split.annotations
        entries, note = parse(split)
        if note:
            LOGGER.info(f"{prefix}{split.annotations}: {note}")
        im_files = [e.path for e in entries]
        result = scan_files(im_files, entries, nc, desc=f"{prefix}Reading '{shown}'...", show=dist.is_main_process(),
                            repair_dir=split.cache_dir() / "repaired",
                            check=reader.check_entry)
        if save_cache(path, result, annotation_hash(split, im_files, files, nc, kind)):
            LOGGER.info(f"{prefix}New cache created: {path}")
    log_scan(result, prefix, shown, split.annotations)
    return result


def concat_results(results: Sequence[ScanResult]) -> ScanResult:
    """One ScanResult of several sources' scans, in order."""
    if len(results) == 1:
        return results[0]
    extras = [s for r in results for s in r.extras] if all(r.extras is not None for r in results) else None
    return ScanResult([f for r in results for f in r.im_files], np.concatenate([r.states for r in results]),
                      np.concatenate([r.shapes for r in results]), [lab for r in results for lab in r.labels],
                      np.concatenate([r.duplicates for r in results]), [m for r in results for m in r.messages],
                      [c for r in results for c in (r.repaired or [""] * len(r.im_files))], extras)


def crowd_note(excluded: int, what: str) -> str:
    """The one line a parse logs about the boxes it left out of training."""
    if not excluded:
        return ""
    return f"{excluded} {what} excluded from training; a split's keep_crowd: true keeps them"


def path_inside(folder: Path, name: Any) -> Path | None:
    """``folder / name`` when ``name`` (read from a file) is a relative path that stays inside ``folder``, symbolic
    links resolved (utils.paths.confined); None otherwise."""
    if not isinstance(name, str) or not name or "\0" in name or Path(name).is_absolute() or ".." in Path(name).parts:
        return None
    try:
        confined(name, folder)
    except (UserError, OSError, ValueError):
        return None
    return folder / name


def short(value: Any) -> str:
    """A value read from a file, for a message: its repr cut to a few dozen characters and nesting levels."""
    return SHORT.repr(value)


def _short_repr() -> reprlib.Repr:
    """reprlib's Repr with small limits (Python 3.10 has no keyword arguments for them)."""
    limits = reprlib.Repr()
    limits.maxlevel, limits.maxstring, limits.maxother, limits.maxlong = 2, 60, 60, 40
    limits.maxlist = limits.maxtuple = limits.maxdict = limits.maxset = 4
    return limits


SHORT = _short_repr()
MAX_SIDE = 1 << 20  # pixels a side an annotation may declare (larger sizes cannot pass the pixel limit anyway)


def dimension(value: Any) -> int:
    """An annotation's declared width or height (an integer, or a number or text holding one) as an int in
    1..MAX_SIDE; ValueError naming the value otherwise (never OverflowError or TypeError)."""
    number = float("nan")
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            number = float(value)
        except (ValueError, OverflowError):
            pass
    if not (math.isfinite(number) and 1 <= number <= MAX_SIDE):
        raise ValueError(f"size {short(value)} is not a pixel count in 1..{MAX_SIDE}")
    return int(number)
