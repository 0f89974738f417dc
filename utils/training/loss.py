"""The YOLOv5 family's training loss: CIoU box loss, objectness BCE with IoU targets, class BCE; its terms are
named ("box", "obj", "cls") for the logs (the LossFn interface of utils/training/families.py).

Targets are matched to anchors whose width/height ratio to the box is under ``anchor_t``; each
target is assigned to its own grid cell and the two neighbouring cells its centre is closest to
(offset 0.5), which triples the positives and speeds up early training.

Under DDP each mean (a level's positives for the box and class terms, its cells for objectness) is taken over the
whole global batch (utils.distributed.loss_share): a step over N ranks trains as one process on their batches.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn as nn

from utils.boxes import bbox_iou
from utils.distributed.loss_share import LossShare

# Per-level weight of the objectness loss: small objects (P3) count more; P3-P7 for 5-level heads.
LEVEL_BALANCE = {3: [4.0, 1.0, 0.4]}
LEVEL_BALANCE_DEFAULT = [4.0, 1.0, 0.25, 0.06, 0.02]
NEIGHBOUR_OFFSET = 0.5  # a target also trains the neighbouring cells its centre is within 0.5 of


def smooth_bce_targets(eps: float = 0.0) -> tuple[float, float]:
    """(positive, negative) class targets with label smoothing ``eps`` (0 -> 1.0, 0.0)."""
    return 1.0 - 0.5 * eps, 0.5 * eps


@dataclass(frozen=True)
class LossGains:
    """Loss weights after scaling for layer count, class count and image size (the hyp YAML is for 3 levels,
    80 classes, 640 px)."""

    box: float
    obj: float
    cls: float

    @classmethod
    def from_hyp(cls, hyp: dict, num_levels: int, num_classes: int, img_size: int) -> LossGains:
        level_scale = 3 / num_levels
        return cls(box=hyp["box"] * level_scale,
                   obj=hyp["obj"] * (img_size / 640) ** 2 * level_scale,
                   cls=hyp["cls"] * num_classes / 80 * level_scale)


@dataclass
class MatchedTargets:
    """Targets assigned to one level's cells: indices into the (b, na, ny, nx) map, boxes, classes, anchors."""

    image: torch.Tensor  # (m,) long
    anchor: torch.Tensor  # (m,) long
    grid_y: torch.Tensor  # (m,) long
    grid_x: torch.Tensor  # (m,) long
    box: torch.Tensor  # (m, 4) xywh in grid units, xy relative to the cell
    cls: torch.Tensor  # (m,) long
    anchor_wh: torch.Tensor  # (m, 2) in grid units
    target: torch.Tensor | None = None  # (m,) long: the row of the targets each was assigned from


class FocalLoss(nn.Module):
    """Focal loss around a BCE-with-logits loss: each element's BCE times alpha_t * (1 - p_t) ** gamma, where
    p_t is the predicted probability of the true label (Lin et al., 2017), then averaged."""

    def __init__(self, bce: nn.BCEWithLogitsLoss, gamma: float = 1.5, alpha: float = 0.25) -> None:
        super().__init__()
        self.bce = nn.BCEWithLogitsLoss(pos_weight=bce.pos_weight, reduction="none")
        self.gamma, self.alpha = gamma, alpha

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = self.bce(logits, target)
        prob = torch.sigmoid(logits)
        p_t = target * prob + (1 - target) * (1 - prob)
        alpha_t = target * self.alpha + (1 - target) * (1 - self.alpha)
        return (loss * alpha_t * (1.0 - p_t) ** self.gamma).mean()


