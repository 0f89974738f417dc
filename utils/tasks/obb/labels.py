"""Oriented-box label files: YOLO-OBB rows ``class x1 y1 x2 y2 x3 y3 x4 y4``, the four corners normalised to the
image (ultralytics' format, DOTA's corners after utils/data/dota.py), read and checked like box rows. READER is the
obb task's LabelReader (utils/tasks/registry.py names it): YOLO-OBB label files beside their images, each object's
enclosing box as its row and its corners as its points; COCO JSON and VOC hold no oriented boxes and are refused.

A row of another width, a value that is not a finite number, a class outside 0..nc-1, a corner outside the image
beyond the clipping tolerance or four corners that enclose no area make the file corrupt with the reason (a
ValueError, as a bad box row does: the image is skipped and counted). Corners are clipped to [0, 1]; repeated rows
are kept once and counted. The files are read through the bounded reader of the label scan (regular files of at
most MAX_LABEL_BYTES).

For training, corners become rotated boxes in a batch (utils/tasks/obb/sample.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from utils.data.annotations import LabelReader
from utils.data.label_cache import COORD_TOLERANCE, check_image, read_label_rows

OBB_COLUMNS = 9
EMPTY = np.zeros((0, OBB_COLUMNS), np.float32)


def check_obb_rows(rows: np.ndarray, nc: int | None) -> tuple[np.ndarray, int, str]:
    """(n, 9) float64 rows -> (float32 rows, corners clipped to [0, 1], without repeats; repeats removed; note).
    ValueError with the reason for an invalid row (see the module docstring)."""
    if not np.isfinite(rows).all():
        raise ValueError("non-finite label values")
    classes = rows[:, 0]
    if (classes < 0).any() or (classes != np.round(classes)).any():
        raise ValueError(f"class label {classes[(classes < 0) | (classes != np.round(classes))][0]:g} is not a "
                         "class index")
    if nc is not None and (classes >= nc).any():
        raise ValueError(f"class label {int(classes.max())} >= nc {nc}")
    corners = rows[:, 1:]
    outside = (corners < -COORD_TOLERANCE) | (corners > 1 + COORD_TOLERANCE)
    if outside.any():
        raise ValueError(f"non-normalized or out of bounds corner {corners[outside][0]:g}")
    rows = rows.astype(np.float32)
    rows[:, 1:] = rows[:, 1:].clip(0, 1)
    points = rows[:, 1:].reshape(-1, 4, 2).astype(np.float64)
    x, y = points[..., 0], points[..., 1]
    area = 0.5 * np.abs((x * np.roll(y, -1, 1) - y * np.roll(x, -1, 1)).sum(1))
    if (area <= 0).any():
        raise ValueError("oriented box with zero area")
    _, first = np.unique(rows, axis=0, return_index=True)
    repeats = len(rows) - len(first)
    if repeats:
        rows = rows[np.sort(first)]
    return rows, repeats, f"{repeats} duplicate labels removed" if repeats else ""


def parse_obb_rows(rows: Sequence[Sequence[str]], nc: int | None) -> tuple[np.ndarray, int, str]:
    """Split text rows -> checked (n, 9) rows (see check_obb_rows); ValueError naming the first problem."""
    if not rows:
        return EMPTY.copy(), 0, ""
    bad_width = next((len(r) for r in rows if len(r) != OBB_COLUMNS), None)
    if bad_width is not None:
        raise ValueError(f"oriented-box labels require {OBB_COLUMNS} columns (class and 4 corners), {bad_width} "
                         "columns detected")
    try:
        values = np.array(rows, dtype=np.float64)
    except ValueError:
        raise ValueError("non-numeric label values") from None
    return check_obb_rows(values, nc)


def read_obb_label_file(path: str | Path, nc: int | None) -> tuple[np.ndarray, str, int, str]:
    """One YOLO-OBB label file -> (rows (n, 9), state 'found'/'missing'/'empty', repeats removed, note);
    ValueError with the reason for a corrupt file."""
    rows, state = read_label_rows(path)
    if state != "found":
        return EMPTY.copy(), state, 0, ""
    labels, repeats, note = parse_obb_rows(rows, nc)
    return labels, "found", repeats, note


def enclosing_rows(rows: np.ndarray) -> np.ndarray:
    """(n, 9) rows [class, corners...] -> (n, 5) float32 [class, cx, cy, w, h] of the boxes that enclose them."""
    points = rows[:, 1:].reshape(-1, 4, 2)
    low, high = points.min(1), points.max(1)
    return np.concatenate((rows[:, :1], (low + high) / 2, high - low), 1).astype(np.float32)


def check_obb_sample(args: tuple[str, str, int | None, Path | None]) -> tuple:
    """``label_cache.check_sample`` for YOLO-OBB labels: its six values (each object's row its enclosing box) and,
    seventh, each object's corners (4, 2) normalised; a corrupt pair never raises."""
    im_file, label_file, nc, repair_dir = args
    try:
        shape, image_note, repaired = check_image(im_file, repair_dir)
        rows, state, repeats, note = read_obb_label_file(label_file, nc)
    except (ValueError, OverflowError, TypeError) as e:
        return (np.zeros((0, 5), np.float32), (0, 0), "corrupt", 0, f"{im_file}: ignoring corrupt image/label: {e}",
                "", [])
    notes = "; ".join(n for n in (image_note, note) if n)
    return (enclosing_rows(rows), shape, state, repeats, f"{im_file}: {notes}" if notes else "", repaired,
            list(rows[:, 1:].reshape(-1, 4, 2)))


READER = LabelReader(kind="corners", check=check_obb_sample, width=2, what="oriented boxes",
                     who="an oriented-box detector", sources="YOLO-OBB labels: class and four corners")
