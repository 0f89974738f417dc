"""The tracking package's numerics: the batched Kalman filter against a textbook one-track filter, IoU against
torchvision, the thresholded assignment against brute force, camera-motion estimates against known shifts."""

from __future__ import annotations

import itertools

import cv2
import numpy as np
import pytest
import torch
from torchvision.ops import box_iou

from utils.tracking.gmc import CameraMotion
from utils.tracking.kalman import KalmanBoxFilter, measurement_to_xyxy, xyxy_to_measurement
from utils.tracking.matching import appearance_cost, assign, fuse_score, iou_cost, iou_matrix


def textbook_step(filt: KalmanBoxFilter, mean: np.ndarray, cov: np.ndarray, z: np.ndarray) -> tuple:
    """One predict + update of one track written out with explicit inverses (the independent reference)."""
    F = np.eye(8)
    F[:4, 4:] = np.eye(4)
    H = np.eye(4, 8)
    m = mean[None]
    q = np.diag(np.concatenate([filt._std(m[:, :4], 1 / 20, 1e-2), filt._std(m[:, :4], 1 / 160, 1e-5)], 1)[0] ** 2)
    mean, cov = F @ mean, F @ cov @ F.T + q
    r = np.diag(filt._std(mean[None, :4], 1 / 20, 1e-1)[0] ** 2)
    s = H @ cov @ H.T + r
    k = cov @ H.T @ np.linalg.inv(s)
    return mean + k @ (z - H @ mean), (np.eye(8) - k @ H) @ cov


