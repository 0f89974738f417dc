"""utils/tasks/segment/augment.py: outlines follow the pixels and the boxes through every geometric augmentation.

The checks compare two independent routes: an outline rasterised then moved as pixels (cv2's warps, the box code,
the mosaic's own image) against the outline moved then rasterised (utils.tasks.segment.masks' exact fill)."""

from __future__ import annotations

import copy

import cv2
import numpy as np
import pytest

from utils.data.augment import (
    _perspective_matrix,
    letterbox,
    mosaic_boxes,
    random_perspective,
    warp_boxes,
    warp_mosaic,
)
from utils.tasks.segment.augment import (
    RESAMPLE_POINTS,
    clip_polygon,
    clip_polygons,
    copy_paste,
    flip_polygons_lr,
    flip_polygons_ud,
    mixup_segments,
    mosaic_geometry,
    mosaic_polygons,
    polygon_boxes,
    random_perspective_segments,
    resample_polygon,
    resample_polygons,
    to_normalized,
    to_pixels,
    warp_mosaic_segments,
    warp_polygons,
    warp_segments,
)
from utils.tasks.segment.masks import polygon_area, polygons_to_masks


def blob(rng: np.random.Generator, centre: tuple[float, float], radius: float, points: int = 10) -> np.ndarray:
    """A random star-shaped polygon (simple)."""
    angles = np.sort(rng.uniform(0, 2 * np.pi, points))
    radii = rng.uniform(0.5, 1.0, points) * radius
    return np.stack([centre[0] + radii * np.cos(angles), centre[1] + radii * np.sin(angles)], 1)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(bool), b.astype(bool)
    return float((a & b).sum() / max((a | b).sum(), 1))


def rectangle(x1: float, y1: float, x2: float, y2: float) -> np.ndarray:
    return np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float64)


def test_resampling_keeps_the_vertices_and_the_pixels() -> None:
    rng = np.random.default_rng(0)
    polygon = blob(rng, (50, 40), 30, 12)
    dense = resample_polygon(polygon, 100)
    assert dense.shape == (100, 2) and dense.dtype == np.float32
    assert all(np.isclose(dense, vertex, atol=1e-4).all(1).any() for vertex in polygon)  # every vertex kept
    assert (polygons_to_masks([dense], (96, 112)) == polygons_to_masks([polygon], (96, 112))).all()
    sparse = resample_polygon(polygon, 6)  # fewer points than vertices: spread along the outline
    assert sparse.shape == (6, 2) and np.allclose(sparse[0], polygon[0])
    assert resample_polygons([polygon, rectangle(0, 0, 4, 4)]).shape == (2, RESAMPLE_POINTS, 2)
    assert resample_polygons([]).shape == (0, RESAMPLE_POINTS, 2) and not resample_polygon(np.zeros((0, 2)), 5).any()


def test_clipping_is_exact() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        polygon = blob(rng, tuple(rng.uniform(-20, 100, 2)), rng.uniform(10, 60), 15)
        clipped = clip_polygon(polygon, 80, 64)
        assert (clipped >= 0).all() and (clipped <= (80, 64)).all()
        assert (polygons_to_masks([clipped], (64, 80)) == polygons_to_masks([polygon], (64, 80))).all()
    assert clip_polygon(rectangle(-10, -10, -1, -1), 80, 64).shape == (0, 2)
    inside = rectangle(1, 2, 30, 40)
    assert np.array_equal(clip_polygon(inside, 80, 64), inside)
    assert polygon_area(clip_polygon(rectangle(-10, -10, 20, 20), 80, 64)) == 400
    batch = clip_polygons(resample_polygons([rectangle(-10, -10, 20, 20), rectangle(90, 0, 99, 9)], 50), 80, 64)
    assert batch.shape == (2, 50, 2) and np.allclose(polygon_boxes(batch)[0], [0, 0, 20, 20])
    assert not batch[1].any()  # wholly outside: a degenerate outline, which every filter drops


@pytest.mark.parametrize("seed", range(6))
def test_a_warped_outline_fills_the_warped_mask(seed: int) -> None:
    """Random affine/perspective matrices: the outline warped then filled covers the mask warped by cv2 (IoU > 0.9),
    and its box lies within the box of the warped corners (equal when nothing is clipped off)."""
    rng = np.random.default_rng(seed)
    polygons = resample_polygons([blob(rng, (60, 50), 35, 9), blob(rng, (100, 70), 25, 7)], 200)
    masks = polygons_to_masks(polygons, (100, 140))
    matrix, s = _perspective_matrix(rng, (100, 140), (120, 120), degrees=30, translate=0.2, scale=0.4, shear=8,
                                    perspective=0.0008)
    warped_masks = [cv2.warpPerspective(m, matrix, (120, 120), flags=cv2.INTER_NEAREST) for m in masks]
    labels = np.concatenate([[[0], [1]], polygon_boxes(polygons)], 1).astype(np.float32)
    out_labels, out_polygons = warp_segments(labels, polygons, matrix, s, (120, 120), area_thr=0.0)
    box_path = warp_boxes(labels, matrix, s, (120, 120))
    for label, polygon in zip(out_labels, out_polygons):
        i = int(label[0])
        assert iou(polygons_to_masks([polygon], (120, 120))[0], warped_masks[i]) > 0.9
        theirs = box_path[box_path[:, 0] == i][0, 1:]
        assert (label[1:3] >= theirs[:2] - 1e-3).all() and (label[3:5] <= theirs[2:] + 1e-3).all()


