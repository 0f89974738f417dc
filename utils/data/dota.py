"""DOTA's own label files -> YOLO-OBB label files (``class x1 y1 ... x4 y4``, the corners normalised: what the obb
task reads, utils/tasks/obb/labels.py).

A DOTA label file (``labelTxt/P0001.txt``) has one object a line, ``x1 y1 x2 y2 x3 y3 x4 y4 class difficult``: the
four corners in pixels, the class name (``small-vehicle``: hyphens where a data YAML's names may have spaces) and
whether the object is difficult (1) or not (0); DOTA v1.5 and v2 files may start with ``imagesource:...`` and
``gsd:...`` lines. Each object becomes a row ``class x1 y1 ... x4 y4`` with the class index in the YAML's names and
the corners divided by the image's width and height and clipped to it. Difficult objects are kept unless asked
(``keep_difficult=False``), as ultralytics' converter keeps them. Objects of a class the names do not list and
malformed lines are left out and counted; so is an object whose clipped corners enclose no area.

Label files are read through the bounded reader; an image is looked up by the label file's stem inside the image
folder only. ``convert_dota`` is the zoo's converter (a data YAML's ``convert: dota``) for the DOTA layout
``images/{train,val}`` with the original files in ``labels/{train,val}_original``; ``python -m utils.data.convert
--from dota`` converts any folder the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from utils.data.annotations import path_inside
from utils.data.errors import DataError
from utils.data.image_io import exif_size, opened_image
from utils.data.label_cache import MAX_LABEL_BYTES
from utils.data.regular_files import FileRefused, open_regular, read_regular
from utils.log import LOGGER
from utils.paths import IMG_SUFFIXES

HEADERS = ("imagesource:", "gsd:")
SPLITS = ("train", "val")


@dataclass
class DotaObjects:
    """The objects of one DOTA file: corners (k, 4, 2) in pixels, class indices (k,), difficult flags (k,), and how
    many lines were left out (a class not in the names, a malformed line)."""

    corners: np.ndarray
    classes: np.ndarray
    difficult: np.ndarray
    unknown: int = 0
    malformed: int = 0


def class_key(name: str) -> str:
    """A class name as DOTA's files and the YAMLs both write it: lower case, hyphens and underscores as spaces."""
    return " ".join(name.replace("-", " ").replace("_", " ").lower().split())


def parse_dota_text(text: str, names: Sequence[str], keep_difficult: bool = True) -> DotaObjects:
    """A DOTA label file's text -> its objects (see the module docstring)."""
    index = {class_key(n): i for i, n in enumerate(names)}
    corners, classes, difficult = [], [], []
    unknown = malformed = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].lower().startswith(HEADERS):
            continue
        if len(parts) not in (9, 10):
            malformed += 1
            continue
        try:
            values = np.array(parts[:8], dtype=np.float64)
            hard = len(parts) == 10 and int(parts[9]) != 0
        except ValueError:
            malformed += 1
            continue
        if not np.isfinite(values).all():
            malformed += 1
            continue
        cls = index.get(class_key(parts[8]))
        if cls is None:
            unknown += 1
            continue
        if hard and not keep_difficult:
            continue
        corners.append(values.reshape(4, 2))
        classes.append(cls)
        difficult.append(hard)
    return DotaObjects(np.array(corners, np.float64).reshape(-1, 4, 2), np.array(classes, np.int64),
                       np.array(difficult, bool), unknown, malformed)


def yolo_obb_text(objects: DotaObjects, size: tuple[int, int]) -> tuple[str, int]:
    """The objects as YOLO-OBB rows for an image of ``size`` (w, h): corners normalised and clipped; returns the
    text and how many objects were left out for enclosing no area inside the image."""
    corners = (objects.corners / np.array(size, np.float64)).clip(0, 1)
    x, y = corners[..., 0], corners[..., 1]
    area = 0.5 * np.abs((x * np.roll(y, -1, 1) - y * np.roll(x, -1, 1)).sum(1))
    keep = area > 0
    return obb_label_text(objects.classes[keep], corners[keep]), int((~keep).sum())