class ComputeLoss:
    """``loss(preds, targets) -> (total * batch_size, items (box, obj, cls) detached)``, the terms named by ``names``.

    ``preds`` is the training-mode output (a list of (b, na, ny, nx, 5 + nc) maps); ``targets`` is
    (n, 6) [image, cls, cx, cy, w, h] normalised. The total is multiplied by the batch size, as the
    reference does, so gradients scale with the images in a step.
    """

    names = ("box", "obj", "cls")

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 640, label_smoothing: float = 0.0) -> None:
        detect = model.head  # an anchor-based head: anchors (nl, na, 2) in pixels, stride (nl,)
        self.num_levels, self.num_anchors, self.num_classes = detect.nl, detect.na, detect.nc
        self.gains = LossGains.from_hyp(hyp, self.num_levels, self.num_classes, img_size)
        self.anchor_t = float(hyp["anchor_t"])
        self.cls_pos, self.cls_neg = smooth_bce_targets(label_smoothing)
        self.balance = LEVEL_BALANCE.get(self.num_levels, LEVEL_BALANCE_DEFAULT)
        device = detect.anchors.device
        self.bce_cls = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([hyp.get("cls_pw", 1.0)], device=device))
        self.bce_obj = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([hyp.get("obj_pw", 1.0)], device=device))
        gamma = float(hyp.get("fl_gamma", 0.0))
        if gamma > 0:  # focal loss for the class and objectness terms
            self.bce_cls, self.bce_obj = FocalLoss(self.bce_cls, gamma), FocalLoss(self.bce_obj, gamma)
        self.detect = detect

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss_box, loss_obj, loss_cls = self.detection_terms(preds, targets)
        batch_size = preds[0].shape[0]
        return (loss_box + loss_obj + loss_cls) * batch_size, torch.cat((loss_box, loss_obj, loss_cls)).detach()

    def detection_terms(self, preds: list[torch.Tensor], targets: torch.Tensor,
                        positives: list | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gained (box, obj, cls) terms, each (1,); ``positives``, when given, receives each level's
        (MatchedTargets, its cells' rows (m, no)) for a task's own terms (the masks of utils.tasks.segment.loss)."""
        device = preds[0].device
        loss_box, loss_obj, loss_cls = (torch.zeros(1, device=device) for _ in range(3))
        targets = targets.to(device)
        matches = [self.build_targets(level, pred.shape, targets) for level, pred in enumerate(preds)]
        levels = len(preds)  # the means' counts, shared by the ranks: each level's positives, then its cells
        share = LossShare([m.image.numel() for m in matches] + [pred[..., 4].numel() for pred in preds])
        for level, (pred, match) in enumerate(zip(preds, matches)):  # pred: (b, na, ny, nx, 5 + nc)
            target_obj = torch.zeros(pred.shape[:4], dtype=pred.dtype, device=device)  # (b, na, ny, nx)
            if match.image.numel():
                cell = pred[match.image, match.anchor, match.grid_y, match.grid_x]  # (m, 5 + nc [+ nm])
                if positives is not None:
                    positives.append((match, cell))
                pred_xy = cell[:, :2].sigmoid() * 2 - 0.5
                pred_wh = (cell[:, 2:4].sigmoid() * 2) ** 2 * match.anchor_wh
                iou = bbox_iou(torch.cat((pred_xy, pred_wh), 1), match.box, kind="ciou")  # (m,)
                loss_box = loss_box + share.mean((1.0 - iou).mean(), level)
                target_obj[match.image, match.anchor, match.grid_y, match.grid_x] = \
                    iou.detach().clamp(0).to(target_obj.dtype)
                if self.num_classes > 1:
                    scores = cell[:, 5:5 + self.num_classes]
                    cls_target = torch.full_like(scores, self.cls_neg)
                    cls_target[torch.arange(len(match.cls), device=device), match.cls] = self.cls_pos
                    loss_cls = loss_cls + share.mean(self.bce_cls(scores, cls_target), level)  # (m, nc): m's ratio
            loss_obj = loss_obj + share.mean(self.bce_obj(pred[..., 4], target_obj), levels + level) \
                * self.balance[level]
        return loss_box * self.gains.box, loss_obj * self.gains.obj, loss_cls * self.gains.cls

    def build_targets(self, level: int, shape: torch.Size, targets: torch.Tensor) -> MatchedTargets:
        """Assign (n, 6) normalised targets [image, cls, cx, cy, w, h] to the anchors and cells of one level of a
        (b, na, ny, nx, no) map."""
        ny, nx = shape[2], shape[3]
        device, na, n = targets.device, self.num_anchors, targets.shape[0]
        anchors = (self.detect.anchors[level] / self.detect.stride[level]).to(device)  # (na, 2) grid units
        grid_size = torch.tensor([nx, ny], device=device, dtype=targets.dtype)
        candidates = _Candidates(  # every target once per anchor, anchor-major: (na * n,)
            image=targets[:, 0].repeat(na), cls=targets[:, 1].repeat(na),
            xy=(targets[:, 2:4] * grid_size).repeat(na, 1), wh=(targets[:, 4:6] * grid_size).repeat(na, 1),
            anchor=torch.arange(na, device=device).repeat_interleave(n),
            target=torch.arange(n, device=device).repeat(na))
        if n:
            ratio = candidates.wh / anchors[candidates.anchor]  # (na * n, 2)
            candidates = candidates.select(torch.max(ratio, 1 / ratio).max(1)[0] < self.anchor_t)
        candidates, offsets = _add_neighbour_cells(candidates, nx, ny)
        cell = (candidates.xy - offsets).long()
        grid_x = cell[:, 0].clamp_(0, nx - 1)
        grid_y = cell[:, 1].clamp_(0, ny - 1)
        box = torch.cat((candidates.xy - torch.stack((grid_x, grid_y), 1), candidates.wh), 1)
        return MatchedTargets(image=candidates.image.long(), anchor=candidates.anchor, grid_y=grid_y, grid_x=grid_x,
                              box=box, cls=candidates.cls.long(), anchor_wh=anchors[candidates.anchor],
                              target=candidates.target)


@dataclass
class _Candidates:
    """Targets on the way to their cells, one row per (target, anchor) pair (then per neighbour cell)."""

    image: torch.Tensor  # (k,) image index in the batch
    cls: torch.Tensor  # (k,)
    xy: torch.Tensor  # (k, 2) centre in grid units
    wh: torch.Tensor  # (k, 2) size in grid units
    anchor: torch.Tensor  # (k,) long
    target: torch.Tensor  # (k,) long: the target's row

    def select(self, keep: torch.Tensor) -> _Candidates:
        """The rows where ``keep`` is True (a (k,) mask, or (r, k) over ``r`` stacked copies of every field)."""
        def pick(field: torch.Tensor) -> torch.Tensor:
            return field.unsqueeze(0).expand(keep.shape[0], *field.shape)[keep] if keep.dim() == 2 else field[keep]

        return _Candidates(*(pick(getattr(self, f.name)) for f in fields(self)))


def _add_neighbour_cells(candidates: _Candidates, nx: int, ny: int) -> tuple[_Candidates, torch.Tensor]:
    """Repeat each candidate for its own cell and the two neighbours (left/right, up/down) its centre is nearest
    to; returns the candidates and the cell offsets to subtract from their centres."""
    g, xy = NEIGHBOUR_OFFSET, candidates.xy
    directions = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], device=xy.device, dtype=xy.dtype) * g
    xy_inverse = torch.tensor([nx, ny], device=xy.device, dtype=xy.dtype) - xy
    left, up = ((xy % 1 < g) & (xy > 1)).T
    right, down = ((xy_inverse % 1 < g) & (xy_inverse > 1)).T
    keep = torch.stack((torch.ones_like(left), left, up, right, down))  # (5, k)
    offsets = (torch.zeros_like(xy)[None] + directions[:, None])[keep]
    return candidates.select(keep), offsets
