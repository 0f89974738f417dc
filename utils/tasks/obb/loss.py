"""The oriented-box task's losses, to the LossFn interface of utils/training/families.py: the anchor-free loss with
rotated boxes (YOLOv8-obb, YOLO11-obb) and its end-to-end form (YOLO26-obb).

``AnchorFreeObbLoss``: cells assigned by the rotated task-aligned assigner (a cell is a candidate when its centre
lies inside the rotated box, sides shorter than the second stride widened to it as the axis-aligned assigner does;
the alignment weighs ProbIoU in place of CIoU; top 10, alpha 0.5, beta 6); a BCE class loss against the soft
targets; for the assigned cells, weighted by their target score and normalised by the target scores' sum (over
every rank's batch under DDP: utils.distributed.loss_share):
``box`` 1 - ProbIoU of the predicted and assigned rotated boxes, ``dfl`` the distribution focal loss of the four
sides measured in the assigned box's own frame (an L1 of the sides over the image size, ``l1``, for a head with
one value per side), and ``angle`` sin^2 of twice the angle error, weighted by exp(-log(w/h)^2 / 9) of the
assigned box (ultralytics 8.4's angle term; its period is a quarter turn, which the ProbIoU term resolves).
Gains: hyp ``box``, ``cls``, ``dfl`` and ``angle`` (1.0 when the hyp has none). Boxes narrower than 2 pixels are
left out of the targets, as ultralytics does. ``total`` is the gained sum times the batch size.

``EndToEndObbLoss`` (YOLO26-obb): that loss on both sets of branches with YOLO26's one-to-many / one-to-one
schedule (utils/training/loss_anchor_free.py's EndToEndLoss).

Both are called ``loss(preds, targets, rboxes)``, as the obb task's collate makes a batch
(utils/tasks/obb/sample.py): ``targets`` (n, 6) [image, class, enclosing box] and ``rboxes`` (n, 5) [cx, cy, w, h,
r] in the targets' order: the minimum-area rectangle's centre and sides normalised to the input (x and w by its
width, y and h by its height: multiplied back the same way), the angle in radians. Predictions are the OBB heads'
train-mode dicts (utils/tasks/obb/head.py: the detection dict plus ``angles`` (b, 1, n) in radians).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from utils.distributed.loss_share import LossShare
from utils.tasks.obb.head import dist2rbox
from utils.tasks.obb.rotated import probiou
from utils.training.loss_anchor_free import AnchorFreeLoss, EndToEndLoss, distribution_focal_loss
from utils.training.tal import Assignment, TaskAlignedAssigner

ALPHA, BETA = 0.5, 6.0
MIN_SIDE = 2.0  # pixels: narrower target boxes are left out
ASPECT_SENSITIVITY = 3.0  # the angle term's weight exp(-log(w/h)^2 / 3^2)


class RotatedTaskAlignedAssigner(TaskAlignedAssigner):
    """The task-aligned assigner for rotated boxes (b, m, 5) / (b, n, 5) xywhr in pixels: candidates inside the
    rotated box, ProbIoU as the overlap (see the module docstring)."""

    @staticmethod
    def overlap(gt_boxes: torch.Tensor, pd_boxes: torch.Tensor) -> torch.Tensor:
        return probiou(gt_boxes, pd_boxes)

    def candidates(self, anchor_points: torch.Tensor, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor) -> torch.Tensor:
        """(b, m, n): whether each cell centre lies strictly inside each (widened) rotated box."""
        size = gt_bboxes[..., 2:4]
        if self.strides:
            widen_to = self.strides[1] if len(self.strides) > 1 else self.strides[0]
            size = torch.where((size < widen_to) & mask_gt.bool(), torch.full_like(size, widen_to), size)
        cos, sin = torch.cos(gt_bboxes[..., 4:5]), torch.sin(gt_bboxes[..., 4:5])  # (b, m, 1)
        dx = anchor_points[:, 0].view(1, 1, -1) - gt_bboxes[..., 0:1]  # (b, m, n)
        dy = anchor_points[:, 1].view(1, 1, -1) - gt_bboxes[..., 1:2]
        along, across = dx * cos + dy * sin, -dx * sin + dy * cos  # in the box's frame
        inside = torch.minimum(size[..., 0:1] / 2 - along.abs(), size[..., 1:2] / 2 - across.abs())
        return inside > self.eps


def rbox2dist(anchor_points: torch.Tensor, boxes: torch.Tensor, reg_max: float | None = None) -> torch.Tensor:
    """Rotated boxes (..., 5) xywhr -> the sides (left, top, right, bottom) from ``anchor_points`` (..., 2) in each
    box's own frame (the inverse of utils.tasks.obb.head.dist2rbox); clamped to [0, reg_max - 0.01] when given."""
    cos, sin = torch.cos(boxes[..., 4:5]), torch.sin(boxes[..., 4:5])
    offset = anchor_points - boxes[..., :2]
    along = offset[..., :1] * cos + offset[..., 1:2] * sin
    across = -offset[..., :1] * sin + offset[..., 1:2] * cos
    half_w, half_h = boxes[..., 2:3] / 2, boxes[..., 3:4] / 2
    dist = torch.cat((half_w + along, half_h + across, half_w - along, half_h - across), -1)
    return dist.clamp(0, reg_max - 0.01) if reg_max is not None else dist


