"""Oriented-box metrics: P, R, mAP@.5 and mAP@.5:.95 with the exact IoU of rotated boxes.

A detection is matched to the labels exactly as an axis-aligned one (utils.evaluation.metrics: COCOeval's greedy
matching per IoU threshold, 101-point AP), with the IoU of the two rotated rectangles (the area of their
intersection polygon, utils/geometry/rotated.py) in place of the box IoU. Ignore regions (DOTA's difficult
objects) are rotated boxes too: a detection no label takes that overlaps one of its class by the threshold counts
for nothing. The per-image records are plain arrays: sharded evaluation gathers them and computes once, so its
figures equal one process's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from utils.evaluation.metrics import IOU_THRESHOLDS, DetectionMetrics, ap_per_class, match_by_iou
from utils.geometry.rotated import rotated_iou

METRIC_NAMES = ("precision", "recall", "mAP_0.5", "mAP_0.5:0.95")  # the boxes' columns, as for detection


def _rows(x: torch.Tensor | np.ndarray, columns: int) -> torch.Tensor:
    return torch.as_tensor(x).detach().cpu().double().reshape(-1, columns)


def obb_overlaps(detections: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray) -> np.ndarray:
    """(n, m) exact IoU of detections (n, 7) [x, y, w, h, r, conf, cls] and labels (m, 6) [cls, x, y, w, h, r], 0
    across classes."""
    dets, labs = _rows(detections, 7), _rows(labels, 6)
    iou = rotated_iou(dets[:, :5], labs[:, 1:6]).numpy()
    return iou * (dets[:, 6:7] == labs[None, :, 0]).numpy()


def match_obb_predictions(detections: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray,
                          iou_thresholds: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """Which detections (n, 7) are true positives against labels (m, 6) at each IoU threshold: bool (n, t)."""
    dets, labs = _rows(detections, 7), _rows(labels, 6)
    if not len(dets) or not len(labs):
        return np.zeros((len(dets), len(iou_thresholds)), dtype=bool)
    return match_by_iou(obb_overlaps(dets, labs), dets[:, 5].numpy(), iou_thresholds)


def ignored_obb(detections: torch.Tensor | np.ndarray, correct: np.ndarray, regions: torch.Tensor | np.ndarray | None,
                iou_thresholds: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """Which detections count for nothing at each threshold: unmatched ones that overlap an ignore region (k, 6)
    [cls, x, y, w, h, r] of their class by at least the threshold."""
    ignored = np.zeros((len(correct), len(iou_thresholds)), dtype=bool)
    if regions is None or not len(regions) or not len(correct):
        return ignored
    overlap = obb_overlaps(detections, regions).max(1)
    return ~correct & (overlap[:, None] >= np.minimum(np.asarray(iou_thresholds), 1 - 1e-10)[None, :])


@dataclass
class ObbRecord:
    """One image's part of the statistics: per detection its true positives (n, t), whether it is ignored (n, t),
    confidence and class; the class of each label."""

    tp: np.ndarray
    ignored: np.ndarray
    conf: np.ndarray
    pred_cls: np.ndarray
    target_cls: np.ndarray


def obb_record(detections: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray,
               regions: torch.Tensor | np.ndarray | None = None) -> ObbRecord:
    """An image's record: detections (n, 7) [x, y, w, h, r, conf, cls] matched to labels (m, 6) [cls, x, y, w, h,
    r] in the same pixels, with optional ignore regions (k, 6)."""
    dets, labs = _rows(detections, 7), _rows(labels, 6)
    tp = match_obb_predictions(dets, labs)
    return ObbRecord(tp, ignored_obb(dets, tp, regions), dets[:, 5].numpy(), dets[:, 6].numpy(), labs[:, 0].numpy())


def obb_metrics(records: Sequence[ObbRecord]) -> DetectionMetrics:
    """The metrics over every image's records (from one process, or gathered from every rank)."""
    t = len(IOU_THRESHOLDS)

    def joined(name: str, columns: int | None = None) -> np.ndarray:
        arrays = [getattr(r, name) for r in records]
        return np.concatenate(arrays, 0) if arrays else np.zeros((0, columns) if columns else 0)

    return ap_per_class(joined("tp", t), joined("conf"), joined("pred_cls"), joined("target_cls"),
                        ignored=joined("ignored", t))


def fitness(metrics: DetectionMetrics) -> float:
    """0.1 mAP@.5 + 0.9 mAP@.5:.95, the boxes' fitness."""
    _, _, map50, map50_95 = metrics.mean_results()
    return 0.1 * map50 + 0.9 * map50_95
