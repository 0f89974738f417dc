"""Keypoints that follow the pixels: the pose task's Geometry (``KeypointGeometry``), which the one sample pipeline
(utils/data/datasets.py, utils/data/augment.py) moves with the boxes at every geometric step.

Each step moves keypoints where the box code moves boxes: letterbox scale and padding, mosaic placement, the
affine/perspective matrix (the same random draws: the pipeline's), flips (left-right with the data set's
``flip_idx``, so a left eye becomes the right eye) and mixup. Keypoints are (k, K, 3) float32 arrays of x, y and
visibility v (utils/tasks/pose/labels.py), pixels unless a name says ``normalized``. An unlabelled keypoint (v 0)
stays 0 0 0 through every step, and a keypoint that a step moves out of the image is made unlabelled the same way
(it would otherwise teach a position the image does not show).

The Geometry's extras are each object's (K + 1, 3) array (its keypoints, then the row that carries the share of its
box its area fills, utils/tasks/pose/labels.py): the keypoints move, the last row rides along with its object.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from utils.data.augment import Geometry, TilePlace, warp_boxes


def _unlabelled_kept(out: np.ndarray, keypoints: np.ndarray) -> np.ndarray:
    """``out`` with the keypoints that were unlabelled in ``keypoints`` set back to 0 0 0."""
    out[keypoints[..., 2] <= 0] = 0.0
    return out


def hide_outside(keypoints: np.ndarray, width: float, height: float) -> np.ndarray:
    """Keypoints (k, K, 3) pixels with those outside [0, width] x [0, height] made unlabelled (0 0 0)."""
    out = keypoints.astype(np.float32, copy=True)
    x, y = out[..., 0], out[..., 1]
    out[(x < 0) | (x > width) | (y < 0) | (y > height)] = 0.0
    return out


def keypoints_to_pixels(keypoints_normalized: np.ndarray, width: float, height: float, pad_x: float = 0.0,
                        pad_y: float = 0.0) -> np.ndarray:
    """Normalised keypoints (k, K, 3) -> pixels of an image ``width`` x ``height`` placed at (pad_x, pad_y): what
    ``xywhn2xyxy`` does for boxes (letterbox: width = ratio_w * w and its pads; mosaic: the tile's offset)."""
    out = keypoints_normalized.astype(np.float32, copy=True)
    out[..., 0] = keypoints_normalized[..., 0] * width + pad_x
    out[..., 1] = keypoints_normalized[..., 1] * height + pad_y
    return _unlabelled_kept(out, keypoints_normalized)


def keypoints_to_normalized(keypoints: np.ndarray, width: float, height: float) -> np.ndarray:
    """Pixel keypoints (k, K, 3) -> normalised to an image ``width`` x ``height``; those outside it unlabelled."""
    out = hide_outside(keypoints, width, height)
    out[..., 0] /= width
    out[..., 1] /= height
    return out


def warp_keypoints(keypoints: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Keypoints (k, K, 3) moved by a 3x3 affine or perspective ``matrix`` (the one the image is warped by);
    visibilities as they were (``hide_outside`` then clears those the image lost)."""
    out = keypoints.astype(np.float32, copy=True)
    if not keypoints.size:
        return out
    xy = np.concatenate((keypoints[..., :2].reshape(-1, 2), np.ones((keypoints.shape[0] * keypoints.shape[1], 1))), 1)
    xy = xy @ matrix.T
    projective = matrix[2, 0] != 0 or matrix[2, 1] != 0
    xy = xy[:, :2] / xy[:, 2:3] if projective else xy[:, :2]
    out[..., :2] = xy.reshape(*keypoints.shape[:2], 2)
    return _unlabelled_kept(out, keypoints)


def warp_pose(labels: np.ndarray, keypoints: np.ndarray, matrix: np.ndarray, scale: float,
              out_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``augment.warp_boxes`` for objects with keypoints: labels (k, 5) [cls, x1, y1, x2, y2] and their keypoints
    (k, K, 3) moved by ``matrix`` into an image of ``out_shape`` (h, w). The boxes are warp_boxes' (the kept
    objects, clipped); the kept objects' keypoints are warped, those outside the image made unlabelled. Returns
    (labels, keypoints, the kept objects' indices)."""
    if not len(labels):
        return labels, keypoints, np.zeros(0, np.int64)
    indexed = np.concatenate((labels, np.arange(len(labels), dtype=np.float32)[:, None]), 1)
    kept = warp_boxes(indexed, matrix, scale, out_shape)  # an extra column rides along with the kept rows
    rows = kept[:, 5].astype(np.int64)
    height, width = out_shape
    return kept[:, :5], hide_outside(warp_keypoints(keypoints[rows], matrix), width, height), rows


def mosaic_keypoints(keypoints: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]],
                     places: Sequence[TilePlace], size: int) -> np.ndarray:
    """``augment.mosaic_boxes`` for keypoints: each tile's normalised keypoints (k_i, K, 3) placed on the 2s x 2s
    canvas (in pixels), in the tiles' order; those a tile's crop or the canvas edge cut off made unlabelled."""
    moved = []
    for points, (h, w), place in zip(keypoints, sizes, places):
        pixels = keypoints_to_pixels(points, w, h, place.x1a - place.x1b, place.y1a - place.y1b)
        x, y = pixels[..., 0], pixels[..., 1]
        cut = (x < place.x1a) | (x > place.x2a) | (y < place.y1a) | (y > place.y2a)  # outside the visible part
        pixels[cut] = 0.0
        moved.append(pixels)
    return hide_outside(np.concatenate(moved), 2 * size, 2 * size)


