"""The losses of the anchor-free families, to the LossFn interface of utils/training/families.py.

``AnchorFreeLoss`` (YOLOv8, YOLO11): cells assigned by the task-aligned assigner (utils/training/tal.py, top 10,
alpha 0.5, beta 6); a BCE class loss against the soft targets over every cell; for the assigned cells a CIoU box
loss and the distribution focal loss (DFL) of each side's bins, both weighted by the cell's target score; each
normalised by the sum of target scores (over every rank's batch under DDP: utils.distributed.loss_share) and
scaled by its gain (hyp ``box`` 7.5, ``cls`` 0.5, ``dfl`` 1.5). A head
with one value per side (``reg_max`` 1) has an L1 loss on the sides (normalised by the image size) in the DFL's
place, under the ``dfl`` gain. ``total`` is the gained sum times the batch size (as YOLOv5's loss), ``items`` the
three gained terms.

``EndToEndLoss`` (YOLO26, as ultralytics 8.4 defines it): the same loss on both sets of branches, the one-to-many
with top 10 cells per box, the one-to-one with top 7 narrowed to the single best (``topk2`` 1); the total is
``o2m * one-to-many + o2o * one-to-one`` where ``o2m`` falls linearly from 0.8 at the first epoch to 0.1 at the
last and ``o2o = 1 - o2m`` (``set_epoch``); ``items`` are the one-to-one terms.

Predictions are the heads' train-mode dicts (models/head_anchor_free.py); targets the (n, 6) rows
[image, class, cx, cy, w, h] normalised to the input image.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from utils.boxes import bbox_iou
from utils.distributed.loss_share import LossShare
from utils.training.tal import Assignment, TaskAlignedAssigner, bbox2dist, dist2bbox

ALPHA, BETA = 0.5, 6.0  # the task-aligned metric: score ** alpha * ciou ** beta


class AnchorFreeLoss:
    """See the module docstring. ``label_smoothing`` moves that share of each foreground cell's class target
    evenly over all classes; ``img_size`` is accepted for the loss factory's interface (the gains do not scale)."""

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 640, label_smoothing: float = 0.0,
                 topk: int = 10, topk2: int | None = None) -> None:
        head = model.head  # the de-paralleled model's
        self.nc, self.reg_max = int(head.nc), int(head.reg_max)
        self.gains = (float(hyp["box"]), float(hyp["cls"]), float(hyp["dfl"]))
        self.strides = [float(s) for s in head.stride]
        self.assigner = TaskAlignedAssigner(topk, self.nc, ALPHA, BETA, strides=self.strides, topk2=topk2)
        self.label_smoothing = float(label_smoothing)
        self.names: tuple[str, ...] = ("box", "cls", "dfl") if self.reg_max > 1 else ("box", "cls", "l1")
        self.bins = torch.arange(self.reg_max, dtype=torch.float32)

    def __call__(self, preds: dict[str, Any], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        terms = self.terms(preds, targets)
        batch_size = preds["scores"].shape[0]
        return terms.sum() * batch_size, terms.detach()

    def terms(self, preds: dict[str, Any], targets: torch.Tensor) -> torch.Tensor:
        """The three gained loss terms (box, cls, dfl or l1) of one set of branches, (3,)."""
        return self.assigned_terms(preds, targets)[0]

    def assigned_terms(self, preds: dict[str, Any],
                       targets: torch.Tensor) -> tuple[torch.Tensor, Assignment, list[float]]:
        """``terms`` with the assignment they came from and the input's (h, w) in pixels (for a task's own terms,
        the masks of utils.tasks.segment.loss)."""
        # (b, n, 4 * reg_max) and (b, n, nc), float32 under autocast too; copied cell-major once, so that the
        # softmax over each side's bins and the gathers below read contiguous rows
        pred_dist = preds["boxes"].permute(0, 2, 1).to(torch.float32, memory_format=torch.contiguous_format)
        logits = preds["scores"].permute(0, 2, 1).to(torch.float32, memory_format=torch.contiguous_format)
        points, strides = preds["anchor_points"], preds["stride_tensor"]  # (n, 2) grid units, (n, 1)
        b = logits.shape[0]
        image_hw = [size * self.strides[0] for size in preds["feature_sizes"][0]]
        gt_labels, gt_boxes, mask_gt = self.targets_by_image(targets.to(logits.device), b, image_hw)
        with torch.no_grad():  # the assigner reads every cell's box; the loss differentiates the assigned ones'
            pred_boxes = self.decode(points, pred_dist)  # (b, n, 4) xyxy, grid units
        assigned = self.assigner(logits.detach().sigmoid(), (pred_boxes * strides).to(gt_boxes.dtype),
                                 points * strides, gt_labels, gt_boxes, mask_gt)
        target_scores = self.smoothed(assigned)
        score_sum = LossShare([target_scores.sum()]).divisor(0, floor=1)  # summed over the ranks under DDP
        cls = F.binary_cross_entropy_with_logits(logits, target_scores.to(logits.dtype), reduction="none").sum() \
            / score_sum
        box, side = self.box_terms(pred_dist, points, strides, assigned, target_scores, score_sum, image_hw)
        gain_box, gain_cls, gain_side = self.gains
        return torch.stack((box * gain_box, cls * gain_cls, side * gain_side)), assigned, image_hw

    def decode(self, points: torch.Tensor, pred_dist: torch.Tensor) -> torch.Tensor:
        """(..., 4 * reg_max) side distributions of cells at ``points`` (..., 2) -> (..., 4) xyxy boxes in grid
        units."""
        if self.reg_max > 1:
            bins = self.bins.to(device=pred_dist.device, dtype=pred_dist.dtype)
            pred_dist = pred_dist.reshape(*pred_dist.shape[:-1], 4, self.reg_max).softmax(-1) @ bins
        return dist2bbox(pred_dist, points, xywh=False)

    def smoothed(self, assigned: Assignment) -> torch.Tensor:
        scores = assigned.scores
        if self.label_smoothing > 0:
            eps = self.label_smoothing
            scores = scores * (1 - eps) + scores.sum(-1, keepdim=True) * (eps / self.nc)
        return scores

    def box_terms(self, pred_dist: torch.Tensor, points: torch.Tensor, strides: torch.Tensor, assigned: Assignment,
                  target_scores: torch.Tensor, score_sum: torch.Tensor,
                  image_hw: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
        """(CIoU loss, DFL or L1 loss) of the foreground cells, each weighted by its target score."""
        fg = assigned.foreground
        weight = target_scores.sum(-1)[fg]  # (f,)
        target_boxes = assigned.boxes / strides  # grid units
        fg_dist = pred_dist[fg]  # (f, 4 * reg_max): indexed once, one gradient buffer for the box and side terms
        pred_boxes = self.decode(points.expand(fg.shape[0], -1, -1)[fg], fg_dist)  # (f, 4): only these
        iou = bbox_iou(pred_boxes, target_boxes[fg], xywh=False, kind="ciou")
        box = ((1.0 - iou) * weight).sum() / score_sum
        if self.reg_max > 1:
            target_sides = bbox2dist(points, target_boxes, self.reg_max - 1)[fg]  # (f, 4)
            side = (distribution_focal_loss(fg_dist.reshape(-1, self.reg_max), target_sides.reshape(-1))
                    .view(-1, 4).mean(-1) * weight).sum() / score_sum
            return box, side
        scale = strides.new_tensor([image_hw[1], image_hw[0], image_hw[1], image_hw[0]])
        target_sides = bbox2dist(points, target_boxes) * strides / scale
        pred_sides = pred_dist * strides / scale
        side = (F.l1_loss(pred_sides[fg], target_sides[fg], reduction="none").mean(-1) * weight).sum() / score_sum
        return box, side

    @staticmethod
    def targets_by_image(targets: torch.Tensor, batch_size: int,
                         image_hw: list[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(n, 6) normalised rows -> per image, padded to the most boxes of an image: labels (b, m, 1), boxes
        (b, m, 4) xyxy in pixels, and which rows are boxes (b, m, 1)."""
        device = targets.device
        order, image, slot, most = AnchorFreeLoss.image_slots(targets[:, 0], batch_size)
        rows = targets[order]
        scale = torch.tensor([image_hw[1], image_hw[0]], device=device, dtype=targets.dtype)
        centre, size = rows[:, 2:4] * scale, rows[:, 4:6] * scale
        labels = torch.zeros((batch_size, most, 1), device=device, dtype=targets.dtype)
        boxes = torch.zeros((batch_size, most, 4), device=device, dtype=targets.dtype)
        mask = torch.zeros((batch_size, most, 1), device=device, dtype=torch.bool)
        labels[image, slot, 0] = rows[:, 1]
        boxes[image, slot] = torch.cat((centre - size / 2, centre + size / 2), 1)
        mask[image, slot] = True
        return labels, boxes, mask


    @staticmethod
    def image_slots(image_index: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Where each target row goes in the per-image padding of ``targets_by_image``: (the rows' order, their
        images and slots in that order, the most rows of an image); a task's per-target extras follow the same."""
        image = image_index.long()
        counts = torch.bincount(image, minlength=batch_size)
        most = int(counts.max()) if image.shape[0] else 0  # the one host read a step needs: the padded size
        image, order = image.sort(stable=True)
        slot = torch.arange(image.shape[0], device=image.device) - (counts.cumsum(0) - counts)[image]
        return order, image, slot, most


def distribution_focal_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(k, bins) logits and (k,) continuous targets in [0, bins - 1) -> (k,): cross-entropy with the two bins around
    the target, weighted by nearness (Li et al., Generalized Focal Loss)."""
    target = target.clamp(0, pred.shape[-1] - 1 - 0.01)
    left = target.long()
    weight_left = left + 1 - target
    log_probs = F.log_softmax(pred, dim=-1)
    return -(log_probs.gather(1, left.unsqueeze(1)).squeeze(1) * weight_left
             + log_probs.gather(1, (left + 1).unsqueeze(1)).squeeze(1) * (1 - weight_left))


class EndToEndLoss:
    """YOLO26's loss (see the module docstring). Call ``set_epoch(epoch, epochs)`` before each epoch."""

    O2M_START, O2M_FINAL = 0.8, 0.1
    branch_loss: type[AnchorFreeLoss] = AnchorFreeLoss  # a task's loss of one branch set (its ``terms`` read extras)

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 640, label_smoothing: float = 0.0) -> None:
        self.one2many = self.branch_loss(model, hyp, img_size, label_smoothing, topk=10)
        self.one2one = self.branch_loss(model, hyp, img_size, label_smoothing, topk=7, topk2=1)
        self.names = self.one2one.names
        self.o2m = self.O2M_START

    @property
    def o2o(self) -> float:
        return max(1.0 - self.o2m, 0.0)

    def set_epoch(self, epoch: int, epochs: int) -> None:
        """The weights of epoch ``epoch`` (0-based) of ``epochs``: o2m from 0.8 at the first to 0.1 at the last."""
        progress = max(1.0 - epoch / max(epochs - 1, 1), 0.0)
        self.o2m = progress * (self.O2M_START - self.O2M_FINAL) + self.O2M_FINAL

    def __call__(self, preds: dict[str, Any], targets: torch.Tensor,
                 **extras: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        many = self.one2many.terms(preds["one2many"], targets, **extras)
        one = self.one2one.terms(preds["one2one"], targets, **extras)
        batch_size = preds["one2one"]["scores"].shape[0]
        return (many.sum() * self.o2m + one.sum() * self.o2o) * batch_size, one.detach()
