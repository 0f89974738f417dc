"""Costs between tracks and detections, and the assignment that pairs them (scipy's Hungarian solver).

Costs are distances in [0, 1]: ``1 - IoU`` of boxes, the same weighed by the detection's confidence (ByteTrack's
score fusion), ``1 - cosine`` of appearance features. ``assign`` pairs rows and columns at the least total cost
where a pair costs at most the threshold, leaving a row or column unpaired rather than pairing it above it.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

_REFUSED = 1e6  # the cost of a pair above the threshold: never chosen over leaving both unpaired


def iou_matrix(boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    """(n, m) IoU of corner boxes (n, 4) and (m, 4)."""
    a = np.asarray(boxes1, np.float64).reshape(-1, 4)
    b = np.asarray(boxes2, np.float64).reshape(-1, 4)
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    left_top = np.maximum(a[:, None, :2], b[None, :, :2])
    right_bottom = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(right_bottom - left_top, 0, None).prod(2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def iou_cost(track_boxes: np.ndarray, det_boxes: np.ndarray) -> np.ndarray:
    """(n, m) ``1 - IoU``."""
    return 1.0 - iou_matrix(track_boxes, det_boxes)


def fuse_score(cost: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """An IoU cost weighed by each detection's confidence: ``1 - IoU * conf`` (a sure detection pairs first)."""
    if not cost.size:
        return cost
    return 1.0 - (1.0 - cost) * np.asarray(scores, np.float64)[None, :]


def appearance_cost(track_features: np.ndarray, det_features: np.ndarray) -> np.ndarray:
    """(n, m) ``1 - cosine`` of L2-normalised features, clipped to [0, 1]."""
    if not len(track_features) or not len(det_features):
        return np.zeros((len(track_features), len(det_features)))
    return np.clip(1.0 - np.asarray(track_features) @ np.asarray(det_features).T, 0.0, 1.0)


def assign(cost: np.ndarray, thresh: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(matches (k, 2) of (row, column), unmatched rows, unmatched columns): the least-cost pairing in which every
    pair costs at most ``thresh``. Solved on the square matrix where leaving a row or a column unpaired costs
    ``thresh / 2`` each, so a pair is taken exactly when it is cheaper than leaving both unpaired, and the solver is
    never forced into a worse pair to keep another one (as plain assignment on the rectangle would be)."""
    rows, cols = cost.shape
    if not rows or not cols:
        return np.zeros((0, 2), int), np.arange(rows), np.arange(cols)
    square = np.full((rows + cols, rows + cols), thresh / 2)
    square[:rows, :cols] = np.where(cost <= thresh, cost, _REFUSED)
    square[rows:, cols:] = 0.0
    row_ind, col_ind = linear_sum_assignment(square)
    pairs = (row_ind < rows) & (col_ind < cols)
    matches = np.stack([row_ind[pairs], col_ind[pairs]], 1)
    matches = matches[cost[matches[:, 0], matches[:, 1]] <= thresh]
    unmatched_rows = np.setdiff1d(np.arange(rows), matches[:, 0])
    unmatched_cols = np.setdiff1d(np.arange(cols), matches[:, 1])
    return matches.astype(int), unmatched_rows, unmatched_cols