def test_warped_rectangles_have_the_box_paths_boxes() -> None:
    """Outlines that are their boxes: without rotation, shear or perspective (the default hyps) the boxes of the
    warped outlines equal the box code's, clipping included; with rotation they equal it while inside."""
    rng = np.random.default_rng(7)
    corners = rng.uniform(0, 100, (12, 2, 2))
    boxes = np.concatenate((corners.min(1), corners.max(1) + 4), 1)
    labels = np.concatenate((np.arange(12)[:, None], boxes), 1).astype(np.float32)
    polygons = resample_polygons([rectangle(*b) for b in boxes], 64)
    for _trial in range(5):
        matrix, s = _perspective_matrix(rng, (104, 104), (90, 90), 0, 0.3, 0.5, 0, 0)
        out_labels, _ = warp_segments(labels, polygons, matrix, s, (90, 90), area_thr=0.1)
        assert np.allclose(out_labels, warp_boxes(labels, matrix, s, (90, 90)), atol=1e-3)
    matrix, s = _perspective_matrix(rng, (104, 104), (400, 400), 40, 0, 0.1, 5, 0)
    rotated, _ = warp_segments(labels, polygons, matrix, s, (400, 400), area_thr=0.1)
    assert np.allclose(rotated, warp_boxes(labels, matrix, s, (400, 400)), atol=1e-3)


def test_random_perspective_moves_image_boxes_and_outlines_together() -> None:
    rng = np.random.default_rng(3)
    img = np.full((80, 96, 3), 114, np.uint8)
    polygon = blob(rng, (40, 40), 25, 8)
    img[polygons_to_masks([polygon], (80, 96))[0] > 0] = (0, 0, 255)
    labels = np.concatenate([[[0]], polygon_boxes(polygon[None])], 1).astype(np.float32)
    hyp = {"degrees": 20, "translate": 0.1, "scale": 0.3, "shear": 5, "perspective": 0.0}
    image_a, boxes_a = random_perspective(img.copy(), labels, np.random.default_rng(9), **hyp)
    image_b, labels_b, polygons_b = random_perspective_segments(img.copy(), labels, resample_polygons([polygon]),
                                                                np.random.default_rng(9), **hyp)
    assert np.array_equal(image_a, image_b) and len(labels_b) == len(polygons_b) == 1
    painted = (image_b[..., 2] > 200) & (image_b[..., 0] < 60)
    assert iou(polygons_to_masks(polygons_b, (80, 96))[0], painted) > 0.9
    assert (labels_b[0, 1:3] >= boxes_a[0, 1:3] - 1e-3).all() and (labels_b[0, 3:] <= boxes_a[0, 3:] + 1e-3).all()


