"""Instance segmentation metrics: box and mask P, R, mAP@.5 and mAP@.5:.95 side by side, and predictions JSON with
RLE masks. METRIC is the segment task's metric (utils/evaluation/task_metric.py): the view ``mask`` of the same
detections, each instance's mask compared at the image's original resolution (the predicted mask cropped,
upsampled and un-letterboxed, the label's outline filled there), so the mask mAP is COCOeval ``segm``'s on the
same masks; --save-json rows then carry the masks as RLE.

A detection's mask is matched to the labels' masks exactly as its box is to their boxes (utils.evaluation.metrics:
COCOeval's greedy matching per IoU threshold, 101-point AP), with mask IoU in place of box IoU, so the mask mAP
agrees with COCOeval's ``segm`` on the same masks. The per-image records (true positives at each threshold,
confidences, classes) are plain arrays: sharded evaluation gathers them and computes once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from utils.evaluation.metrics import IOU_THRESHOLDS, DetectionMetrics, ap_per_class, match_by_iou, match_predictions
from utils.evaluation.task_metric import ImageContext, TaskMatch, TaskMetric, joined, weighted_fitness
from utils.tasks.registry import BOX_METRICS, get_task
from utils.tasks.segment.masks import mask_iou, polygons_to_masks, process_masks, rle_encode, scale_masks


def match_mask_predictions(detections: torch.Tensor | np.ndarray, pred_masks: torch.Tensor,
                           labels: torch.Tensor | np.ndarray, gt_masks: torch.Tensor,
                           iou_thresholds: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """Which detections' masks are true positives at each IoU threshold: ``detections`` (n, 6) [x1, y1, x2, y2,
    conf, cls] with masks (n, h, w), ``labels`` (m, 5) [cls, x1, y1, x2, y2] with masks (m, h, w), all at one
    resolution. Returns bool (n, len(iou_thresholds))."""
    dets = torch.as_tensor(detections).detach().cpu().double()
    labs = torch.as_tensor(labels).detach().cpu().double()
    if not len(dets) or not len(labs):
        return np.zeros((len(dets), len(iou_thresholds)), dtype=bool)
    iou = mask_iou(torch.as_tensor(pred_masks).cpu(), torch.as_tensor(gt_masks).cpu()).double().numpy()
    iou *= (dets[:, 5:6] == labs[None, :, 0]).numpy()  # only labels of the same class count
    return match_by_iou(iou, dets[:, 4].numpy(), iou_thresholds)


@dataclass
class SegmentRecord:
    """One image's part of the statistics: per detection the box and mask true positives (n, 10), confidence and
    class; the class of each label."""

    box_tp: np.ndarray
    mask_tp: np.ndarray
    conf: np.ndarray
    pred_cls: np.ndarray
    target_cls: np.ndarray


def segment_record(detections: torch.Tensor | np.ndarray, pred_masks: torch.Tensor, labels: torch.Tensor | np.ndarray,
                   gt_masks: torch.Tensor) -> SegmentRecord:
    """An image's record: its detections (n, 6) and their masks matched to its labels (m, 5) and masks, boxes and
    masks each by their own IoU."""
    dets = torch.as_tensor(detections).detach().cpu().reshape(-1, 6)
    labs = torch.as_tensor(labels).detach().cpu().reshape(-1, 5)
    return SegmentRecord(match_predictions(dets, labs), match_mask_predictions(dets, pred_masks, labs, gt_masks),
                         dets[:, 4].double().numpy(), dets[:, 5].numpy(), labs[:, 0].numpy())


@dataclass
class SegmentationMetrics:
    """Box and mask metrics of the same detections."""

    box: DetectionMetrics
    mask: DetectionMetrics
    extra: dict[str, Any] = field(default_factory=dict)

    def mean_results(self) -> tuple[float, ...]:
        """(box P, R, mAP@.5, mAP@.5:.95, mask P, R, mAP@.5, mAP@.5:.95)."""
        return (*self.box.mean_results(), *self.mask.mean_results())

    def fitness(self) -> float:
        """0.1 mAP@.5 + 0.9 mAP@.5:.95 of the boxes plus the same of the masks: how a segmenter picks best.pt (the
        segment task's fitness weights, utils/tasks/registry.py)."""
        names = (*BOX_METRICS, *(f"mask_{n}" for n in BOX_METRICS))
        return weighted_fitness(get_task("segment").fitness, names, self.mean_results())


def segmentation_metrics(records: Sequence[SegmentRecord]) -> SegmentationMetrics:
    """Box and mask metrics over every image's records (from one process, or gathered from every rank)."""
    t, r = len(IOU_THRESHOLDS), records
    conf, pred_cls, target_cls = joined(r, "conf"), joined(r, "pred_cls"), joined(r, "target_cls")
    return SegmentationMetrics(ap_per_class(joined(r, "box_tp", t), conf, pred_cls, target_cls),
                               ap_per_class(joined(r, "mask_tp", t), conf, pred_cls, target_cls))


def mask_json_rows(image_id: int | str, detections: torch.Tensor, masks: torch.Tensor | np.ndarray,
                   categories: Sequence[int] | None = None) -> list[dict]:
    """COCO result rows with masks: ``bbox`` [x, y, w, h] from ``detections`` (n, 6) in the image's pixels, the
    ``score``, ``category_id`` (``categories[class]``, or the class) and ``segmentation`` the mask's RLE at the
    image's size (``masks`` (n, h0, w0))."""
    dets = detections.detach().cpu().double()
    rles = rle_encode(masks)
    rows = []
    for (x1, y1, x2, y2, conf, cls), rle in zip(dets.tolist(), rles):
        cls = int(cls)
        rows.append({"image_id": image_id, "category_id": categories[cls] if categories is not None else cls,
                     "bbox": [round(v, 3) for v in (x1, y1, x2 - x1, y2 - y1)], "score": round(conf, 5),
                     "segmentation": rle})
    return rows


def instance_masks(rows: torch.Tensor, protos: torch.Tensor, outlines: np.ndarray, img_hw: Sequence[int],
                   shape: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's predicted masks (its detections (n, 6 + nm) in input pixels) and its labels' masks, both
    (k, h0, w0) bool at the original image's size: a prediction cropped to its box, upsampled and un-letterboxed;
    a label's outline (normalised to the batch's ``img_hw``) moved back by the letterbox's ratios and pads."""
    (h0, w0), ratio_pad = shape
    pred = scale_masks(process_masks(protos, rows[:, 6:], rows[:, :4], tuple(img_hw)), (h0, w0), ratio_pad)
    (ratio_h, ratio_w), (pad_w, pad_h) = ratio_pad
    pixels = np.asarray(outlines, np.float64) * (img_hw[1], img_hw[0])
    original = (pixels - (pad_w, pad_h)) / (ratio_w, ratio_h)
    gt = torch.from_numpy(polygons_to_masks(list(original), (int(h0), int(w0))).astype(bool))
    return pred.cpu(), gt


class SegmentMetric(TaskMetric):
    """The segment task's metric: the view ``mask`` (each detection's mask against the labels' masks), when the
    model gave prototypes and the batch its labels' ``outlines`` (a segment loader's validation batches)."""

    views = {"mask": "masks"}

    def match(self, image: ImageContext) -> TaskMatch:
        outlines = image.batch.get("outlines")
        if outlines is None or not image.outputs:
            return TaskMatch()
        pred, gt = instance_masks(image.rows, image.outputs[0][image.index], outlines[image.index], image.img_hw,
                                  image.shape)
        return TaskMatch({"mask": match_mask_predictions(image.det, pred, image.labels, gt)},
                         [{"segmentation": rle} for rle in rle_encode(pred)] if image.json else None)


METRIC = SegmentMetric()
