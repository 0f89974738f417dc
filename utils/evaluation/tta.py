"""Test-time augmentation (``--augment`` of detect.py and test.py), as YOLOv5 does it.

The batch is run at scales 1, 0.83 (flipped left-right) and 0.67 of its size; each pass's boxes are mapped back to
the input's frame (de-scaled, un-flipped) and the passes are concatenated before NMS. Like the reference, the
scale-1 pass drops its coarsest level (the largest boxes: the smaller passes see those better) and the 0.67 pass
its finest (the smallest boxes, which it resolves worst).

It applies to outputs whose rows go through NMS (``xywh_*`` layouts: YOLOv5, YOLOv8, YOLO11), where the passes'
rows can be merged before it; an end-to-end head's final rows (YOLO26) cannot be merged, and --augment is refused
for them with one line. A task's columns after the class scores follow their boxes back through its ``predict``
part (``TaskOutputs.deaugment``: a pose model's keypoints are scaled back and mirrored with its flip_idx, read from
the head's metadata); a task whose part does not (``deaugments`` False) or that has other outputs is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F

from utils.errors import UserError
from utils.evaluation.task_outputs import outputs_of
from utils.tasks.contract import OutputContract

SCALES = (1.0, 0.83, 0.67)
FLIPS = (False, True, False)  # left-right flip of each pass
PAD_VALUE = 0.447  # the grey the reference pads scaled images with (the ImageNet mean, in [0, 1])


class AugmentError(UserError, ValueError):
    """--augment for a model whose output it cannot merge; one line."""


@dataclass(frozen=True)
class DetectLayout:
    """How a detector's output rows are laid out: one block per level, ``num_anchors`` rows per grid cell; ``head``
    its head's export metadata (what a task's columns need to follow the passes back: a pose model's flip_idx)."""

    strides: tuple[float, ...]
    num_anchors: int
    head: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def counts(self, height: int, width: int) -> list[int]:
        """Rows of each level's block for an input of ``height`` x ``width`` pixels."""
        return [self.num_anchors * math.ceil(height / s) * math.ceil(width / s) for s in self.strides]


def layout_of(model: object) -> DetectLayout:
    """The layout of our Model (from its head's export metadata: strides, and anchors per cell where the head has
    anchors, else one row per cell), or of anything with ``strides`` and ``num_anchors`` (backends)."""
    head = getattr(model, "head", None)
    if head is not None:
        meta = head.export_metadata()
        anchors = meta.get("anchors") or [[None]]
        return DetectLayout(tuple(float(s) for s in meta["stride"]), len(anchors[0]), meta)
    return DetectLayout(tuple(float(s) for s in model.strides), int(model.num_anchors),
                        dict(getattr(model, "head_meta", None) or {}))


def merges(contract: OutputContract) -> bool:
    """Whether test-time augmentation can merge the passes of a model of ``contract``: rows of boxes that go
    through NMS, no other outputs, and task columns (if any) that its ``predict`` part moves back (``deaugments``)."""
    return (contract.rank == 3 and not contract.end_to_end and len(contract.outputs) == 1
            and (not contract.extra or outputs_of(contract.task).deaugments))


def scale_image(images: torch.Tensor, ratio: float, stride: int) -> torch.Tensor:
    """(b, 3, h, w) resized by ``ratio`` and padded right and bottom to a multiple of ``stride``."""
    if ratio == 1.0:
        return images
    h, w = images.shape[2:]
    size = (int(h * ratio), int(w * ratio))
    resized = F.interpolate(images, size=size, mode="bilinear", align_corners=False)
    padded_h, padded_w = (math.ceil(v * ratio / stride) * stride for v in (h, w))
    return F.pad(resized, [0, padded_w - size[1], 0, padded_h - size[0]], value=PAD_VALUE)


def _to_input_frame(pred: torch.Tensor, scale_xy: tuple[float, float], flip: bool, width: int) -> torch.Tensor:
    """Boxes (cx, cy, w, h) of a scaled (and flipped) pass back in the input's pixels."""
    pred = pred.float().clone()
    pred[..., [0, 2]] /= scale_xy[0]
    pred[..., [1, 3]] /= scale_xy[1]
    if flip:
        pred[..., 0] = width - pred[..., 0]
    return pred


def _drop_levels(pred: torch.Tensor, layout: DetectLayout, shape: Sequence[int], keep: slice) -> torch.Tensor:
    """Keep the levels ``keep`` of one pass; a model whose rows do not follow ``layout`` keeps them all."""
    counts = layout.counts(*shape)
    if sum(counts) != pred.shape[1]:
        return pred
    starts = [sum(counts[:i]) for i in range(len(counts) + 1)]
    first, last, _ = keep.indices(len(counts))
    return pred[:, starts[first]:starts[last]]


def augmented_forward(predict: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor,
                      layout: DetectLayout, contract: OutputContract | None = None) -> torch.Tensor:
    """Decoded predictions (b, n', contract columns) of the three passes, boxes in the pixels of ``images``
    (b, 3, h, w); AugmentError for an end-to-end ``contract`` (final rows: nothing to merge)."""
    if contract is not None and contract.end_to_end:
        raise AugmentError(f"--augment merges the rows of three passes before NMS; this model's rows are final "
                           f"({contract.layout}, no NMS): drop --augment")
    if contract is not None and not merges(contract):
        raise AugmentError(f"--augment merges boxes of three passes; this model's {contract.task} outputs do not "
                           "follow them: drop --augment")
    height, width = images.shape[2:]
    stride = int(max(layout.strides))
    outputs = []
    for ratio, flip in zip(SCALES, FLIPS):
        x = scale_image(images.flip(3) if flip else images, ratio, stride)
        scale_xy = (int(width * ratio) / width, int(height * ratio) / height) if ratio != 1.0 else (1.0, 1.0)
        rows = _to_input_frame(predict(x), scale_xy, flip, width)
        if contract is not None and contract.extra:
            rows = outputs_of(contract.task).deaugment(rows, contract, scale_xy, flip, width, layout.head)
        outputs.append((rows, x.shape[2:]))
    (first, first_shape), middle, (last, last_shape) = outputs
    first = _drop_levels(first, layout, first_shape, slice(0, -1))  # scale 1 without its coarsest level
    last = _drop_levels(last, layout, last_shape, slice(1, None))  # scale 0.67 without its finest level
    return torch.cat((first, middle[0], last), 1)
