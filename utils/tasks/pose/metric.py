"""Pose metrics (the pose task's ``metric`` part, METRIC): box and keypoint P, R, mAP@.5 and mAP@.5:.95 side by side,
keypoints matched by object keypoint similarity (OKS) exactly as pycocotools' COCOeval ``keypoints`` matches them,
and predictions JSON with keypoints.

OKS of a prediction and a labelled object (COCOeval's computeOks): with d_k the distance of keypoint k from the
label's, s the object's area and sigma_k the keypoint's sigma, e_k = d_k^2 / ((2 sigma_k)^2 * (s + eps) * 2) and
OKS = the mean of exp(-e_k) over the labelled keypoints (v > 0). An object with no labelled keypoint is scored by
how far each predicted keypoint lies outside its box grown by its own size on every side, over all K; such an
object is an *ignored* label, as COCOeval ignores it (and a crowd region): it counts for no recall, and a
prediction that no other label takes but that matches it is neither a true nor a false positive. Matching and AP are
utils.evaluation.metrics' (COCOeval's greedy matching per threshold, 101-point AP), so the keypoint mAP equals
COCOeval's on the same predictions and sigmas (COCOeval judges only each image's 20 best predictions per class by
their keypoints; ``max_dets`` does the same).

The object areas are the data's (COCO JSON's ``area``) or, for YOLO labels, 0.53 of the box's area (ultralytics'
convention: COCO's person masks fill about that share of their boxes). Per-image records are plain arrays: sharded
evaluation gathers them and computes once.

METRIC is the view ``pose`` of the same detections for utils/evaluation/evaluate.py: per image ``pose_record``'s
keypoint true positives and ignored detections, from the rows' keypoint columns and the batch's ``keypoint_labels``
and ``kpt_sigmas`` (utils/tasks/pose/sample.py); crowd regions are labels without keypoints there, as COCOeval
scores them; --save-json rows gain each detection's ``keypoints``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from utils.errors import UserError
from utils.evaluation.metrics import (
    IOU_THRESHOLDS,
    DetectionMetrics,
    ap_per_class,
    ignored_detections,
    match_by_iou,
    match_predictions,
)
from utils.evaluation.task_metric import ImageContext, TaskMatch, TaskMetric, joined, weighted_fitness
from utils.tasks.pose.labels import AREA_SHARE
from utils.tasks.registry import BOX_METRICS, get_task

COCO_MAX_DETS = 20  # COCOeval's predictions per image and class for keypoints
EPS = np.spacing(1)  # COCOeval's


def _numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def object_keypoint_similarity(pred: Any, gt: Any, areas: Any, gt_boxes: Any, sigmas: Any) -> np.ndarray:
    """(n, m) OKS of predicted keypoints (n, K, >=2) with labelled ones (m, K, 3) whose objects have ``areas`` (m,)
    and boxes (m, 4) xyxy, all in one image's pixels (see the module docstring)."""
    pred, gt, areas, boxes = _numpy(pred), _numpy(gt), _numpy(areas), _numpy(gt_boxes)
    n, m = len(pred), len(gt)
    if not n or not m:
        return np.zeros((n, m))
    variances = (2 * _numpy(sigmas)) ** 2  # (K,)
    labelled = gt[..., 2] > 0  # (m, K)
    dx = pred[:, None, :, 0] - gt[None, :, :, 0]  # (n, m, K)
    dy = pred[:, None, :, 1] - gt[None, :, :, 1]
    unlabelled = ~labelled.any(1)  # objects scored by the distance outside their grown box
    if unlabelled.any():
        w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        low_x, high_x = (boxes[:, 0] - w)[None, :, None], (boxes[:, 2] + w)[None, :, None]
        low_y, high_y = (boxes[:, 1] - h)[None, :, None], (boxes[:, 3] + h)[None, :, None]
        px, py = pred[:, None, :, 0], pred[:, None, :, 1]
        outside_x = np.maximum(0, low_x - px) + np.maximum(0, px - high_x)
        outside_y = np.maximum(0, low_y - py) + np.maximum(0, py - high_y)
        dx = np.where(unlabelled[None, :, None], outside_x, dx)
        dy = np.where(unlabelled[None, :, None], outside_y, dy)
    e = (dx ** 2 + dy ** 2) / variances / (areas[None, :, None] + EPS) / 2
    counted = np.where(unlabelled[:, None], True, labelled)[None]  # (1, m, K)
    return (np.exp(-e) * counted).sum(2) / counted.sum(2)