def tiles(rng: np.random.Generator, count: int = 4) -> tuple[list, list, list, list]:
    """Tile images with objects painted in their own colours, their labels (normalised xywh) and outlines."""
    images, labels, outlines, colours = [], [], [], []
    for t in range(count):
        h, w = int(rng.integers(90, 120)), int(rng.integers(90, 120))
        img = np.full((h, w, 3), 30, np.uint8)
        rows, polys = [], []
        for k in range(2):
            colour = (40 + 50 * t, 100 + 70 * k, 250)
            centre_x = rng.uniform(22, w / 2 - 21) + k * w / 2  # one object in each half: they never overlap
            polygon = blob(rng, (centre_x, rng.uniform(22, h - 22)), 20, 8)
            img[polygons_to_masks([polygon], (h, w))[0] > 0] = colour
            x1, y1, x2, y2 = polygon_boxes(polygon[None])[0]
            rows.append([len(colours), (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h])
            polys.append(polygon / (w, h))
            colours.append(colour)
        images.append(img)
        labels.append(np.array(rows, np.float32))
        outlines.append(resample_polygons(polys, 300))
    return images, labels, outlines, colours


def test_the_mosaic_geometry_is_the_one_warp_mosaic_draws() -> None:
    rng = np.random.default_rng(4)
    images, labels, _, _ = tiles(rng)
    sizes = [img.shape[:2] for img in images]
    hyp = {"degrees": 15, "translate": 0.1, "scale": 0.5, "shear": 4, "perspective": 0.0}
    draws = np.random.default_rng(11)
    places, matrix, s = mosaic_geometry(sizes, 96, copy.deepcopy(draws), **hyp)
    _, boxes = warp_mosaic(images, labels, 96, draws, sizes, **hyp)
    assert np.allclose(boxes, warp_boxes(mosaic_boxes(labels, sizes, places, 96), matrix, s, (96, 96)))


@pytest.mark.parametrize("seed", range(3))
def test_mosaic_outlines_land_on_their_objects_pixels(seed: int) -> None:
    """The mosaic's own image (warp_mosaic's, unchanged) shows each object where its outline now is."""
    rng = np.random.default_rng(seed)
    images, labels, outlines, colours = tiles(rng)
    hyp = {"degrees": 10, "translate": 0.1, "scale": 0.3, "shear": 2, "perspective": 0.0}
    draws = np.random.default_rng(100 + seed)
    expected_image, _ = warp_mosaic(images, labels, 128, copy.deepcopy(draws), None, **hyp)
    img, out_labels, out_polygons = warp_mosaic_segments(images, labels, outlines, 128, draws, **hyp)
    assert np.array_equal(img, expected_image) and out_polygons.shape[1:] == (300, 2)
    assert len(out_labels) == len(out_polygons) >= 1
    for label, polygon in zip(out_labels, out_polygons):
        colour = np.array(colours[int(label[0])])
        painted = (np.abs(img.astype(int) - colour).sum(2) < 30)
        mask = polygons_to_masks([polygon], (128, 128))[0]
        if mask.sum() > 100:  # objects cut down to a sliver: too few pixels for a ratio
            assert iou(mask, painted) > 0.85
        near = cv2.dilate(mask, np.ones((3, 3), np.uint8)) > 0  # the edge pixels blend with the background
        assert (painted & near).sum() >= 0.95 * painted.sum()
        assert np.allclose(label[1:], polygon_boxes(polygon[None])[0])
    canvas = mosaic_polygons(outlines, [i.shape[:2] for i in images], mosaic_geometry(
        [i.shape[:2] for i in images], 128, np.random.default_rng(100 + seed), **hyp)[0], 128)
    assert canvas.shape == (8, 300, 2) and (canvas >= 0).all() and (canvas <= 256).all()


def test_letterbox_and_flips_follow_the_image() -> None:
    rng = np.random.default_rng(5)
    polygon = blob(rng, (70, 30), 25, 9)
    h, w = 60, 120
    mask = polygons_to_masks([polygon], (h, w))[0] * 255
    boxed, ratio, pad = letterbox(np.repeat(mask[..., None], 3, 2), 96, auto=False)
    moved = to_pixels(resample_polygons([polygon / (w, h)]), ratio[0] * w, ratio[1] * h, *pad)
    assert iou(polygons_to_masks(moved, boxed.shape[:2])[0], boxed[..., 0] > 127) > 0.93
    normalized = to_normalized(moved, boxed.shape[1], boxed.shape[0])
    assert normalized.min() >= 0 and normalized.max() <= 1
    lr = to_pixels(flip_polygons_lr(normalized), boxed.shape[1], boxed.shape[0])
    ud = to_pixels(flip_polygons_ud(normalized), boxed.shape[1], boxed.shape[0])
    base = polygons_to_masks(to_pixels(normalized, boxed.shape[1], boxed.shape[0]), boxed.shape[:2])[0]
    assert iou(polygons_to_masks(lr, boxed.shape[:2])[0], base[:, ::-1]) > 0.97
    assert iou(polygons_to_masks(ud, boxed.shape[:2])[0], base[::-1]) > 0.97
    assert np.allclose(flip_polygons_lr(flip_polygons_lr(normalized)), normalized)
    assert mixup_segments(normalized, lr[:0]).shape == normalized.shape
    assert warp_polygons(np.zeros((0, 5, 2), np.float32), np.eye(3)).shape == (0, 5, 2)


def test_copy_paste_pastes_mirrored_objects_where_they_cover_little() -> None:
    img = np.zeros((64, 96, 3), np.uint8)
    left = rectangle(5, 10, 25, 40)  # its mirror (71..91) is free: pasted
    centred = rectangle(38, 20, 58, 50)  # its mirror lands on itself (covers it all): refused
    for polygon, colour in ((left, (0, 0, 255)), (centred, (0, 255, 0))):
        img[polygons_to_masks([polygon], (64, 96))[0] > 0] = colour
    labels = np.array([[0, 5, 10, 25, 40], [1, 38, 20, 58, 50]], np.float32)
    polygons = resample_polygons([left, centred], 40)
    out, out_labels, out_polygons = copy_paste(img.copy(), labels, polygons, 1.0, np.random.default_rng(0))
    assert len(out_labels) == len(out_polygons) == 3
    assert np.allclose(out_labels[2], [0, 71, 10, 91, 40]) and np.allclose(polygon_boxes(out_polygons[2:])[0],
                                                                           [71, 10, 91, 40])
    assert (out[10:40, 71:91] == (0, 0, 255)).all() and (out[:, 91:] == 0).all()
    assert np.array_equal(out[:, :70], img[:, :70])  # nothing else changed
    same, same_labels, _ = copy_paste(img.copy(), labels, polygons, 0.0, np.random.default_rng(0))
    assert np.array_equal(same, img) and len(same_labels) == 2
