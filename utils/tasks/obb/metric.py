"""The obb task's metric: P, R, mAP@.5 and mAP@.5:.95 with the exact IoU of rotated boxes (its ``metric`` part).

The shared evaluation (utils/evaluation/evaluate.py) matches each image's detections to its labels as it matches
boxes (COCOeval's greedy matching per IoU threshold, 101-point AP, the confusion matrix at IoU 0.45), reading the
overlaps this metric gives (``TaskMatch.overlaps``): the IoU of the two rotated rectangles, the area of their
intersection polygon (utils/tasks/obb/rotated.py), in the image's original pixels. The results.csv columns are the
boxes' (``precision``, ``recall``, ``mAP_0.5``, ``mAP_0.5:0.95``), as ultralytics' OBB columns are. Sharded
evaluation gathers the per-image records and computes once, so its figures equal one process's. With --save-json
each detection's row also holds ``rbox`` [cx, cy, w, h, r] and ``poly`` (its 8 corner coordinates), in original
pixels.
"""

from __future__ import annotations

import numpy as np
import torch

from utils.evaluation.task_metric import ImageContext, TaskMatch, TaskMetric
from utils.tasks.obb.postprocess import unletterbox
from utils.tasks.obb.rotated import corners2xywhr, rotated_iou, xywhr2corners


def _rows(x: torch.Tensor | np.ndarray, columns: int) -> torch.Tensor:
    return torch.as_tensor(x).detach().cpu().double().reshape(-1, columns)


def label_boxes(image: ImageContext) -> torch.Tensor:
    """The image's labels as rotated boxes (m, 5) xywhr in its original pixels, from the batch's corners
    (``quads``, normalised to the batch's size)."""
    corners = torch.as_tensor(np.asarray(image.batch["quads"][image.index], np.float64)).reshape(-1, 4, 2)
    pixels = corners * corners.new_tensor([image.img_hw[1], image.img_hw[0]])
    if not len(pixels):
        return torch.zeros((0, 5), dtype=torch.float64)
    return unletterbox(corners2xywhr(pixels), image.shape[1])


class ObbMetric(TaskMetric):
    """The overlaps of an image's oriented detections and labels (see the module docstring)."""

    def match(self, image: ImageContext) -> TaskMatch:
        detections = unletterbox(_rows(image.rows[:, 6:11], 5), image.shape[1])
        labels = label_boxes(image)
        overlaps = rotated_iou(detections, labels).numpy() if len(detections) and len(labels) else \
            np.zeros((len(detections), len(labels)))
        json = None
        if image.json:
            corners = xywhr2corners(detections).reshape(-1, 8)
            json = [{"rbox": [round(float(v), 3) for v in box[:4]] + [round(float(box[4]), 5)],
                     "poly": [round(float(v), 3) for v in quad]} for box, quad in zip(detections, corners)]
        return TaskMatch(json=json, overlaps=overlaps)


METRIC = ObbMetric()