def match_with_ignored_labels(similarity: np.ndarray, conf: np.ndarray, ignored: np.ndarray, crowd: np.ndarray,
                              iou_thresholds: np.ndarray = IOU_THRESHOLDS) -> tuple[np.ndarray, np.ndarray]:
    """(true positives, ignored detections), each bool (n, t), from an (n, m) similarity (0 across classes) where
    the labels flagged ``ignored`` count for nothing: a detection takes the best free counted label at or above the
    threshold (COCOeval's greedy order); one that takes none but reaches an ignored label is ignored; an ignored
    label takes one detection per threshold, a ``crowd`` one any number (COCOeval's rules)."""
    counted = ~ignored
    correct = match_by_iou(similarity[:, counted], conf, iou_thresholds)
    skipped = np.zeros_like(correct)
    if not ignored.any() or not len(similarity):
        return correct, skipped
    regions = similarity[:, ignored]
    crowd_of = crowd[ignored]
    for t, threshold in enumerate(np.minimum(np.asarray(iou_thresholds, np.float64), 1 - 1e-10)):
        free = np.where(correct[:, t:t + 1], 0.0, regions)  # a detection a counted label took looks no further
        if (~crowd_of).any():
            skipped[:, t] = match_by_iou(free[:, ~crowd_of], conf, [threshold])[:, 0]
        if crowd_of.any():
            skipped[:, t] |= free[:, crowd_of].max(1) >= threshold
    return correct, skipped & ~correct


@dataclass
class PoseRecord:
    """One image's part of the statistics: per detection the box and keypoint true positives and ignored flags
    (n, 10), confidence and class; the class of each label the boxes count and of each the keypoints count."""

    box_tp: np.ndarray
    box_ignored: np.ndarray
    pose_tp: np.ndarray
    pose_ignored: np.ndarray
    conf: np.ndarray
    pred_cls: np.ndarray
    target_cls: np.ndarray
    pose_target_cls: np.ndarray


def best_per_class(detections: np.ndarray, limit: int | None) -> np.ndarray:
    """Indices of the detections (n, 6) kept when each class keeps its ``limit`` best (all when None), in order."""
    if limit is None:
        return np.arange(len(detections))
    keep = []
    for cls in np.unique(detections[:, 5]):
        mine = np.nonzero(detections[:, 5] == cls)[0]
        keep.extend(mine[np.argsort(-detections[mine, 4], kind="mergesort")[:limit]])
    return np.sort(np.asarray(keep, dtype=np.int64))


