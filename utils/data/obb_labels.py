"""Oriented-box label files: YOLO-OBB rows ``class x1 y1 x2 y2 x3 y3 x4 y4``, the four corners normalised to the
image (ultralytics' format, DOTA's corners after utils/data/dota.py), read and checked like box rows.

A row of another width, a value that is not a finite number, a class outside 0..nc-1, a corner outside the image
beyond the clipping tolerance or four corners that enclose no area make the file corrupt with the reason (a
ValueError, as a bad box row does: the image is skipped and counted). Corners are clipped to [0, 1]; repeated rows
are kept once and counted. The files are read through the bounded reader of the label scan (regular files of at
most MAX_LABEL_BYTES).

For training, corners become rotated boxes (``corner_rows_to_targets``): [class, cx, cy, w, h, r] with the
minimum-area rectangle's centre and size divided by the image's width and height (x and w by the width, y and h
by the height: the loss multiplies back the same way) and its angle in radians, in [0, pi/2).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from utils.data.label_cache import COORD_TOLERANCE, read_label_rows
from utils.geometry.rotated import corners2xywhr

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


def corner_rows_to_targets(rows: np.ndarray, size: tuple[int, int] = (1, 1)) -> np.ndarray:
    """(n, 9) rows [class, corners...] normalised to an image of ``size`` (w, h) -> (n, 6) float32 [class, cx, cy,
    w, h, r] (see the module docstring): the rectangle is found in pixels, so a non-square image keeps its
    angles."""
    if not len(rows):
        return np.zeros((0, 6), np.float32)
    scale = np.array(size, np.float64)
    corners = rows[:, 1:].astype(np.float64).reshape(-1, 4, 2) * scale
    boxes = corners2xywhr(torch.from_numpy(corners)).numpy()
    boxes[:, [0, 2]] /= scale[0]
    boxes[:, [1, 3]] /= scale[1]
    return np.concatenate((rows[:, :1].astype(np.float64), boxes), 1).astype(np.float32)


def obb_label_text(classes: Sequence[int] | np.ndarray, corners: np.ndarray) -> str:
    """YOLO-OBB rows as text: ``class x1 y1 ... x4 y4`` per object, ``corners`` (n, 4, 2) or (n, 8) normalised,
    each value the shortest decimal that reads back as the same float32."""
    flat = np.asarray(corners, np.float32).reshape(-1, 8)
    lines = [" ".join([str(int(c)), *(np.format_float_positional(v, trim="-") for v in row)])
             for c, row in zip(classes, flat)]
    return "".join(f"{line}\n" for line in lines)
