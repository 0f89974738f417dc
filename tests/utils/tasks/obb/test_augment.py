"""utils/data/augment_obb.py: oriented boxes turn with the image: corners through the warp's matrix land where the
warped pixels are, flips mirror them, and boxes pushed out of the image are dropped."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from shapely.geometry import Polygon, box

from utils.data.augment import letterbox, random_perspective_extras, warp_mosaic_extras
from utils.data.datasets import YoloDataset
from utils.data.dota import obb_label_text
from utils.data.samples import DatasetOptions
from utils.tasks.obb.augment import (
    CornerGeometry,
    flip_lr_corners,
    flip_ud_corners,
    letterbox_corners,
    obb_candidates,
    visible_area,
    warp_corners,
)
from utils.tasks.obb.rotated import xywhr2corners

CORNERS = CornerGeometry()


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
    labels = np.array([[2, *corners[0].min(0), *corners[0].max(0)]], np.float32)
    out, kept, moved = random_perspective_extras(img, labels, corners.astype(np.float32), CORNERS,
                                                 np.random.default_rng(3), degrees=40, translate=0.1, scale=0.3,
                                                 shear=5)
    assert kept[:, 0].tolist() == [2] and moved.shape == (1, 4, 2)
    assert iou(out[..., 0] > 127, drawn(out.shape[:2], moved)) > 0.85  # the box is where its pixels went
    np.testing.assert_allclose(kept[0, 1:], np.concatenate((moved[0].min(0), moved[0].max(0))).clip(0, 96), atol=1e-4)
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
    normalized = CORNERS.normalize(corners.astype(np.float32), 80, 50)
    both = CORNERS.flip_ud(CORNERS.flip_lr(normalized)) * [80, 50]  # the geometry's flips, on normalised corners
    assert iou(cv2.flip(img, -1)[..., 0] > 127, drawn((50, 80), both)) > 0.95


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


def test_mosaic_places_and_warps_the_corners() -> None:
    rng = np.random.default_rng(0)
    images, labels, corners = [], [], []
    for i in range(4):
        box = xywhr2corners(torch.tensor([[24.0 + 4 * i, 20.0, 20.0, 8.0, 0.3 + 0.4 * i]], dtype=torch.float64))
        img = np.zeros((40, 48, 3), np.uint8)
        img[drawn((40, 48), box.numpy())] = 255
        images.append(img)
        low, high = box[0].min(0).values.numpy(), box[0].max(0).values.numpy()
        labels.append(np.array([[i, *((low + high) / 2 / [48, 40]), *((high - low) / [48, 40])]], np.float32))
        corners.append((box.numpy() / [48, 40]).astype(np.float32))
    out, kept, moved = warp_mosaic_extras(images, labels, corners, CORNERS, 64, rng, degrees=20, scale=0.2)
    assert len(kept) == len(moved) >= 2 and moved.shape[1:] == (4, 2)
    assert iou(out[..., 0] > 127, drawn((64, 64), moved)) > 0.75


def test_augmented_samples_keep_their_boxes_on_the_pixels(tmp_path: Path) -> None:
    """A data set of white rotated rectangles on black: after mosaic, rotation, scaling and flips, every sample's
    corners (what the batch's rotated boxes are made of) cover the white pixels."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    rng = np.random.default_rng(1)
    for i in range(6):
        boxes = torch.tensor([[rng.uniform(25, 55), rng.uniform(25, 45), rng.uniform(14, 24), rng.uniform(6, 10),
                               rng.uniform(0, 3)] for _ in range(2)], dtype=torch.float64)
        corners = xywhr2corners(boxes).numpy()
        img = np.zeros((64, 80, 3), np.uint8)
        img[drawn((64, 80), corners[:1])] = 255
        cv2.imwrite(str(tmp_path / "images" / f"{i}.png"), img)
        (tmp_path / "labels" / f"{i}.txt").write_text(obb_label_text([0], corners[:1] / [80, 64]))
    hyp = {"mosaic": 1.0, "degrees": 30.0, "translate": 0.1, "scale": 0.3, "fliplr": 0.5, "flipud": 0.5}
    dataset = YoloDataset(str(tmp_path / "images"), DatasetOptions(img_size=64, augment=True, hyp=hyp, task="obb",
                                                                   nc=1))
    checked = 0
    for index in range(6):
        sample = dataset[(index, (0, 0, index))]
        white = sample.image[0].numpy() > 127
        if not len(sample.extras):
            continue
        quads = sample.extras * [white.shape[1], white.shape[0]]
        assert iou(white, drawn(white.shape, quads)) > 0.7, index
        checked += 1
    assert checked >= 4