def pose_record(detections: Any, pred_keypoints: Any, labels: Any, gt_keypoints: Any, sigmas: Any,
                areas: Any = None, crowd: Any = None, max_dets: int | None = None) -> PoseRecord:
    """An image's record: detections (n, 6) [x1, y1, x2, y2, conf, cls] with keypoints (n, K, >=2), labels (m, 5)
    [cls, x1, y1, x2, y2] with keypoints (m, K, 3), all in the image's pixels. ``areas`` (m,) default to AREA_SHARE
    of the boxes; ``crowd`` (m,) bool marks crowd regions (ignored by boxes and keypoints alike); ``max_dets``
    judges only each class's best detections by their keypoints, the others counting for nothing there
    (COCO_MAX_DETS: as COCOeval ``keypoints`` does); the boxes judge every detection."""
    dets, labs = _numpy(detections).reshape(-1, 6), _numpy(labels).reshape(-1, 5)
    pred = _numpy(pred_keypoints) if len(dets) else np.zeros((0, 1, 2))  # (n, K, >=2)
    gt = _numpy(gt_keypoints).reshape(len(labs), -1, 3)
    crowd = np.zeros(len(labs), bool) if crowd is None else np.asarray(crowd, bool).reshape(-1)
    if areas is None:
        areas = AREA_SHARE * (labs[:, 3] - labs[:, 1]) * (labs[:, 4] - labs[:, 2])
    kept = best_per_class(dets, max_dets)
    same_class = dets[kept, 5:6] == labs[None, :, 0]
    similarity = object_keypoint_similarity(pred[kept], gt, areas, labs[:, 1:5], sigmas) * same_class
    unlabelled = ~(gt[..., 2] > 0).any(1) if len(gt) else np.zeros(0, bool)
    pose_tp = np.zeros((len(dets), len(IOU_THRESHOLDS)), bool)
    pose_ignored = np.ones_like(pose_tp)
    pose_tp[kept], pose_ignored[kept] = match_with_ignored_labels(similarity, dets[kept, 4], unlabelled | crowd,
                                                                  crowd)
    box_tp = match_predictions(dets, labs[~crowd])
    regions = np.concatenate((labs[crowd], np.ones((int(crowd.sum()), 1))), 1)
    box_ignored = ignored_detections(dets, box_tp, regions)
    return PoseRecord(box_tp, box_ignored, pose_tp, pose_ignored, dets[:, 4], dets[:, 5], labs[~crowd, 0],
                      labs[~(unlabelled | crowd), 0])


@dataclass
class PoseMetrics:
    """Box and keypoint metrics of the same detections."""

    box: DetectionMetrics
    pose: DetectionMetrics
    extra: dict[str, Any] = field(default_factory=dict)

    def mean_results(self) -> tuple[float, ...]:
        """(box P, R, mAP@.5, mAP@.5:.95, pose P, R, mAP@.5, mAP@.5:.95)."""
        return (*self.box.mean_results(), *self.pose.mean_results())

    def fitness(self) -> float:
        """0.1 mAP@.5 + 0.9 mAP@.5:.95 of the boxes plus the same of the keypoints: how a pose model picks best.pt
        (the pose task's fitness weights, utils/tasks/registry.py)."""
        names = (*BOX_METRICS, *(f"pose_{n}" for n in BOX_METRICS))
        return weighted_fitness(get_task("pose").fitness, names, self.mean_results())


def pose_metrics(records: Sequence[PoseRecord]) -> PoseMetrics:
    """Box and keypoint metrics over every image's records (from one process, or gathered from every rank)."""
    t, r = len(IOU_THRESHOLDS), records
    conf, pred_cls = joined(r, "conf"), joined(r, "pred_cls")
    box = ap_per_class(joined(r, "box_tp", t), conf, pred_cls, joined(r, "target_cls"),
                       ignored=joined(r, "box_ignored", t))
    pose = ap_per_class(joined(r, "pose_tp", t), conf, pred_cls, joined(r, "pose_target_cls"),
                        ignored=joined(r, "pose_ignored", t))
    return PoseMetrics(box, pose)


