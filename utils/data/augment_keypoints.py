"""Keypoints that follow the pixels: the keypoint side of every geometric augmentation in utils.data.augment.

Each function takes keypoints where the box code takes boxes and moves them the same way: letterbox scale and
padding, mosaic placement, the affine/perspective matrix (the same random draws), flips (left-right with the data
set's ``flip_idx``, so a left eye becomes the right eye) and mixup. Keypoints are (k, K, 3) float32 arrays of x, y
and visibility v (utils.data.keypoints): pixels unless a name says ``normalized``. An unlabelled keypoint (v 0) stays
0 0 0 through every step, and a keypoint that a step moves out of the image is made unlabelled the same way (it
would otherwise teach a position the image does not show).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from utils.data.augment import (
    TilePlace,
    _perspective_matrix,
    mosaic_boxes,
    random_perspective,
    warp_boxes,
    warp_mosaic,
)
from utils.data.augment_masks import mosaic_geometry


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
              out_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``augment.warp_boxes`` for objects with keypoints: labels (k, 5) [cls, x1, y1, x2, y2] and their keypoints
    (k, K, 3) moved by ``matrix`` into an image of ``out_shape`` (h, w). The boxes are warp_boxes' (the kept
    objects, clipped); the kept objects' keypoints are warped, those outside the image made unlabelled."""
    if not len(labels):
        return labels, keypoints
    indexed = np.concatenate((labels, np.arange(len(labels), dtype=np.float32)[:, None]), 1)
    kept = warp_boxes(indexed, matrix, scale, out_shape)  # an extra column rides along with the kept rows
    rows = kept[:, 5].astype(np.int64)
    height, width = out_shape
    return kept[:, :5], hide_outside(warp_keypoints(keypoints[rows], matrix), width, height)


def random_perspective_pose(img: np.ndarray, labels: np.ndarray, keypoints: np.ndarray, rng: np.random.Generator,
                            degrees: float = 10, translate: float = 0.1, scale: float = 0.1, shear: float = 10,
                            perspective: float = 0.0, border: tuple[int, int] = (0, 0)
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``augment.random_perspective`` moving keypoints too: the same random draws, image and boxes."""
    height, width = img.shape[0] + border[0] * 2, img.shape[1] + border[1] * 2
    matrix, s = _perspective_matrix(copy.deepcopy(rng), img.shape[:2], (height, width), degrees, translate, scale,
                                    shear, perspective)  # the draws random_perspective makes next
    img, _ = random_perspective(img, labels[:0], rng, degrees, translate, scale, shear, perspective, border)
    labels, keypoints = warp_pose(labels, keypoints, matrix, s, (height, width))
    return img, labels, keypoints


def mosaic_keypoints(keypoints: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]],
                     places: Sequence[TilePlace], size: int) -> np.ndarray:
    """``augment.mosaic_boxes`` for keypoints: each tile's normalised keypoints (k_i, K, 3) placed on the 2s x 2s
    canvas (in pixels); those a tile's crop or the canvas edge cut off made unlabelled."""
    moved = []
    for points, (h, w), place in zip(keypoints, sizes, places):
        if not len(points):
            continue
        pixels = keypoints_to_pixels(points, w, h, place.x1a - place.x1b, place.y1a - place.y1b)
        x, y = pixels[..., 0], pixels[..., 1]
        cut = (x < place.x1a) | (x > place.x2a) | (y < place.y1a) | (y > place.y2a)  # outside the visible part
        pixels[cut] = 0.0
        moved.append(pixels)
    if not moved:
        count = keypoints[0].shape[1] if len(keypoints) and keypoints[0].ndim == 3 else 0
        return np.zeros((0, count, 3), np.float32)
    return hide_outside(np.concatenate(moved), 2 * size, 2 * size)


def warp_mosaic_pose(images: Sequence[np.ndarray], labels: Sequence[np.ndarray], keypoints: Sequence[np.ndarray],
                     size: int, rng: np.random.Generator, sizes: Sequence[tuple[int, int]] | None = None,
                     degrees: float = 10, translate: float = 0.1, scale: float = 0.1, shear: float = 10,
                     perspective: float = 0.0, hsv: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``augment.warp_mosaic`` with keypoints: the image is warp_mosaic's (the same draws from ``rng``), the tiles'
    normalised keypoints are placed and warped by the same geometry. Returns (image, labels (k, 5) [cls, x1, y1,
    x2, y2], keypoints (k, K, 3) pixels)."""
    sizes = [tuple(img.shape[:2]) for img in images] if sizes is None else [tuple(hw) for hw in sizes]
    places, matrix, s = mosaic_geometry(sizes, size, copy.deepcopy(rng), degrees, translate, scale, shear,
                                        perspective)
    img, _ = warp_mosaic(images, labels, size, rng, sizes, degrees, translate, scale, shear, perspective, hsv)
    boxes = mosaic_boxes(labels, sizes, places, size)
    out_labels, out_keypoints = warp_pose(boxes, mosaic_keypoints(keypoints, sizes, places, size), matrix, s,
                                          (size, size))
    return img, out_labels, out_keypoints


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


def mixup_keypoints(keypoints: np.ndarray, keypoints2: np.ndarray) -> np.ndarray:
    """Keypoints after ``augment.mixup``: both images' objects, in the order mixup concatenates the labels."""
    return np.concatenate((keypoints, keypoints2), 0)
