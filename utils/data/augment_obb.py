"""Oriented boxes through the geometric augmentations: the four corners of every box go through the same matrix
as the pixels (letterbox, the random affine/perspective warp, flips), so a box turns with the image.

Corners are (n, 4, 2) pixel arrays. After a warp, a box is kept when, as utils/data/augment.box_candidates asks of
an axis-aligned box, its visible part (the area of its warped outline inside the image, computed exactly) keeps
more than ``area_thr`` of its scaled area, and its minimum-area rectangle is more than 2 pixels on each side with an
aspect ratio under 100; the box itself is kept whole (a rotated rectangle cut by the border is no rectangle), and
training reads it as its minimum-area rectangle (utils/data/obb_labels.corner_rows_to_targets). A flip reverses
the corners' order, which changes no rectangle.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch

from utils.data.augment import PAD_COLOR, _perspective_matrix
from utils.geometry.rotated import corners2xywhr, intersection_area, polygon_area


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


def random_perspective_obb(img: np.ndarray, corners: np.ndarray, classes: np.ndarray, rng: np.random.Generator,
                           degrees: float = 10, translate: float = 0.1, scale: float = 0.1, shear: float = 10,
                           perspective: float = 0.0,
                           border: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The random affine/perspective warp of utils/data/augment.random_perspective with oriented boxes: the image,
    its boxes' warped corners (n, 4, 2) and their classes, the boxes that do not survive left out."""
    height, width = img.shape[0] + border[0] * 2, img.shape[1] + border[1] * 2
    matrix, s = _perspective_matrix(rng, img.shape[:2], (height, width), degrees, translate, scale, shear,
                                    perspective)
    if border[0] != 0 or border[1] != 0 or (matrix != np.eye(3)).any():
        if perspective:
            img = cv2.warpPerspective(img, matrix, dsize=(width, height), borderValue=PAD_COLOR)
        else:
            img = cv2.warpAffine(img, matrix[:2], dsize=(width, height), borderValue=PAD_COLOR)
    moved = warp_corners(corners, matrix)
    keep = obb_candidates(corners, moved, s, (height, width))
    return img, moved[keep], np.asarray(classes)[keep]


def flip_obb(img: np.ndarray, corners: np.ndarray, rng: np.random.Generator, fliplr: float = 0.5,
             flipud: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Mirror left-right with probability ``fliplr`` and up-down with ``flipud``; the corners follow."""
    h, w = img.shape[:2]
    if rng.random() < flipud:
        img, corners = cv2.flip(img, 0), flip_ud_corners(corners, h)
    if rng.random() < fliplr:
        img, corners = cv2.flip(img, 1), flip_lr_corners(corners, w)
    return img, corners