def keypoint_json_rows(image_id: int | str, detections: Any, keypoints: Any,
                       categories: Sequence[int] | None = None) -> list[dict]:
    """COCO result rows with keypoints: ``bbox`` [x, y, w, h] from ``detections`` (n, 6) in the image's pixels, the
    ``score``, ``category_id`` (``categories[class]``, or the class) and ``keypoints`` [x1, y1, s1, ...] in the
    image's pixels (s a predicted visibility, or 1 for keypoints without one)."""
    dets, points = _numpy(detections).reshape(-1, 6), _numpy(keypoints)
    rows = []
    for (x1, y1, x2, y2, conf, cls), kpts in zip(dets.tolist(), points):
        scores = kpts[:, 2] if kpts.shape[1] > 2 else np.ones(len(kpts))
        flat = np.stack((kpts[:, 0], kpts[:, 1], scores), 1).ravel()
        cls = int(cls)
        rows.append({"image_id": image_id, "category_id": categories[cls] if categories is not None else cls,
                     "bbox": [round(v, 3) for v in (x1, y1, x2 - x1, y2 - y1)], "score": round(conf, 5),
                     "keypoints": [round(float(v), 3) for v in flat]})
    return rows


class PoseMetricError(UserError, ValueError):
    """A pose model judged on keypoints of another shape; one line."""


def to_original(points: np.ndarray, img_hw: Sequence[int], shape: Any) -> np.ndarray:
    """Keypoints (k, K, 3) in the batch's input pixels -> the original image's (undoing its letterbox ``shape``
    ((h0, w0), ((ratio_h, ratio_w), (pad_w, pad_h)))), clipped to it; visibilities as they are."""
    (h0, w0), ((ratio_h, ratio_w), (pad_w, pad_h)) = shape
    out = np.array(points, dtype=np.float64, copy=True).reshape(len(points), -1, 3)
    out[..., 0] = ((out[..., 0] - pad_w) / ratio_w).clip(0, w0)
    out[..., 1] = ((out[..., 1] - pad_h) / ratio_h).clip(0, h0)
    return out


class PoseMetric(TaskMetric):
    """The pose task's metric: the view ``pose`` (see the module docstring)."""

    views = {"pose": "keypoints"}

    def match(self, image: ImageContext) -> TaskMatch:
        objects = image.batch.get("keypoint_labels")
        if objects is None:
            return TaskMatch()
        h, w = image.img_hw
        labelled = np.array(objects[image.index], dtype=np.float64, copy=True)  # (m, K + 1, 3) normalised
        count = labelled.shape[1] - 1
        pred = image.rows[:, 6:].detach().cpu().double().numpy().reshape(len(image.rows), -1, 3)
        if pred.shape[1] != count:
            raise PoseMetricError(f"the model predicts {pred.shape[1]} keypoints per object but the data set labels "
                                  f"{count}; validate it on data of its own kpt_shape")
        labelled[:, :-1, 0] *= w
        labelled[:, :-1, 1] *= h
        gt = to_original(labelled[:, :-1], image.img_hw, image.shape)
        labs = image.labels.double().numpy().reshape(-1, 5)
        areas = labelled[:, -1, 0] * (labs[:, 3] - labs[:, 1]) * (labs[:, 4] - labs[:, 2])
        crowd = np.zeros((0, 5)) if image.ignore is None else np.asarray(image.ignore, np.float64)[:, :5]
        labs_all = np.concatenate((labs, crowd))
        gt_all = np.concatenate((gt, np.zeros((len(crowd), count, 3))))
        areas_all = np.concatenate((areas, AREA_SHARE * (crowd[:, 3] - crowd[:, 1]) * (crowd[:, 4] - crowd[:, 2])))
        is_crowd = np.arange(len(labs_all)) >= len(labs)
        predicted = to_original(pred, image.img_hw, image.shape)
        sigmas = image.batch.get("kpt_sigmas")
        record = pose_record(image.det, predicted, labs_all, gt_all,
                             np.full(count, 1.0 / count) if sigmas is None else np.asarray(sigmas, np.float64),
                             areas_all, is_crowd, max_dets=COCO_MAX_DETS)
        json = None
        if image.json:
            json = [{"keypoints": row["keypoints"]} for row in keypoint_json_rows(0, image.det, predicted)]
        return TaskMatch({"pose": record.pose_tp}, json, {"pose": record.pose_ignored},
                         {"pose": record.pose_target_cls})


METRIC = PoseMetric()
