"""The segment task's losses, to the LossFn interface of utils/training/families.py: each family's detection loss
with the mask term (utils/tasks/segment/mask_loss.py) beside it, read from the same assignment.

``YoloV5SegmentLoss`` (YOLOv5-seg): YOLOv5's box, objectness and class terms on the Segment head's maps (the class
scores are the columns before the mask coefficients); each level's positives add their mask term, averaged per
image and summed over images and levels, times ``hyp["box"]`` over the batch size. Terms: box, seg, obj, cls.

``AnchorFreeSegmentLoss`` (YOLOv8-seg, YOLO11-seg): the anchor-free loss; the cells the task-aligned assigner made
positives add their mask term, summed and divided by their count, times ``hyp["box"]``. Terms: box, seg, cls, dfl.

``EndToEndSegmentLoss`` (YOLO26-seg): YOLO26's two branch sets (utils/training/loss_anchor_free.py, EndToEndLoss:
the one-to-many weight falling over the run), each with the anchor-free terms and mask term, plus the semantic term
of Proto26's per-class map (``semantic``, 1/8 of the input): each class's target is the union of its objects'
masks (brought to the map's size by nearest-neighbour sampling), compared by 0.5 BCE + 0.5 Dice (smoothing 1, mean
over classes and images) and times ``hyp["box"]``, zero when the branch set has no positives (ultralytics 8.4's
facts). Terms: box, seg, cls, l1, semseg; ``items`` are the one-to-one branch set's.

All are called ``loss(preds, targets, masks)``: ``masks`` is the batch's masks as the segment collate builds them
(utils.data.datasets: one index image per image with the targets in its order, or one mask per target with
``overlap=False``); the total is the terms' sum times the batch size, as the detection losses'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from utils.tasks.segment.mask_loss import anchor_free_mask_loss, object_indices, yolov5_mask_loss
from utils.training.loss import ComputeLoss
from utils.training.loss_anchor_free import AnchorFreeLoss, EndToEndLoss


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


def semantic_targets(masks: torch.Tensor, targets: torch.Tensor, batch_size: int, nc: int,
                     overlap: bool = True) -> torch.Tensor:
    """(b, nc, h, w) float: per image and class, the union of its objects' masks, from the batch's ``masks`` (an
    index image per image with ``overlap``, else one mask per target) and the targets' classes."""
    classes = targets[:, 1].long()
    if overlap:
        order, image, slot, most = AnchorFreeLoss.image_slots(targets[:, 0], batch_size)
        lookup = torch.full((batch_size, most + 1), nc, dtype=torch.long, device=masks.device)  # nc: no class
        lookup[image, slot + 1] = classes[order].to(masks.device)
        index = lookup.gather(1, masks.long().flatten(1)).view(masks.shape)  # (b, h, w) class or nc
        return F.one_hot(index, nc + 1)[..., :nc].permute(0, 3, 1, 2).float()
    out = masks.new_zeros((batch_size, nc, *masks.shape[-2:]), dtype=torch.float32)
    out.index_put_((targets[:, 0].long().to(masks.device), classes.to(masks.device)), masks.float(), accumulate=True)
    return out.clamp(max=1)


def semantic_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """0.5 BCE + 0.5 Dice of per-class logits (b, nc, h, w) against 0/1 targets at any size (nearest-sampled to
    the logits')."""
    if tuple(target.shape[-2:]) != tuple(logits.shape[-2:]):
        target = F.interpolate(target, size=tuple(logits.shape[-2:]), mode="nearest")
    bce = F.binary_cross_entropy_with_logits(logits, target)
    probability = logits.sigmoid()
    inter, union = (probability * target).sum((2, 3)), probability.sum((2, 3)) + target.sum((2, 3))
    dice = 1.0 - (2.0 * inter + 1.0) / (union + 1.0)
    return 0.5 * bce + 0.5 * dice.mean(1).mean()


class EndToEndSegmentBranch(AnchorFreeLoss):
    """One branch set of YOLO26-seg's loss (see the module docstring): terms box, seg, cls, l1, semseg."""

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 640, label_smoothing: float = 0.0,
                 topk: int = 10, topk2: int | None = None, overlap: bool = True) -> None:
        super().__init__(model, hyp, img_size, label_smoothing, topk, topk2)
        box, cls, side = self.names
        self.names = (box, "seg", cls, side, "semseg")
        self.overlap = overlap

    def terms(self, preds: dict, targets: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        protos, semantic = preds["protos"].float(), preds["semantic"].float()
        targets = targets.to(protos.device)
        detection, assigned, image_hw = self.assigned_terms(preds, targets)
        masks = masks.to(protos.device)
        seg = anchor_free_mask_loss(protos, preds["coefficients"].float().transpose(1, 2), assigned.foreground,
                                    assigned.gt_index, assigned.boxes, (image_hw[0], image_hw[1]), masks,
                                    targets[:, 0], self.overlap)
        if assigned.foreground.any():
            sem = semantic_loss(semantic, semantic_targets(masks, targets, len(protos), self.nc, self.overlap))
        else:  # zero, still reaching the semantic branch (DDP needs every gradient)
            sem = semantic.sum() * 0.0
        gain = self.gains[0]
        return torch.cat((detection[:1], (seg * gain).view(1), detection[1:], (sem * gain).view(1)))


class EndToEndSegmentLoss(EndToEndLoss):
    """YOLO26-seg's loss (see the module docstring)."""

    branch_loss = EndToEndSegmentBranch
