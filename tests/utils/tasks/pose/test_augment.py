"""utils/tasks/pose/augment.py: keypoints through letterbox, affine and perspective matrices, mosaic placement,
flips with a flip index and mixup, checked against hand-computed positions, against the box code's own draws (the
one pipeline's random_perspective_extras and warp_mosaic_extras moving KeypointGeometry's extras), and against the
pixels: a drawn figure's keypoints still lie on its painted pixels after a random warp."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from utils.data.augment import (
    _perspective_matrix,
    letterbox,
    mosaic_layout,
    random_perspective,
    random_perspective_extras,
    warp_mosaic,
    warp_mosaic_extras,
)
from utils.tasks.pose.augment import (
    KeypointGeometry,
    flip_keypoints_lr,
    flip_keypoints_ud,
    hide_outside,
    keypoints_to_normalized,
    keypoints_to_pixels,
    mosaic_keypoints,
    warp_keypoints,
    warp_pose,
)
from utils.tasks.pose.synthetic import Figure, draw_figure, figure_keypoints

UNLABELLED = [0.0, 0.0, 0.0]


def with_rows(keypoints: np.ndarray, share: float = 0.5) -> np.ndarray:
    """Keypoints (k, K, 3) as the Geometry's extras: each object's area-share row appended (k, K + 1, 3)."""
    rows = np.tile(np.array([[[share, 0.0, 0.0]]], np.float32), (len(keypoints), 1, 1))
    return np.concatenate((keypoints, rows), 1)


def random_perspective_pose(img, labels, keypoints, rng, **options):
    """The pipeline's warp of an image with keypoints (their area rows kept with them)."""
    image, kept, extras = random_perspective_extras(img, labels, with_rows(keypoints), KeypointGeometry(), rng,
                                                    **options)
    assert np.all(extras[:, -1] == [0.5, 0.0, 0.0])
    return image, kept, extras[:, :-1]


def test_letterbox_moves_keypoints_with_the_pixels() -> None:
    """A 100 x 50 image letterboxed to 64: scale 0.64, 16 px of padding on top; the keypoint at the centre of pixel
    (50, 12), (50.5, 12.5) = (0.505, 0.25) normalised, lands at (32.32, 24), where its pixel went."""
    img = np.zeros((50, 100, 3), np.uint8)
    img[11:14, 49:52] = 255  # a 3 x 3 block around it
    out, ratio, pad = letterbox(img, 64, auto=False)
    assert ratio == (0.64, 0.64) and pad == (0.0, 16.0)
    points = np.array([[[0.505, 0.25, 2.0], UNLABELLED]], np.float32)
    moved = keypoints_to_pixels(points, ratio[0] * 100, ratio[1] * 50, *pad)
    assert np.allclose(moved, [[[32.32, 24.0, 2.0], UNLABELLED]], atol=1e-5)
    brightest = np.unravel_index(out[16:48, :, 0].argmax(), (32, 64))  # (row, column) of the block's centre
    assert abs(brightest[0] + 16 + 0.5 - 24.0) <= 1 and abs(brightest[1] + 0.5 - 32.32) <= 1
    assert np.allclose(keypoints_to_normalized(moved, 64, 64), [[[0.505, 0.375, 2.0], UNLABELLED]])


def test_affine_and_perspective_matrices_by_hand() -> None:
    points = np.array([[[10.0, 20.0, 2.0], [10.0, 150.0, 1.0], UNLABELLED]], np.float32)
    quarter_turn = np.array([[0.0, -1.0, 100.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # (x, y) -> (100 - y, x)
    turned = warp_keypoints(points, quarter_turn)
    assert turned.tolist() == [[[80.0, 10.0, 2.0], [-50.0, 10.0, 1.0], UNLABELLED]]
    assert hide_outside(turned, 128, 128).tolist() == [[[80.0, 10.0, 2.0], UNLABELLED, UNLABELLED]]
    perspective = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.01, 0.0, 1.0]])  # w = 1 + 0.01 x
    assert warp_keypoints(points[:, :1], perspective)[0, 0].tolist() == pytest.approx([10 / 1.1, 20 / 1.1, 2.0])