def obb_label_text(classes: Sequence[int] | np.ndarray, corners: np.ndarray) -> str:
    """YOLO-OBB rows as text: ``class x1 y1 ... x4 y4`` per object, ``corners`` (n, 4, 2) or (n, 8) normalised,
    each value the shortest decimal that reads back as the same float32."""
    flat = np.asarray(corners, np.float32).reshape(-1, 8)
    lines = [" ".join([str(int(c)), *(np.format_float_positional(v, trim="-") for v in row)])
             for c, row in zip(classes, flat)]
    return "".join(f"{line}\n" for line in lines)


def find_image(images: Path, stem: str) -> Path | None:
    """The image of a label file's ``stem`` inside ``images`` (any listed suffix), or None."""
    for suffix in sorted(IMG_SUFFIXES):
        for candidate in (f"{stem}{suffix}", f"{stem}{suffix.upper()}"):
            path = path_inside(images, candidate)
            if path is not None and path.is_file():
                return path
    return None


def image_size(path: Path) -> tuple[int, int]:
    """(w, h) from the header (EXIF orientation applied); DataError naming the file otherwise."""
    try:
        with open_regular(path) as f, opened_image(f) as img:
            return exif_size(img)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: {getattr(e, 'strerror', None) or e}") from None


def convert_dota_folder(labels: Path, images: Path, out: Path, names: Sequence[str], keep_difficult: bool = True,
                        claim: Callable[[Sequence[Path]], None] | None = None) -> dict[str, int]:
    """Every ``labels/*.txt`` with an image in ``images`` -> ``out/<stem>.txt`` in YOLO-OBB form. ``claim(targets)``
    is called before anything is written (a caller's guard against replacing files it did not write). Returns the
    counts: files converted, files skipped (no image, unreadable), objects written and left out."""
    if not labels.is_dir():
        raise DataError(f"{labels}: no folder of DOTA label files")
    counts = {"files": 0, "skipped": 0, "objects": 0, "unknown": 0, "malformed": 0, "empty": 0}
    pending: list[tuple[Path, str]] = []
    for label in sorted(p for p in labels.glob("*.txt") if p.is_file()):
        image = find_image(images, label.stem)
        try:
            if image is None:
                raise DataError(f"{label.name}: no image {label.stem}.* in {images}")
            objects = parse_dota_text(read_regular(label, MAX_LABEL_BYTES).decode("utf-8", "replace"), names,
                                      keep_difficult)
            text, empty = yolo_obb_text(objects, image_size(image))
        except (DataError, FileRefused, OSError) as e:
            counts["skipped"] += 1
            LOGGER.debug(f"DOTA: {label.name} skipped ({e})")
            continue
        counts["files"] += 1
        counts["objects"] += text.count("\n")
        counts["unknown"] += objects.unknown
        counts["malformed"] += objects.malformed
        counts["empty"] += empty
        pending.append((out / f"{label.stem}.txt", text))
    if claim is not None:
        claim([target for target, _ in pending])
    out.mkdir(parents=True, exist_ok=True)
    for target, text in pending:
        target.write_text(text)
    left_out = counts["unknown"] + counts["malformed"] + counts["empty"]
    if counts["skipped"] or left_out:
        LOGGER.warning(f"WARNING: DOTA {labels}: {counts['skipped']} files skipped (no image or unreadable); "
                       f"{counts['unknown']} objects of unlisted classes, {counts['malformed']} malformed lines and "
                       f"{counts['empty']} objects outside the image left out")
    return counts


def convert_dota(root: Path, names: Sequence[str]) -> None:
    """The zoo's converter: ``labels/{split}_original/*.txt`` -> ``labels/{split}/*.txt`` for the images in
    ``images/{split}``, for each split present."""
    for split in SPLITS:
        originals = root / "labels" / f"{split}_original"
        if originals.is_dir():
            counts = convert_dota_folder(originals, root / "images" / split, root / "labels" / split, names)
            LOGGER.info(f"DOTA {split}: {counts['files']} label files, {counts['objects']} objects converted")
