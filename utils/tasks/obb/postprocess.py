"""An oriented-box head's rows -> per-image detections (the obb task's ``postprocess`` part, called as
utils.tasks.contract.postprocess is): rotated NMS of an anchor-free head's rows, thresholds only for an end-to-end
head's final rows.

Each detection is a row (k, 11) [x1, y1, x2, y2, conf, cls, cx, cy, w, h, r] in the input's pixels, best first:
the box that encloses the oriented box (what the shared code reads as a detection's box: crops, trackers, the
tables), its confidence and class, then the oriented box itself (centre, width and height, the angle in radians,
in [0, pi/2)). NMS suppresses by ProbIoU, as ultralytics' does (utils/tasks/obb/rotated.py); the metric matches by
the exact polygon IoU (utils/tasks/obb/metric.py).
"""

from __future__ import annotations

from typing import Any

import torch

from utils.tasks.contract import OutputContract
from utils.tasks.obb.rotated import regularize, rotated_non_max_suppression, xywhr2corners

COLUMNS = 11  # enclosing box, conf, cls, then the oriented box xywhr


def unletterbox(boxes: torch.Tensor, ratio_pad: Any) -> torch.Tensor:
    """(k, 5) xywhr in the input's pixels -> the original image's, undoing its letterbox ``ratio_pad`` ((ratio_h,
    ratio_w), (pad_w, pad_h)): one gain for both sides, as letterbox keeps the aspect ratio (and scale_boxes
    reads it)."""
    ratio, pad = ratio_pad
    gain = float(ratio[0])
    out = boxes.clone()
    out[:, 0] = (boxes[:, 0] - float(pad[0])) / gain
    out[:, 1] = (boxes[:, 1] - float(pad[1])) / gain
    out[:, 2:4] = boxes[:, 2:4] / gain
    return out


def detection_rows(rotated: torch.Tensor) -> torch.Tensor:
    """(k, 7) [x, y, w, h, r, conf, cls] -> (k, 11) detections (see the module docstring)."""
    boxes = regularize(rotated[:, :5])
    corners = xywhr2corners(boxes)
    enclosing = torch.cat((corners.amin(1), corners.amax(1)), 1)
    return torch.cat((enclosing, rotated[:, 5:7], boxes), 1)


def final_rows(rows: torch.Tensor, conf_thres: float, classes: list[int] | None, max_det: int) -> torch.Tensor:
    """An end-to-end head's rows of one image (n, 7) [x, y, w, h, score, cls, r] above ``conf_thres`` and of
    ``classes``, best first, as (k, 7) [x, y, w, h, r, conf, cls]."""
    keep = rows[:, 4] > conf_thres
    if classes is not None:
        keep &= (rows[:, 5:6] == torch.tensor(classes, device=rows.device, dtype=rows.dtype)).any(1)
    rows = rows[keep]
    rows = rows[rows[:, 4].argsort(descending=True, stable=True)[:max_det]]
    return torch.cat((rows[:, :4], rows[:, 6:7], rows[:, 4:6]), 1)


def postprocess(pred: torch.Tensor, contract: OutputContract, conf_thres: float = 0.25, iou_thres: float = 0.45,
                classes: list[int] | None = None, agnostic: bool = False, multi_label: bool = False,
                max_det: int = 300, max_nms: int = 30000) -> list[torch.Tensor]:
    """Per image its detections (k, 11), best first (see the module docstring)."""
    if contract.end_to_end:
        rotated = [final_rows(image, conf_thres, classes, max_det) for image in pred]
    else:
        rotated = rotated_non_max_suppression(pred, conf_thres, iou_thres, classes, agnostic, multi_label, max_det,
                                              max_nms)
    return [detection_rows(r) for r in rotated]
