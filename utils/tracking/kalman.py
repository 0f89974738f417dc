"""A constant-velocity Kalman filter over boxes, batched over tracks (numpy).

The state is a box and its velocity, 8 values: ``(cx, cy, a, h)`` and their rates in the ``xyah`` space (centre,
aspect ratio w/h, height; SORT's and ByteTrack's choice), or ``(cx, cy, w, h)`` and their rates in the ``xywh``
space (BoT-SORT's, where width and height move independently). The noise of each component is proportional to the
box's size (1/20 of it for positions, 1/160 for velocities: the weights of the SORT family's papers), so a large
box may move more pixels than a small one; the aspect ratio's noise is a constant.
"""

from __future__ import annotations

import numpy as np

SPACES = ("xyah", "xywh")
POSITION_WEIGHT = 1 / 20
VELOCITY_WEIGHT = 1 / 160
MIN_SIDE = 1e-3  # a box's width or height never reaches 0 (the noise is proportional to them)


def xyxy_to_measurement(boxes: np.ndarray, space: str) -> np.ndarray:
    """(n, 4) corner boxes as (n, 4) measurements of ``space``."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    w = np.maximum(boxes[:, 2] - boxes[:, 0], MIN_SIDE)
    h = np.maximum(boxes[:, 3] - boxes[:, 1], MIN_SIDE)
    cx, cy = boxes[:, 0] + w / 2, boxes[:, 1] + h / 2
    third = w / h if space == "xyah" else w
    return np.stack([cx, cy, third, h], 1)


def measurement_to_xyxy(measurements: np.ndarray, space: str) -> np.ndarray:
    """(n, 4+) states or measurements of ``space`` as (n, 4) corner boxes."""
    m = np.asarray(measurements, np.float64).reshape(len(measurements), -1)[:, :4]
    h = np.maximum(m[:, 3], MIN_SIDE)
    w = np.maximum(m[:, 2] * h if space == "xyah" else m[:, 2], MIN_SIDE)
    return np.stack([m[:, 0] - w / 2, m[:, 1] - h / 2, m[:, 0] + w / 2, m[:, 1] + h / 2], 1)


class KalmanBoxFilter:
    """Predict and correct many tracks' box states at once: ``mean`` (n, 8), ``covariance`` (n, 8, 8)."""

    def __init__(self, space: str = "xyah") -> None:
        if space not in SPACES:
            raise ValueError(f"Kalman space {space!r} is not one of {SPACES}")
        self.space = space
        self.motion = np.eye(8)
        self.motion[:4, 4:] = np.eye(4)  # one frame: position += velocity

    def _std(self, boxes: np.ndarray, weight: float, aspect_std: float) -> np.ndarray:
        """(n, 4) standard deviations of the four box components, proportional to the box's sides."""
        h = np.abs(boxes[:, 3])
        if self.space == "xyah":
            return np.stack([weight * h, weight * h, np.full_like(h, aspect_std), weight * h], 1)
        w = np.abs(boxes[:, 2])
        return np.stack([weight * w, weight * h, weight * w, weight * h], 1)

    def initiate(self, measurements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """New tracks at ``measurements`` (n, 4), at rest, with a wide velocity uncertainty."""
        measurements = np.asarray(measurements, np.float64).reshape(-1, 4)
        mean = np.concatenate([measurements, np.zeros_like(measurements)], 1)
        std = np.concatenate([self._std(measurements, 2 * POSITION_WEIGHT, 1e-2),
                              self._std(measurements, 10 * VELOCITY_WEIGHT, 1e-5)], 1)
        return mean, _diagonal(std**2)

    def predict(self, mean: np.ndarray, covariance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every track one frame ahead."""
        if not len(mean):
            return mean, covariance
        std = np.concatenate([self._std(mean[:, :4], POSITION_WEIGHT, 1e-2),
                              self._std(mean[:, :4], VELOCITY_WEIGHT, 1e-5)], 1)
        mean = mean @ self.motion.T
        covariance = self.motion @ covariance @ self.motion.T + _diagonal(std**2)
        return mean, covariance

    def project(self, mean: np.ndarray, covariance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The measurements the states predict (n, 4) and their covariance (n, 4, 4), measurement noise included."""
        std = self._std(mean[:, :4], POSITION_WEIGHT, 1e-1)
        return mean[:, :4], covariance[:, :4, :4] + _diagonal(std**2)

    def update(self, mean: np.ndarray, covariance: np.ndarray,
               measurements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each track corrected by its measurement (n, 4)."""
        if not len(mean):
            return mean, covariance
        projected, innovation_cov = self.project(mean, covariance)
        # gain (n, 8, 4) = P H^T S^-1; S and P are symmetric, so solve S X = H P and transpose
        gain = np.swapaxes(np.linalg.solve(innovation_cov, covariance[:, :4, :]), 1, 2)
        innovation = np.asarray(measurements, np.float64).reshape(-1, 4) - projected
        mean = mean + (gain @ innovation[:, :, None])[:, :, 0]
        covariance = covariance - gain @ innovation_cov @ np.swapaxes(gain, 1, 2)
        return mean, covariance

    def warp(self, mean: np.ndarray, covariance: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """States moved by a camera motion ``affine`` (2, 3): its linear part turns every (x, y)-like pair of the
        state (centre, size, their velocities), its translation moves the centre (BoT-SORT's compensation; for the
        xywh space, where both pairs are (x, y)-like)."""
        if not len(mean):
            return mean, covariance
        linear = np.asarray(affine, np.float64)[:, :2]
        block = np.kron(np.eye(4), linear)  # (8, 8): the linear part on each pair
        mean = mean @ block.T
        mean[:, :2] += np.asarray(affine, np.float64)[:, 2]
        return mean, block @ covariance @ block.T


def _diagonal(variances: np.ndarray) -> np.ndarray:
    """(n, k) variances as (n, k, k) diagonal covariances."""
    out = np.zeros((*variances.shape, variances.shape[-1]))
    idx = np.arange(variances.shape[-1])
    out[:, idx, idx] = variances
    return out
