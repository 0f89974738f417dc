"""The mask term of a segmenter's loss: per-pixel BCE of (coefficients x prototypes), cropped to the box, normalised
by the box's area, as YOLOv5-seg and the anchor-free families (YOLOv8-seg, YOLO11-seg) define it.

For one positive (a prediction assigned to a labelled object) with mask coefficients c (nm,) and its image's
prototypes P (nm, h, w) at 1/4 of the input's resolution:

    loss = sum over pixels inside the object's box of BCE(c . P[:, y, x], gt[y, x]) / (h * w * box_area)

where ``gt`` is the object's mask at the prototypes' resolution and ``box_area`` the box's area as a fraction of
the image: the mean BCE over the box's pixels. The families differ only in which predictions are positives and
how the per-positive terms are reduced (``yolov5_mask_loss``, ``anchor_free_mask_loss``); both scale the result
by the box gain ``hyp["box"]``, as the reference does.

Ground-truth masks come in one of two layouts (the data loader's choice, the reference's ``overlap_mask``):
- overlap (default): one index image per training image (b, H, W), pixel value r + 1 where that image's r-th object
  is (the smaller object on top where objects overlap; utils.tasks.segment.masks.overlap_index), so object r of an
  image is
  the pixels equal to r + 1;
- stacked: one mask per object of the batch (n, H, W) in the order of the targets.
Masks larger than the prototypes (full input size) are brought to their size by nearest-neighbour sampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from utils.distributed.loss_share import LossShare
from utils.tasks.segment.masks import box_window, prototype_masks

MASK_RATIO = 4  # the prototypes' (and the masks') resolution: 1/4 of the input's


def object_indices(image_index: torch.Tensor, overlap: bool = True) -> torch.Tensor:
    """Per target (n,) (its image's index in the batch, targets grouped by image as the loader collates them) the
    index of its mask: overlap, its rank within its image plus 1 (its value in the index image); stacked, its
    position among all targets."""
    image_index = image_index.long()
    if not overlap:
        return torch.arange(len(image_index), device=image_index.device)
    ranks = torch.zeros_like(image_index)
    for image in image_index.unique():
        mine = image_index == image
        ranks[mine] = torch.arange(1, int(mine.sum()) + 1, device=image_index.device)
    return ranks


def fit_masks(masks: torch.Tensor, size_hw: tuple[int, int]) -> torch.Tensor:
    """Masks (or index images) (k, H, W) at the prototypes' size (h, w): nearest-neighbour, as the reference."""
    if tuple(masks.shape[-2:]) == tuple(size_hw):
        return masks
    return F.interpolate(masks[None].float(), size=size_hw, mode="nearest")[0].to(masks.dtype)


def gather_masks(masks: torch.Tensor, image: int, indices: torch.Tensor, overlap: bool) -> torch.Tensor:
    """Float 0/1 ground truth (m, h, w) of the objects ``indices`` (from ``object_indices``) of batch image
    ``image``."""
    if overlap:
        return (masks[image][None] == indices.view(-1, 1, 1).to(masks.dtype)).float()
    return masks[indices].float()


def instance_mask_loss(gt_masks: torch.Tensor, coefficients: torch.Tensor, protos: torch.Tensor,
                       boxes: torch.Tensor, areas: torch.Tensor) -> torch.Tensor:
    """Per positive (m,): the BCE of its predicted mask logits (coefficients (m, nm) x protos (nm, h, w)) against
    ``gt_masks`` (m, h, w), summed over the pixels whose centre lies in its box (m, 4) x1, y1, x2, y2 in the
    prototypes' pixels, over h * w * its box area (m,) as a fraction of the image."""
    logits = prototype_masks(protos, coefficients)
    bce = F.binary_cross_entropy_with_logits(logits, gt_masks.to(logits.dtype), reduction="none")
    inside = box_window(boxes.to(logits.dtype), logits.shape[-2:])
    return (bce * inside).mean((1, 2)) / areas.to(logits.dtype).clamp(min=1e-9)


def _normalized_xywh_to_mask_boxes(xywh: torch.Tensor, size_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised boxes (m, 4) cx, cy, w, h -> (x1, y1, x2, y2 in mask pixels, areas as fractions of the image)."""
    h, w = size_hw
    scale = torch.tensor([w, h, w, h], device=xywh.device, dtype=xywh.dtype)
    corners = torch.cat((xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2), 1) * scale
    return corners, xywh[:, 2] * xywh[:, 3]


def yolov5_mask_loss(protos: torch.Tensor, levels: list[dict[str, torch.Tensor]], masks: torch.Tensor,
                     overlap: bool = True) -> torch.Tensor:
    """YOLOv5-seg's mask term before the box gain: for each output level, the mean over each image's positives,
    summed over the images and the levels.

    ``protos`` (b, nm, h, w). ``levels``, one mapping per level of what its assignment (build_targets) gives for
    the m positives: ``image`` (m,) batch index; ``coefficients`` (m, nm) the cells' last nm channels;
    ``index`` (m,) the object's mask index (``object_indices`` of the targets, carried through the assignment);
    ``xywh`` (m, 4) the object's box normalised to the image. The family's loss multiplies the result by
    ``hyp["box"] / batch size`` and adds it as the ``seg`` term (YOLOv5-seg's terms: box, seg, obj, cls).
    """
    size = tuple(protos.shape[-2:])
    masks = fit_masks(masks, size)
    total = protos.sum() * 0  # keeps the graph connected when there are no positives
    for level in levels:
        boxes, areas = _normalized_xywh_to_mask_boxes(level["xywh"], size)
        for image in level["image"].unique():
            mine = level["image"] == image
            gt = gather_masks(masks, int(image), level["index"][mine], overlap)
            per_object = instance_mask_loss(gt, level["coefficients"][mine], protos[int(image)], boxes[mine],
                                            areas[mine])
            total = total + per_object.mean()
    return total


def anchor_free_mask_loss(protos: torch.Tensor, coefficients: torch.Tensor, foreground: torch.Tensor,
                          object_index: torch.Tensor, boxes: torch.Tensor, input_hw: tuple[int, int],
                          masks: torch.Tensor, image_of_target: torch.Tensor | None = None,
                          overlap: bool = True) -> torch.Tensor:
    """The anchor-free families' mask term before the box gain: the sum over all positives over their count (every
    rank's under DDP, utils.distributed.loss_share).

    ``protos`` (b, nm, h, w); per anchor point (b, A, ...) as the task-aligned assigner gives them:
    ``coefficients`` (b, A, nm), ``foreground`` (b, A) bool (a positive), ``object_index`` (b, A) the assigned
    object's index among its image's targets (0-based), ``boxes`` (b, A, 4) its box x1, y1, x2, y2 in input
    pixels (``input_hw`` (H, W)). Stacked masks are picked through ``image_of_target`` (n,), each target's batch
    index. The family's loss multiplies the result by ``hyp["box"]`` as the ``seg`` term (box, seg, cls, dfl).
    """
    size = tuple(protos.shape[-2:])
    masks = fit_masks(masks, size)
    count = foreground.sum()
    share = LossShare([count])  # every rank, before any return: the positives of the whole batch divide
    total = protos.sum() * 0 + coefficients.sum() * 0
    if not count:
        return total
    height, width = input_hw
    scale = torch.tensor([size[1] / width, size[0] / height] * 2, device=boxes.device, dtype=boxes.dtype)
    for image in range(len(protos)):
        positives = foreground[image]
        if not positives.any():
            continue
        indices = object_index[image][positives].long()
        if overlap:
            gt = gather_masks(masks, image, indices + 1, True)
        else:
            gt = masks[torch.nonzero(image_of_target.long() == image).view(-1)[indices]].float()
        mine = boxes[image][positives]
        areas = (mine[:, 2] - mine[:, 0]) * (mine[:, 3] - mine[:, 1]) / (height * width)
        total = total + instance_mask_loss(gt, coefficients[image][positives], protos[image], mine * scale,
                                           areas).sum()
    return total / share.divisor(0)
