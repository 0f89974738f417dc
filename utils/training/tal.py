"""Task-aligned assignment (TOOD) of ground-truth boxes to the cells of an anchor-free head (YOLOv8, YOLO11, YOLO26).

A cell is a candidate for a box when its centre lies inside the box (a side shorter than the head's second stride
is first widened to it about the box's centre, as ultralytics 8.4 does, so small objects get cells). Among its
candidates each box takes the ``topk`` cells with the highest alignment ``score ** alpha * ciou ** beta`` (the
predicted score of the box's class and the CIoU of the predicted box); a cell claimed by several boxes goes to the
one its prediction overlaps most; with ``topk2`` each box then keeps only its ``topk2`` best cells (YOLO26's
one-to-one branch). The class targets of a cell are its alignment, normalised so that each box's best cell gets the
box's best CIoU. All of it is batched tensor arithmetic: no loop over boxes or cells, no host synchronisation.

Also the box geometry the loss and the head share: cell centres (``make_anchors``), distances to boxes and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.head_anchor_free import dist2bbox, make_anchors
from utils.boxes import bbox_iou

__all__ = ["Assignment", "TaskAlignedAssigner", "bbox2dist", "dist2bbox", "make_anchors"]


def bbox2dist(anchor_points: torch.Tensor, bbox: torch.Tensor, reg_max: float | None = None) -> torch.Tensor:
    """Boxes (..., 4) xyxy -> distances (left, top, right, bottom) from ``anchor_points`` (..., 2); clamped to
    [0, reg_max - 0.01] when ``reg_max`` is given (the last DFL bin, so both neighbouring bins exist)."""
    x1y1, x2y2 = bbox.chunk(2, -1)
    dist = torch.cat((anchor_points - x1y1, x2y2 - anchor_points), -1)
    return dist.clamp(0, reg_max - 0.01) if reg_max is not None else dist


@dataclass
class Assignment:
    """What the assigner gives each cell of each image (b images, n cells, nc classes)."""

    labels: torch.Tensor  # (b, n) long: the class of the assigned box (meaningful where foreground)
    boxes: torch.Tensor  # (b, n, 4) xyxy in pixels: the assigned box
    scores: torch.Tensor  # (b, n, nc): the soft class targets (0 for background cells)
    foreground: torch.Tensor  # (b, n) bool
    gt_index: torch.Tensor  # (b, n) long: which box of the image (meaningful where foreground)


class TaskAlignedAssigner:
    """See the module docstring. ``strides`` are the head's (sides shorter than the second, or the only one, are
    widened to it; None: no widening)."""

    def __init__(self, topk: int = 10, num_classes: int = 80, alpha: float = 0.5, beta: float = 6.0,
                 strides: Sequence[float] | None = (8.0, 16.0, 32.0), topk2: int | None = None,
                 eps: float = 1e-9) -> None:
        self.topk, self.topk2 = topk, topk2 or topk
        self.num_classes, self.alpha, self.beta, self.eps = num_classes, alpha, beta, eps
        self.strides = [float(s) for s in strides] if strides else None

    @torch.no_grad()
    def __call__(self, pd_scores: torch.Tensor, pd_bboxes: torch.Tensor, anchor_points: torch.Tensor,
                 gt_labels: torch.Tensor, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor) -> Assignment:
        """``pd_scores`` (b, n, nc) after sigmoid, ``pd_bboxes`` (b, n, 4) xyxy pixels, ``anchor_points`` (n, 2)
        pixels, ``gt_labels`` (b, m, 1), ``gt_bboxes`` (b, m, 4) xyxy pixels, ``mask_gt`` (b, m, 1): which of the m
        rows of an image are boxes (images hold different counts)."""
        b, n, nc = pd_scores.shape
        m = gt_bboxes.shape[1]
        if m == 0:
            return Assignment(torch.full((b, n), nc, dtype=torch.long, device=pd_scores.device),
                              torch.zeros_like(pd_bboxes), torch.zeros_like(pd_scores),
                              torch.zeros((b, n), dtype=torch.bool, device=pd_scores.device),
                              torch.zeros((b, n), dtype=torch.long, device=pd_scores.device))
        valid = self.candidates(anchor_points, gt_bboxes, mask_gt) & mask_gt.bool()  # (b, m, n)
        align, overlaps = self.alignment(pd_scores, pd_bboxes, gt_labels, gt_bboxes, valid)
        top = align.topk(min(self.topk, n), dim=-1).indices  # (b, m, k)
        positive = torch.zeros_like(valid).scatter_(-1, top, True) & valid
        positive = self._one_box_per_cell(positive, overlaps)
        if self.topk2 != self.topk:
            best = (align * positive).topk(min(self.topk2, n), dim=-1).indices
            positive &= torch.zeros_like(positive).scatter_(-1, best, True)
        return self._targets(positive, align, overlaps, gt_labels, gt_bboxes)

    def candidates(self, anchor_points: torch.Tensor, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor) -> torch.Tensor:
        """(b, m, n): whether each cell centre lies strictly inside each (widened) box."""
        boxes = gt_bboxes
        if self.strides:
            widen_to = self.strides[1] if len(self.strides) > 1 else self.strides[0]
            centre, size = (boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]
            size = torch.where((size < widen_to) & mask_gt.bool(), torch.full_like(size, widen_to), size)
            boxes = torch.cat((centre - size / 2, centre + size / 2), -1)
        x, y = anchor_points[:, 0].view(1, 1, -1), anchor_points[:, 1].view(1, 1, -1)
        x1, y1, x2, y2 = (boxes[..., i:i + 1] for i in range(4))  # (b, m, 1) each
        inside = torch.minimum(torch.minimum(x - x1, y - y1), torch.minimum(x2 - x, y2 - y))
        return inside > self.eps

    def alignment(self, pd_scores: torch.Tensor, pd_bboxes: torch.Tensor, gt_labels: torch.Tensor,
                  gt_bboxes: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(alignment metric, CIoU) (b, m, n), zero outside ``valid``; the CIoU only computed where valid."""
        b, m, n = valid.shape
        labels = gt_labels.long().clamp(0, self.num_classes - 1).view(b, m, 1).expand(b, m, n)
        class_scores = pd_scores.transpose(1, 2).gather(1, labels)  # (b, m, n): each cell's score of the box's class
        overlaps = torch.zeros((b, m, n), dtype=pd_bboxes.dtype, device=pd_bboxes.device)
        columns = gt_bboxes.shape[-1]
        pairs_pd = pd_bboxes.unsqueeze(1).expand(b, m, n, columns)[valid]
        pairs_gt = gt_bboxes.unsqueeze(2).expand(b, m, n, columns)[valid]
        overlaps[valid] = self.overlap(pairs_gt, pairs_pd).clamp_(0).to(overlaps.dtype)
        align = class_scores.pow(self.alpha) * overlaps.pow(self.beta) * valid
        return align, overlaps

    @staticmethod
    def overlap(gt_boxes: torch.Tensor, pd_boxes: torch.Tensor) -> torch.Tensor:
        """The overlap of box pairs (k, 4) xyxy that the alignment weighs: CIoU (a rotated assigner's differs)."""
        return bbox_iou(gt_boxes, pd_boxes, xywh=False, kind="ciou")

    @staticmethod
    def _one_box_per_cell(positive: torch.Tensor, overlaps: torch.Tensor) -> torch.Tensor:
        """A cell claimed by several boxes keeps the one its prediction overlaps most."""
        claimed = positive.sum(1, keepdim=True) > 1  # (b, 1, n)
        most = overlaps.transpose(1, 2).contiguous().argmax(-1).unsqueeze(1)  # (b, 1, n); along contiguous rows
        best = torch.zeros_like(positive).scatter_(1, most, True)
        return torch.where(claimed, best, positive)

    def _targets(self, positive: torch.Tensor, align: torch.Tensor, overlaps: torch.Tensor, gt_labels: torch.Tensor,
                 gt_bboxes: torch.Tensor) -> Assignment:
        b, m, n = positive.shape
        foreground = positive.any(1)  # (b, n)
        # the box of each cell: at most one is positive per cell here, so a sum of indices finds it (0 where none,
        # as argmax gives), without a slow reduction across the box dimension
        gt_index = (positive * torch.arange(m, device=positive.device).view(1, m, 1)).sum(1)  # (b, n)
        labels = gt_labels.long().view(b, m).gather(1, gt_index).clamp_(0, self.num_classes - 1)
        boxes = gt_bboxes.gather(1, gt_index.unsqueeze(-1).expand(b, n, gt_bboxes.shape[-1]))
        align = align * positive
        best_align = align.amax(-1, keepdim=True)  # (b, m, 1)
        best_overlap = (overlaps * positive).amax(-1, keepdim=True)
        norm = (align * best_overlap / (best_align + self.eps)).amax(1)  # (b, n)
        scores = torch.zeros((b, n, self.num_classes), dtype=align.dtype, device=align.device)
        scores.scatter_(2, labels.unsqueeze(-1), (norm * foreground).unsqueeze(-1))
        return Assignment(labels, boxes, scores, foreground, gt_index)
