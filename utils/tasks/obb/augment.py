"""Oriented boxes through the geometric augmentations: the obb task's Geometry (``CornerGeometry``), which the one
sample pipeline (utils/data/datasets.py, utils/data/augment.py) moves with the boxes at every step: the four corners
of every box go through the same matrix as the pixels (letterbox, mosaic placement, the random affine/perspective
warp, flips, mixup), so a box turns with the image.

Corners are (n, 4, 2) pixel arrays unless a name says ``normalized``. After a warp, a box is kept when, as
utils/data/augment.box_candidates asks of an axis-aligned box, its visible part (the area of its warped outline
inside the image, computed exactly) keeps more than ``area_thr`` of its scaled area, and its minimum-area rectangle
is more than 2 pixels on each side with an aspect ratio under 100; the box itself is kept whole (a rotated rectangle
cut by the border is no rectangle), and training reads it as its minimum-area rectangle (utils/tasks/obb/sample.py);
its enclosing box, clipped to the image, is its row in the labels. A flip reverses the corners' order, which changes
no rectangle. The mosaic places the corners on its canvas unclipped, and the warp that crops the canvas decides
which boxes stay.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from utils.data.augment import Geometry, TilePlace
from utils.tasks.obb.rotated import corners2xywhr, intersection_area, polygon_area


def warp_corners(corners: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """(n, 4, 2) points through a 3x3 ``matrix`` (affine or projective) -> (n, 4, 2)."""
    if not len(corners):
        return corners.reshape(0, 4, 2).astype(np.float64)
    points = np.concatenate((corners.reshape(-1, 2).astype(np.float64), np.ones((corners.size // 2, 1))), 1)
    moved = points @ matrix.T
    if matrix[2, 0] != 0 or matrix[2, 1] != 0:
        moved = moved[:, :2] / moved[:, 2:3]
    return moved[:, :2].reshape(-1, 4, 2)


def letterbox_corners(corners: np.ndarray, ratio: tuple[float, float], pad: tuple[float, float]) -> np.ndarray:
    """Corners of the original image -> the letterboxed image's (utils/data/augment.letterbox's ratio and pad)."""
    return corners * np.array(ratio, np.float64) + np.array(pad, np.float64)


def flip_lr_corners(corners: np.ndarray, width: float) -> np.ndarray:
    out = corners.astype(np.float64, copy=True)
    out[..., 0] = width - out[..., 0]
    return out[:, ::-1].copy()


def flip_ud_corners(corners: np.ndarray, height: float) -> np.ndarray:
    out = corners.astype(np.float64, copy=True)
    out[..., 1] = height - out[..., 1]
    return out[:, ::-1].copy()


def _ordered(corners: np.ndarray) -> np.ndarray:
    """Corners ordered to a positive shoelace sum, as the exact intersection wants them."""
    x, y = corners[..., 0], corners[..., 1]
    signed = (x * np.roll(y, -1, 1) - y * np.roll(x, -1, 1)).sum(1)
    return np.where((signed < 0)[:, None, None], corners[:, ::-1], corners)


def visible_area(corners: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(n,) the area of each (convex) outline inside an image of ``shape`` (h, w)."""
    if not len(corners):
        return np.zeros(0)
    h, w = shape
    image = np.array([[w, h], [0, h], [0, 0], [w, 0]], np.float64)
    a = torch.from_numpy(_ordered(corners.astype(np.float64)))
    b = torch.from_numpy(np.broadcast_to(image, a.shape).copy())
    return intersection_area(a, b).numpy()


def obb_candidates(before: np.ndarray, after: np.ndarray, scale: float, shape: tuple[int, int],
                   wh_thr: float = 2, ar_thr: float = 100, area_thr: float = 0.1, eps: float = 1e-16) -> np.ndarray:
    """Which boxes survive a warp (see the module docstring): ``before`` and ``after`` (n, 4, 2) corners, the warp's
    ``scale``, the output ``shape`` (h, w)."""
    if not len(after):
        return np.zeros(0, bool)
    area_before = polygon_area(torch.from_numpy(before.astype(np.float64))).numpy() * scale ** 2
    rect = corners2xywhr(torch.from_numpy(after.astype(np.float64))).numpy()
    w, h = rect[:, 2], rect[:, 3]
    aspect = np.maximum(w / (h + eps), h / (w + eps))
    return (w > wh_thr) & (h > wh_thr) & (visible_area(after, shape) / (area_before + eps) > area_thr) & \
        (aspect < ar_thr)


def warp_obb(labels: np.ndarray, corners: np.ndarray, matrix: np.ndarray, scale: float,
             out_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Labels (k, 5) [cls, x1, y1, x2, y2] and their corners (k, 4, 2) moved by the 3x3 ``matrix`` into an image of
    ``out_shape`` (h, w): the boxes that survive (obb_candidates), each row the enclosing box of its warped corners
    clipped to the image."""
    moved = warp_corners(corners, matrix)
    keep = obb_candidates(corners, moved, scale, out_shape)
    moved = moved[keep]
    rows = labels[keep].astype(np.float32, copy=True)
    if len(rows):
        low, high = moved.min(1), moved.max(1)
        rows[:, 1:5] = np.concatenate((low, high), 1)
        rows[:, [1, 3]] = rows[:, [1, 3]].clip(0, out_shape[1])
        rows[:, [2, 4]] = rows[:, [2, 4]].clip(0, out_shape[0])
    return rows, moved.astype(np.float32)


class CornerGeometry(Geometry):
    """Corners (k, 4, 2) moved with their boxes (utils.data.augment.Geometry): placed, put on a mosaic's canvas,
    warped (each box's row the enclosing box of its corners), normalised, mirrored and joined by mixup."""

    def place(self, extras: np.ndarray, width: float, height: float, pad_x: float = 0.0,
              pad_y: float = 0.0) -> np.ndarray:
        return (extras * np.array([width, height], np.float32) + np.array([pad_x, pad_y], np.float32)).astype(
            np.float32)

    def mosaic(self, extras: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]], places: Sequence[TilePlace],
               size: int) -> np.ndarray:
        moved = [self.place(c, w, h, t.x1a - t.x1b, t.y1a - t.y1b) for c, (h, w), t in zip(extras, sizes, places)]
        return np.concatenate(moved).astype(np.float32) if moved else np.zeros((0, 4, 2), np.float32)

    def warp(self, labels: np.ndarray, extras: np.ndarray, matrix: np.ndarray, scale: float,
             out_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        return warp_obb(labels, extras, matrix, scale, out_shape)

    def normalize(self, extras: np.ndarray, width: float, height: float) -> np.ndarray:
        return (extras / np.array([width, height], np.float32)).astype(np.float32)

    def flip_lr(self, extras: np.ndarray) -> np.ndarray:
        return flip_lr_corners(extras, 1.0).astype(np.float32)

    def flip_ud(self, extras: np.ndarray) -> np.ndarray:
        return flip_ud_corners(extras, 1.0).astype(np.float32)

    def join(self, extras: np.ndarray, other: np.ndarray) -> np.ndarray:
        return np.concatenate((extras, other)).astype(np.float32)