def angle_loss(pred_angle: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(k,) predicted angles and (k, 5) assigned boxes -> (k,): sin^2 of twice the angle error (wrapped to a half
    turn), weighted by how near the box is to a square (see the module docstring)."""
    error = pred_angle - target[:, 4]
    error = error - torch.round(error / math.pi) * math.pi
    aspect = torch.log((target[:, 2] + 1e-9) / (target[:, 3] + 1e-9))
    return torch.exp(-aspect.pow(2) / ASPECT_SENSITIVITY ** 2) * torch.sin(2 * error).pow(2)


def rotated_rows(targets: torch.Tensor, rboxes: torch.Tensor) -> torch.Tensor:
    """A batch's targets (n, 6) and rotated boxes (n, 5) -> the (n, 7) rows [image, class, cx, cy, w, h, r] the
    terms read."""
    if rboxes.shape != (targets.shape[0], 5):
        raise ValueError(f"{targets.shape[0]} targets but rotated boxes of shape {tuple(rboxes.shape)}")
    return torch.cat((targets[:, :2], rboxes.to(targets.device, targets.dtype)), 1)


class AnchorFreeObbLoss(AnchorFreeLoss):
    """See the module docstring."""

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 640, label_smoothing: float = 0.0,
                 topk: int = 10, topk2: int | None = None) -> None:
        super().__init__(model, hyp, img_size, label_smoothing, topk, topk2)
        self.assigner = RotatedTaskAlignedAssigner(topk, self.nc, ALPHA, BETA, strides=self.strides, topk2=topk2)
        self.angle_gain = float(hyp.get("angle", 1.0))
        self.names = (*self.names, "angle")

    def __call__(self, preds: dict[str, Any], targets: torch.Tensor,  # type: ignore[override]
                 rboxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        terms = self.terms(preds, rotated_rows(targets, rboxes))
        return terms.sum() * preds["scores"].shape[0], terms.detach()

    def terms(self, preds: dict[str, Any], targets: torch.Tensor) -> torch.Tensor:
        """The four gained terms (box, cls, dfl or l1, angle) of one set of branches, (4,), for (n, 7) rows
        [image, class, cx, cy, w, h, r] (``rotated_rows``)."""
        pred_dist = preds["boxes"].permute(0, 2, 1).to(torch.float32, memory_format=torch.contiguous_format)
        logits = preds["scores"].permute(0, 2, 1).to(torch.float32, memory_format=torch.contiguous_format)
        angles = preds["angles"].permute(0, 2, 1).to(torch.float32)  # (b, n, 1)
        points, strides = preds["anchor_points"], preds["stride_tensor"]
        b = logits.shape[0]
        image_hw = [size * self.strides[0] for size in preds["feature_sizes"][0]]
        gt_labels, gt_boxes, mask_gt = self.rotated_targets(targets.to(logits.device), b, image_hw)
        with torch.no_grad():
            pred_boxes = self.decode_rotated(points, pred_dist, angles)  # (b, n, 5): xywh in grid units
            pixels = torch.cat((pred_boxes[..., :4] * strides, pred_boxes[..., 4:]), -1)
        assigned = self.assigner(logits.detach().sigmoid(), pixels.to(gt_boxes.dtype), points * strides, gt_labels,
                                 gt_boxes, mask_gt)
        target_scores = self.smoothed(assigned)
        score_sum = LossShare([target_scores.sum()]).divisor(0, floor=1)  # summed over the ranks under DDP
        cls = F.binary_cross_entropy_with_logits(logits, target_scores.to(logits.dtype), reduction="none").sum() \
            / score_sum
        box, side, angle = self.rotated_terms(pred_dist, angles, points, strides, assigned, target_scores,
                                              score_sum, image_hw)
        gain_box, gain_cls, gain_side = self.gains
        return torch.stack((box * gain_box, cls * gain_cls, side * gain_side, angle * self.angle_gain))

    def decode_rotated(self, points: torch.Tensor, pred_dist: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """(..., 4 * reg_max) side distributions and (..., 1) angles of cells at ``points`` -> (..., 5) xywhr, the
        centre and size in grid units."""
        if self.reg_max > 1:
            bins = self.bins.to(device=pred_dist.device, dtype=pred_dist.dtype)
            pred_dist = pred_dist.reshape(*pred_dist.shape[:-1], 4, self.reg_max).softmax(-1) @ bins
        return torch.cat((dist2rbox(pred_dist, angles, points, dim=-1), angles), -1)

    def rotated_terms(self, pred_dist: torch.Tensor, angles: torch.Tensor, points: torch.Tensor,
                      strides: torch.Tensor, assigned: Assignment, target_scores: torch.Tensor,
                      score_sum: torch.Tensor, image_hw: list[float]) -> tuple[torch.Tensor, ...]:
        """(ProbIoU loss, DFL or L1 loss, angle loss) of the foreground cells, each weighted by its target score."""
        fg = assigned.foreground
        weight = target_scores.sum(-1)[fg]  # (f,)
        target = assigned.boxes.clone()
        target[..., :4] = target[..., :4] / strides  # grid units; the angle as it is
        fg_points = points.expand(fg.shape[0], -1, -1)[fg]
        fg_dist, fg_angles, fg_target = pred_dist[fg], angles[fg], target[fg]
        pred_boxes = self.decode_rotated(fg_points, fg_dist, fg_angles)  # (f, 5)
        box = ((1.0 - probiou(pred_boxes, fg_target)) * weight).sum() / score_sum
        if self.reg_max > 1:
            target_sides = rbox2dist(fg_points, fg_target, self.reg_max - 1)
            side = (distribution_focal_loss(fg_dist.reshape(-1, self.reg_max), target_sides.reshape(-1))
                    .view(-1, 4).mean(-1) * weight).sum() / score_sum
        else:
            fg_strides = strides.expand(fg.shape[0], -1, -1)[fg]
            scale = strides.new_tensor([image_hw[1], image_hw[0], image_hw[1], image_hw[0]])
            target_sides = rbox2dist(fg_points, fg_target) * fg_strides / scale
            side = (F.l1_loss(fg_dist * fg_strides / scale, target_sides, reduction="none").mean(-1) * weight).sum() \
                / score_sum
        angle = (angle_loss(fg_angles[:, 0], fg_target) * weight).sum() / score_sum
        return box, side, angle

    @staticmethod
    def rotated_targets(targets: torch.Tensor, batch_size: int,
                        image_hw: list[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(n, 7) normalised rows -> per image, padded to the most boxes of an image: labels (b, m, 1), boxes
        (b, m, 5) xywhr in pixels, and which rows are boxes (b, m, 1); boxes narrower than MIN_SIDE pixels left
        out."""
        scale = targets.new_tensor([image_hw[1], image_hw[0], image_hw[1], image_hw[0]])
        pixels = targets[:, 2:6] * scale
        rows = targets[(pixels[:, 2] >= MIN_SIDE) & (pixels[:, 3] >= MIN_SIDE)]
        image = rows[:, 0].long()
        counts = torch.bincount(image, minlength=batch_size)
        most = int(counts.max()) if rows.shape[0] else 0
        image, order = image.sort(stable=True)
        rows = rows[order]
        slot = torch.arange(rows.shape[0], device=rows.device) - (counts.cumsum(0) - counts)[image]
        labels = torch.zeros((batch_size, most, 1), device=rows.device, dtype=rows.dtype)
        boxes = torch.zeros((batch_size, most, 5), device=rows.device, dtype=rows.dtype)
        mask = torch.zeros((batch_size, most, 1), device=rows.device, dtype=torch.bool)
        labels[image, slot, 0] = rows[:, 1]
        boxes[image, slot] = torch.cat((rows[:, 2:6] * scale, rows[:, 6:7]), 1)
        mask[image, slot] = True
        return labels, boxes, mask


class EndToEndObbLoss(EndToEndLoss):
    """YOLO26-obb's loss: the rotated loss on both sets of branches (see EndToEndLoss). Call ``set_epoch``."""

    branch_loss = AnchorFreeObbLoss

    def __call__(self, preds: dict[str, Any], targets: torch.Tensor,  # type: ignore[override]
                 rboxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().__call__(preds, rotated_rows(targets, rboxes))
