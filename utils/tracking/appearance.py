"""Appearance features for BoT-SORT's ``with_reid``: each box's colour histogram (hue, saturation, value), a small
L2-normalised vector compared by cosine. No ReID network: the features need no weights and cost a few microseconds
a box; they tell apart objects of different colours, not two people in the same clothes.
"""

from __future__ import annotations

import cv2
import numpy as np

BINS = (8, 4, 4)  # hue, saturation, value
SIZE = int(np.prod(BINS))
SMOOTHING = 0.9  # a track's feature: this much of its past, the rest of its newest box (an exponential average)


def box_features(frame_bgr: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """(n, SIZE) unit-length HSV histograms of the (n, 4) corner boxes' pixels (zeros for an empty crop)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    out = np.zeros((len(boxes), SIZE), np.float64)
    height, width = frame_bgr.shape[:2]
    for i, (x1, y1, x2, y2) in enumerate(boxes):
        x1, y1 = int(np.clip(x1, 0, width)), int(np.clip(y1, 0, height))
        x2, y2 = int(np.clip(np.ceil(x2), 0, width)), int(np.clip(np.ceil(y2), 0, height))
        if x2 <= x1 or y2 <= y1:
            continue
        hsv = cv2.cvtColor(np.ascontiguousarray(frame_bgr[y1:y2, x1:x2]), cv2.COLOR_BGR2HSV)
        hist = cv2.calcHist([hsv], [0, 1, 2], None, list(BINS), [0, 180, 0, 256, 0, 256]).reshape(-1)
        out[i] = normalised(hist)
    return out


def normalised(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return np.asarray(vector, np.float64) / norm if norm > 0 else np.zeros_like(vector, np.float64)


def smoothed(previous: np.ndarray | None, new: np.ndarray) -> np.ndarray:
    """A track's feature after a new box: the exponential average of its features, unit length again."""
    return new if previous is None or not previous.any() else normalised(SMOOTHING * previous + (1 - SMOOTHING) * new)