def flip_keypoints_lr(keypoints_normalized: np.ndarray, flip_index: Sequence[int]) -> np.ndarray:
    """Mirror normalised keypoints left-right (with ``augment.flip_lr``): x -> 1 - x, and each keypoint takes its
    mirror's place (``flip_index``: keypoint i of the flipped object is keypoint flip_index[i] of the original)."""
    out = keypoints_normalized[:, list(flip_index)].astype(np.float32, copy=True)
    out[..., 0] = 1 - out[..., 0]
    return _unlabelled_kept(out, keypoints_normalized[:, list(flip_index)])


def flip_keypoints_ud(keypoints_normalized: np.ndarray) -> np.ndarray:
    """Mirror normalised keypoints up-down (with ``augment.flip_ud``); no keypoint changes its name."""
    out = keypoints_normalized.astype(np.float32, copy=True)
    out[..., 1] = 1 - out[..., 1]
    return _unlabelled_kept(out, keypoints_normalized)


def _joined(points: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Moved keypoints (k, K, 3) with their objects' last rows (k, 1, 3) -> (k, K + 1, 3)."""
    return np.concatenate((points.astype(np.float32), rows.astype(np.float32)), 1)


class KeypointGeometry(Geometry):
    """The pose task's Geometry (see the module docstring): extras (k, K + 1, 3), keypoints first. ``flip_index``
    is the data set's flip_idx (None: a left-right flip mirrors each keypoint in its own place)."""

    def __init__(self, flip_index: Sequence[int] | None = None) -> None:
        self.flip_index = None if flip_index is None else [int(i) for i in flip_index]

    def place(self, extras: np.ndarray, width: float, height: float, pad_x: float = 0.0,
              pad_y: float = 0.0) -> np.ndarray:
        return _joined(keypoints_to_pixels(extras[:, :-1], width, height, pad_x, pad_y), extras[:, -1:])

    def mosaic(self, extras: Sequence[np.ndarray] | None, sizes: Sequence[tuple[int, int]],
               places: Sequence[TilePlace], size: int) -> np.ndarray:
        tiles = list(extras or ())
        moved = mosaic_keypoints([t[:, :-1] for t in tiles], sizes, places, size)
        return _joined(moved, np.concatenate([t[:, -1:] for t in tiles]))

    def warp(self, labels: np.ndarray, extras: np.ndarray, matrix: np.ndarray, scale: float,
             out_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        kept, moved, rows = warp_pose(labels, extras[:, :-1], matrix, scale, out_shape)
        return kept, _joined(moved, extras[rows, -1:])

    def normalize(self, extras: np.ndarray, width: float, height: float) -> np.ndarray:
        return _joined(keypoints_to_normalized(extras[:, :-1], width, height), extras[:, -1:])

    def flip_lr(self, extras: np.ndarray) -> np.ndarray:
        order = self.flip_index if self.flip_index is not None else range(extras.shape[1] - 1)
        return _joined(flip_keypoints_lr(extras[:, :-1], order), extras[:, -1:])

    def flip_ud(self, extras: np.ndarray) -> np.ndarray:
        return _joined(flip_keypoints_ud(extras[:, :-1]), extras[:, -1:])

    def join(self, extras: np.ndarray, other: np.ndarray) -> np.ndarray:
        """After ``augment.mixup``: both images' objects, in the order mixup concatenates the labels."""
        return np.concatenate((extras, other), 0)