@pytest.mark.parametrize("space", ["xyah", "xywh"])
def test_batched_filter_equals_the_textbook_one_and_learns_a_constant_velocity(space: str) -> None:
    filt = KalmanBoxFilter(space)
    boxes = np.array([[10.0, 20, 40, 60], [100, 50, 120, 90]])
    mean, cov = filt.initiate(xyxy_to_measurement(boxes, space))
    ref = [(mean[i].copy(), cov[i].copy()) for i in range(2)]
    step = np.array([[2.0, 1.0, 2.0, 1.0], [-1.5, 0.5, -1.5, 0.5]])
    for t in range(1, 40):
        z = xyxy_to_measurement(boxes + t * step, space)
        mean, cov = filt.predict(mean, cov)
        mean, cov = filt.update(mean, cov, z)
        ref = [textbook_step(filt, m, c, z[i]) for i, (m, c) in enumerate(ref)]
    np.testing.assert_allclose(mean, np.stack([m for m, _ in ref]), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(cov, np.stack([c for _, c in ref]), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(mean[:, 4:6], step[:, :2], atol=0.05)  # the centre's velocity, pixels per frame
    predicted = measurement_to_xyxy(filt.predict(mean, cov)[0], space)
    np.testing.assert_allclose(predicted, boxes + 40 * step, atol=0.2)


def test_measurements_round_trip_and_warp_moves_the_state() -> None:
    boxes = np.array([[5.0, 6, 25, 46], [0, 0, 1, 3]])
    for space in ("xyah", "xywh"):
        np.testing.assert_allclose(measurement_to_xyxy(xyxy_to_measurement(boxes, space), space), boxes)
    filt = KalmanBoxFilter("xywh")
    mean, cov = filt.initiate(xyxy_to_measurement(boxes, "xywh"))
    mean[:, 4:6] = [1.0, 2.0]
    shift = np.array([[1.0, 0, 7], [0, 1, -3]])
    warped, warped_cov = filt.warp(mean, cov, shift)
    np.testing.assert_allclose(warped[:, :2], mean[:, :2] + [7, -3])
    np.testing.assert_allclose(warped[:, 2:], mean[:, 2:])  # a translation leaves sizes and velocities
    turn = np.array([[0.0, -1, 0], [1, 0, 0]])  # 90 degrees: (x, y) -> (-y, x), the velocity too
    np.testing.assert_allclose(filt.warp(mean, cov, turn)[0][:, 4:6], [[-2.0, 1.0], [-2.0, 1.0]])
    assert np.allclose(warped_cov, cov)


def test_iou_matches_torchvision_and_costs() -> None:
    rng = np.random.default_rng(0)
    a = np.sort(rng.uniform(0, 100, (7, 2, 2)), 1).reshape(7, 4)[:, [0, 2, 1, 3]]
    b = np.sort(rng.uniform(0, 100, (5, 2, 2)), 1).reshape(5, 4)[:, [0, 2, 1, 3]]
    expected = box_iou(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(iou_matrix(a, b), expected, atol=1e-9)
    np.testing.assert_allclose(iou_cost(a, b), 1 - expected, atol=1e-9)
    assert iou_matrix(a, np.zeros((0, 4))).shape == (7, 0)
    np.testing.assert_allclose(fuse_score(np.array([[0.2, 0.6]]), np.array([0.5, 1.0])), [[0.6, 0.6]])
    features = np.eye(3)[[0, 1]]
    np.testing.assert_allclose(appearance_cost(features, np.eye(3)), [[0, 1, 1], [1, 0, 1]])


def brute_force(cost: np.ndarray, thresh: float) -> float:
    """The least total over partial pairings where each pair costs at most ``thresh`` and each unpaired row or
    column costs thresh / 2: what ``assign`` must reach."""
    rows, cols = cost.shape
    best = (rows + cols) * thresh / 2
    for k in range(1, min(rows, cols) + 1):
        for chosen_rows in itertools.combinations(range(rows), k):
            for chosen_cols in itertools.permutations(range(cols), k):
                pairs = cost[list(chosen_rows), list(chosen_cols)]
                if (pairs <= thresh).all():
                    best = min(best, pairs.sum() + (rows + cols - 2 * k) * thresh / 2)
    return best


def test_assignment_is_optimal_and_never_pairs_above_the_threshold() -> None:
    rng = np.random.default_rng(1)
    for _ in range(30):
        cost = rng.uniform(0, 1, (int(rng.integers(1, 5)), int(rng.integers(1, 5))))
        matches, rows, cols = assign(cost, 0.6)
        assert (cost[matches[:, 0], matches[:, 1]] <= 0.6).all()
        assert sorted([*matches[:, 0], *rows]) == list(range(cost.shape[0]))
        assert sorted([*matches[:, 1], *cols]) == list(range(cost.shape[1]))
        total = cost[matches[:, 0], matches[:, 1]].sum() + (len(rows) + len(cols)) * 0.3
        assert total == pytest.approx(brute_force(cost, 0.6))


def test_assignment_keeps_the_cheap_pair_rather_than_two_dear_ones() -> None:
    """Plain assignment on the rectangle would pair (0, 1) and (1, 0) to avoid the refused (1, 1)."""
    cost = np.array([[0.1, 0.5], [0.5, 9.0]])
    matches, rows, cols = assign(cost, 0.55)
    assert matches.tolist() == [[0, 0]] and rows.tolist() == [1] and cols.tolist() == [1]
    assert [len(x) for x in assign(np.zeros((0, 3)), 0.5)] == [0, 0, 3]


def textured(seed: int, shape: tuple[int, int] = (240, 320)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = cv2.resize(rng.uniform(0, 255, (shape[0] // 8, shape[1] // 8, 3)), shape[::-1]).astype(np.uint8)
    for _ in range(60):
        x, y = int(rng.integers(0, shape[1])), int(rng.integers(0, shape[0]))
        cv2.rectangle(image, (x, y), (x + 8, y + 6), tuple(int(v) for v in rng.integers(0, 255, 3)), -1)
    return image


@pytest.mark.parametrize("method", ["sparseOptFlow", "ecc"])
def test_camera_motion_recovers_a_known_shift(method: str) -> None:
    world = textured(0, (300, 400))
    first, second = world[30:270, 40:360], world[26:266, 47:367]  # the camera moved 7 right, 4 up
    motion = CameraMotion(method)
    np.testing.assert_allclose(motion.estimate(first, np.zeros((0, 4))), np.eye(2, 3))  # the first frame
    affine = motion.estimate(second, np.zeros((0, 4)))
    np.testing.assert_allclose(affine[:, 2], [-7, 4], atol=0.5)  # a point of the first frame moved left and down
    np.testing.assert_allclose(affine[:, :2], np.eye(2), atol=0.02)


def test_camera_motion_on_large_frames_is_estimated_downscaled_in_the_frames_pixels() -> None:
    world = cv2.resize(textured(1, (300, 400)), (1600, 1200))
    motion = CameraMotion("sparseOptFlow")
    motion.estimate(world[100:1060, 100:1380], np.zeros((0, 4)))
    affine = motion.estimate(world[100:1060, 112:1392], np.zeros((0, 4)))
    assert motion.scale > 1
    np.testing.assert_allclose(affine[:, 2], [-12, 0], atol=1.5)


def test_camera_motion_without_texture_or_method_is_the_identity() -> None:
    flat = np.full((120, 160, 3), 90, np.uint8)
    motion = CameraMotion("sparseOptFlow")
    motion.estimate(flat, np.zeros((0, 4)))
    np.testing.assert_allclose(motion.estimate(flat, np.zeros((0, 4))), np.eye(2, 3))
    still = CameraMotion("none")
    still.estimate(textured(2), np.zeros((0, 4)))
    np.testing.assert_allclose(still.estimate(textured(3), np.zeros((0, 4))), np.eye(2, 3))