def test_warp_pose_keeps_each_object_with_its_keypoints() -> None:
    """Three objects shifted 50 px left in a 100 px image: the first leaves the image and is dropped, the others
    keep their own keypoints; one keypoint that left the image is made unlabelled."""
    labels = np.array([[0, 10, 10, 40, 40], [1, 60, 10, 90, 40], [2, 55, 50, 95, 90]], np.float32)
    keypoints = np.array([[[20, 20, 2]], [[70, 30, 2]], [[45, 60, 1]]], np.float32)
    shift = np.array([[1.0, 0, -50], [0, 1, 0], [0, 0, 1]])
    kept, moved, rows = warp_pose(labels, keypoints, shift, 1.0, (100, 100))
    assert kept[:, 0].tolist() == [1, 2] and kept[:, 1:].tolist() == [[10, 10, 40, 40], [5, 50, 45, 90]]
    assert moved.tolist() == [[[20, 30, 2]], [UNLABELLED]]  # object 2's keypoint at x -5: gone
    assert rows.tolist() == [1, 2]
    shares = with_rows(keypoints)
    shares[:, -1, 0] = [0.1, 0.2, 0.3]
    kept_b, extras = KeypointGeometry().warp(labels, shares, shift, 1.0, (100, 100))
    assert np.array_equal(kept_b, kept) and extras[:, -1, 0].tolist() == pytest.approx([0.2, 0.3])


def test_random_perspective_pose_makes_the_box_codes_draws() -> None:
    rng = np.random.default_rng(3)
    img = np.zeros((80, 120, 3), np.uint8)
    labels = np.array([[0, 20, 20, 60, 70], [1, 70, 10, 110, 50]], np.float32)
    keypoints = np.array([[[30, 30, 2], [50, 60, 1]], [[80, 20, 2], UNLABELLED]], np.float32)
    options = dict(degrees=15, translate=0.1, scale=0.3, shear=5, perspective=0.0005)
    image_a, boxes = random_perspective(img, labels, copy.deepcopy(rng), **options)
    matrix, _ = _perspective_matrix(copy.deepcopy(rng), (80, 120), (80, 120), 15, 0.1, 0.3, 5, 0.0005)
    image_b, boxes_b, moved = random_perspective_pose(img, labels, keypoints, rng, **options)
    assert np.array_equal(image_a, image_b) and np.array_equal(boxes, boxes_b)
    expected = hide_outside(warp_keypoints(keypoints, matrix), 120, 80)
    assert len(boxes) == 2 and np.allclose(moved, expected)
    assert moved[1, 1].tolist() == UNLABELLED


def test_mosaic_places_and_cuts_keypoints() -> None:
    """Each tile's keypoint (0.5, 0.5) lands at its tile's centre on the canvas (offset x1a - x1b); a keypoint in
    the part of a tile the canvas crops is made unlabelled."""
    size = 64
    sizes = [(40, 60), (70, 30), (50, 50), (90, 100)]
    places = mosaic_layout(sizes, size, np.random.default_rng(0))
    centre = [np.array([[[0.5, 0.5, 2.0]]], np.float32) for _ in sizes]
    placed = mosaic_keypoints(centre, sizes, places, size)
    for point, (h, w), p in zip(placed, sizes, places):
        x, y = 0.5 * w + p.x1a - p.x1b, 0.5 * h + p.y1a - p.y1b
        inside = p.x1a <= x <= p.x2a and p.y1a <= y <= p.y2a
        assert point[0].tolist() == ([x, y, 2.0] if inside else UNLABELLED)
    corner = [np.array([[[0.0001, 0.0001, 2.0]]], np.float32)] + [np.zeros((0, 1, 3), np.float32)] * 3
    top_left = mosaic_keypoints(corner, sizes, places, size)[0, 0]
    cropped = places[0].x1b > 0 or places[0].y1b > 0  # tile 0 is cropped at its top-left when it crosses the edge
    assert (top_left.tolist() == UNLABELLED) == cropped


