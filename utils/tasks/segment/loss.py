"""The segment task's losses, to the LossFn interface of utils/training/families.py: each family's detection loss
with the mask term (utils/tasks/segment/mask_loss.py) beside it, read from the same assignment.

``YoloV5SegmentLoss`` (YOLOv5-seg): YOLOv5's box, objectness and class terms on the Segment head's maps (the class
scores are the columns before the mask coefficients); each level's positives add their mask term, averaged per
image and summed over images and levels, times ``hyp["box"]`` over the batch size. Terms: box, seg, obj, cls.

``AnchorFreeSegmentLoss`` (YOLOv8-seg, YOLO11-seg): the anchor-free loss; the cells the task-aligned assigner made
positives add their mask term, summed and divided by their count, times ``hyp["box"]``. Terms: box, seg, cls, dfl.

Both are called ``loss(preds, targets, masks)``: ``masks`` is the batch's masks as the segment collate builds them
(utils.data.datasets: one index image per image with the targets in its order, or one mask per target with
``overlap=False``); the total is the terms' sum times the batch size, as the detection losses'.
"""

from __future__ import annotations

import torch
from torch import nn

from utils.tasks.segment.mask_loss import anchor_free_mask_loss, object_indices, yolov5_mask_loss
from utils.training.loss import ComputeLoss
from utils.training.loss_anchor_free import AnchorFreeLoss


class YoloV5SegmentLoss(ComputeLoss):
    """See the module docstring. ``preds`` is the Segment head's training output: (maps, protos)."""

    names = ("box", "seg", "obj", "cls")

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 640, label_smoothing: float = 0.0,
                 overlap: bool = True) -> None:
        super().__init__(model, hyp, img_size, label_smoothing)
        self.mask_gain, self.overlap = float(hyp["box"]), overlap
        self.first_coefficient = 5 + self.num_classes

    def __call__(self, preds: tuple[list[torch.Tensor], torch.Tensor], targets: torch.Tensor,
                 masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        maps, protos = preds
        targets = targets.to(maps[0].device)
        positives: list = []
        loss_box, loss_obj, loss_cls = self.detection_terms(maps, targets, positives)
        mask_index = object_indices(targets[:, 0], self.overlap)
        levels = [{"image": match.image, "coefficients": cells[:, self.first_coefficient:].float(),
                   "index": mask_index[match.target], "xywh": targets[match.target, 2:6]}
                  for match, cells in positives]
        batch_size = maps[0].shape[0]
        loss_seg = yolov5_mask_loss(protos.float(), levels, masks.to(protos.device), self.overlap).view(1) \
            * (self.mask_gain / batch_size)
        return (loss_box + loss_seg + loss_obj + loss_cls) * batch_size, \
            torch.cat((loss_box, loss_seg, loss_obj, loss_cls)).detach()


class AnchorFreeSegmentLoss(AnchorFreeLoss):
    """See the module docstring. ``preds`` is the anchor-free Segment head's training output: (the detection
    head's dict, coefficients (b, nm, n), protos (b, nm, h, w))."""

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 640, label_smoothing: float = 0.0,
                 overlap: bool = True) -> None:
        super().__init__(model, hyp, img_size, label_smoothing)
        box, cls, side = self.names
        self.names = (box, "seg", cls, side)
        self.overlap = overlap

    def __call__(self, preds: tuple, targets: torch.Tensor,
                 masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        detection, coefficients, protos = preds
        targets = targets.to(protos.device)
        terms, assigned, image_hw = self.assigned_terms(detection, targets)
        seg = anchor_free_mask_loss(protos.float(), coefficients.float().transpose(1, 2), assigned.foreground,
                                    assigned.gt_index, assigned.boxes, (image_hw[0], image_hw[1]),
                                    masks.to(protos.device), targets[:, 0], self.overlap)
        items = torch.cat((terms[:1], (seg * self.gains[0]).view(1), terms[1:]))
        return items.sum() * protos.shape[0], items.detach()
