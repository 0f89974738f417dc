"""utils/data/augment_obb.py: oriented boxes turn with the image: corners through the warp's matrix land where the
warped pixels are, flips mirror them, and boxes pushed out of the image are dropped."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from shapely.geometry import Polygon, box

from utils.data.augment import letterbox
from utils.data.augment_obb import (
    flip_lr_corners,
    flip_obb,
    flip_ud_corners,
    letterbox_corners,
    obb_candidates,
    random_perspective_obb,
    visible_area,
    warp_corners,
)
from utils.geometry.rotated import xywhr2corners


def drawn(shape: tuple[int, int], corners: np.ndarray) -> np.ndarray:
    """A mask of the polygons (pixel centres at +0.5, as the synthetic set draws them)."""
    mask = np.zeros(shape, np.uint8)
    for quad in corners:
        cv2.fillPoly(mask, [np.round((quad - 0.5) * 256).astype(np.int32)], 255, cv2.LINE_8, shift=8)
    return mask > 0


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


def test_warp_moves_corners_with_the_pixels() -> None:
    corners = xywhr2corners(torch.tensor([[40.0, 30.0, 36.0, 12.0, 0.4]], dtype=torch.float64)).numpy()
    img = np.zeros((64, 96, 3), np.uint8)
    img[drawn((64, 96), corners)] = 255
    out, moved, classes = random_perspective_obb(img, corners, np.array([2]), np.random.default_rng(3), degrees=40,
                                                 translate=0.1, scale=0.3, shear=5)
    assert classes.tolist() == [2] and moved.shape == (1, 4, 2)
    assert iou(out[..., 0] > 127, drawn(out.shape[:2], moved)) > 0.85  # the box is where its pixels went
    turned = np.array([[0.0, -1.0, 96.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # a quarter turn (x, y) -> (96 - y, x)
    np.testing.assert_allclose(warp_corners(np.array([[[10.0, 20.0]] * 4]), turned)[0, 0], [76.0, 10.0])
    projective = np.array([[1.0, 0, 0], [0, 1.0, 0], [0.001, 0, 1.0]])
    np.testing.assert_allclose(warp_corners(np.array([[[100.0, 50.0]] * 4]), projective)[0, 0],
                               [100 / 1.1, 50 / 1.1])


def test_letterbox_and_flips_follow_the_image() -> None:
    corners = xywhr2corners(torch.tensor([[30.0, 20.0, 24.0, 8.0, 0.7]], dtype=torch.float64)).numpy()
    img = np.zeros((50, 80, 3), np.uint8)
    img[drawn((50, 80), corners)] = 255
    boxed, ratio, pad = letterbox(img, 64, auto=False)
    moved = letterbox_corners(corners, ratio, pad)
    assert iou(boxed[..., 0] > 127, drawn(boxed.shape[:2], moved)) > 0.8
    for flip, code, size in ((flip_lr_corners, 1, 80), (flip_ud_corners, 0, 50)):
        mirrored = flip(corners, size)
        assert iou(cv2.flip(img, code)[..., 0] > 127, drawn((50, 80), mirrored)) > 0.95
        assert np.allclose(flip(mirrored, size), corners)
    flipped, both = flip_obb(img, corners, np.random.default_rng(0), fliplr=1.0, flipud=1.0)
    assert iou(flipped[..., 0] > 127, drawn((50, 80), both)) > 0.95


def test_boxes_pushed_out_are_dropped() -> None:
    inside = xywhr2corners(torch.tensor([[30.0, 30.0, 20.0, 10.0, 0.3]], dtype=torch.float64)).numpy()
    half_out = inside + [[[-28.0, 0.0]]]  # a part of it left of x = 0
    far_out = inside + [[[-60.0, 0.0]]]
    assert visible_area(inside, (64, 64))[0] == pytest.approx(200.0)
    expected = Polygon(half_out[0].tolist()).intersection(box(0, 0, 64, 64)).area  # shapely's, independently
    assert 80 < expected < 150 and visible_area(half_out, (64, 64))[0] == pytest.approx(expected, abs=1e-9)
    assert visible_area(far_out, (64, 64))[0] == 0.0
    keep = obb_candidates(np.concatenate([inside] * 3), np.concatenate((inside, half_out, far_out)), 1.0, (64, 64))
    assert keep.tolist() == [True, True, False]
    assert not obb_candidates(inside, inside * 0.05, 1.0, (64, 64))[0]  # shrunk below 2 px
    assert obb_candidates(inside, inside * 0.5 + 10, 0.5, (64, 64))[0]  # scaled by the warp's own scale: kept
    thin = xywhr2corners(torch.tensor([[30.0, 30.0, 60.0, 0.5, math.pi / 6]], dtype=torch.float64)).numpy()
    assert not obb_candidates(thin, thin, 1.0, (64, 64))[0]