def test_warp_mosaic_pose_follows_warp_mosaic() -> None:
    """Without rotation, shear, scale or translation the mosaic's output is the canvas moved by (-s/2, -s/2): the
    keypoints too; the image and boxes are warp_mosaic's."""
    size, rng = 64, np.random.default_rng(5)
    images = [np.full((h, w, 3), 40 * i, np.uint8) for i, (h, w) in enumerate([(40, 60), (70, 30), (50, 50),
                                                                                (64, 64)])]
    labels = [np.array([[i, 0.5, 0.5, 0.5, 0.5]], np.float32) for i in range(4)]
    keypoints = [np.array([[[0.5, 0.5, 2.0]]], np.float32) for _ in range(4)]
    options = dict(degrees=0, translate=0, scale=0, shear=0)
    image, boxes = warp_mosaic(images, labels, size, copy.deepcopy(rng), **options)
    places = mosaic_layout([img.shape[:2] for img in images], size, copy.deepcopy(rng))
    image_b, boxes_b, moved = warp_mosaic_extras(images, labels, [with_rows(k) for k in keypoints],
                                                 KeypointGeometry(), size, rng, **options)
    moved = moved[:, :-1]
    assert np.array_equal(image, image_b) and np.array_equal(boxes, boxes_b)
    for cls, point in zip(boxes[:, 0].astype(int), moved):
        (h, w), p = images[cls].shape[:2], places[cls]
        expected = [0.5 * w + p.x1a - p.x1b - size / 2, 0.5 * h + p.y1a - p.y1b - size / 2, 2.0]
        inside = 0 <= expected[0] <= size and 0 <= expected[1] <= size
        assert np.allclose(point[0], expected if inside else UNLABELLED)


def test_flips_with_the_flip_index() -> None:
    """Left-right: x -> 1 - x and keypoint i takes keypoint flip_index[i]'s place (a left eye becomes the right
    eye); up-down: y -> 1 - y in place. Unlabelled keypoints stay 0 0 0."""
    points = np.array([[[0.2, 0.3, 2.0], [0.7, 0.4, 1.0], UNLABELLED]], np.float32)
    assert np.allclose(flip_keypoints_lr(points, (1, 0, 2)), [[[0.3, 0.4, 1.0], [0.8, 0.3, 2.0], UNLABELLED]])
    assert np.allclose(flip_keypoints_ud(points), [[[0.2, 0.7, 2.0], [0.7, 0.6, 1.0], UNLABELLED]])
    twice = flip_keypoints_lr(flip_keypoints_lr(points, (1, 0, 2)), (1, 0, 2))
    assert np.allclose(twice, points)
    geometry = KeypointGeometry((1, 0, 2))
    assert np.allclose(geometry.flip_lr(with_rows(points))[:, :-1], flip_keypoints_lr(points, (1, 0, 2)))
    assert np.allclose(KeypointGeometry().flip_lr(with_rows(points))[0, 0], [0.8, 0.3, 2.0])  # no flip_idx: in place
    assert geometry.join(with_rows(points), with_rows(points[:, ::-1])).shape == (2, 4, 3)


def test_a_drawn_figures_keypoints_stay_on_its_pixels_through_a_random_warp() -> None:
    """A white figure on black, warped by random rotations, shears, scales and perspective: every keypoint that is
    still labelled lands on a painted pixel of the warped image."""
    canvas = np.zeros((160, 160, 3), np.uint8)
    points = figure_keypoints(np.random.default_rng(0), 80, 80, 110)
    draw_figure(canvas, Figure(points, 110.0, 5, 9.0, (255, 255, 255)))
    keypoints = np.concatenate(((points + 0.5)[None], np.full((1, 17, 1), 2.0)), 2).astype(np.float32)
    labels = np.array([[0, *(points.min(0) - 5), *(points.max(0) + 5)]], np.float32)
    for seed in range(6):
        image, kept, moved = random_perspective_pose(canvas, labels, keypoints, np.random.default_rng(seed),
                                                     degrees=30, translate=0.2, scale=0.4, shear=10,
                                                     perspective=0.0008)
        for x, y, v in moved.reshape(-1, 3):
            if v > 0:
                assert image[int(y), int(x)].max() >= 128, (seed, x, y)
