"""YOLO26-seg's end-to-end segmentation head (``Segment26`` in ultralytics' YAMLs) and its multi-scale prototype
module (Proto26), among the segment task's ``heads``.

The head is YOLO26's end-to-end detection head (models/head_end_to_end.py) with a mask-coefficient branch ``cv4``
(as YOLOv8-seg's: 3x3 Conv, 3x3 Conv, 1x1 conv to nm) and its one-to-one copy ``one2one_cv4``, and Proto26 in place
of Proto: the P4 and P5 maps, each brought to P3's width by a 1x1 Conv and to its size by nearest-neighbour
upsampling, are added to P3; a 3x3 Conv (``feat_fuse``) then feeds YOLOv8-seg's Proto (3x3 Conv, learned 2x
upsampling, 3x3 Conv, 1x1 Conv to nm prototypes). In training Proto26 also predicts a semantic mask per class from
the fused map (``semseg``: two 3x3 Convs and a 1x1 conv to nc), which only the loss reads.

Train mode returns ``{"one2many": dict, "one2one": dict}``: each the anchor-free head's dict plus ``coefficients``
(b, nm, n), ``protos`` (b, nm, h/4, w/4) and ``semantic`` (b, nc, h/8, w/8) (the one-to-one set's detached, as its
features are). Eval mode returns ``(rows, protos)``: rows (b, k, 6 + nm) final (x1, y1, x2, y2, score, class, the
coefficients), or with ``end_to_end`` False the one-to-many decode (b, n, 4 + nc + nm) for NMS.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.common import Conv
from models.head_anchor_free import head_args
from models.head_end_to_end import MAX_DET, EndToEndDetect
from models.registry import ModelConfigError, Row, RowArgs, register_module
from utils.tasks.contract import OutputContract
from utils.tasks.segment.head import Proto, coefficient_convs, mask_args, mask_metadata


class Proto26(Proto):
    """Prototypes from every level (see the module docstring). Children, in the reference's order: Proto's cv1,
    upsample, cv2, cv3, then feat_refine (one 1x1 Conv per level after the first), feat_fuse, semseg."""

    def __init__(self, ch: Sequence[int], c_hidden: int = 256, c_out: int = 32, nc: int = 80) -> None:
        super().__init__(c_hidden, c_hidden, c_out, upsample="transpose")
        self.feat_refine = nn.ModuleList(Conv(c, ch[0], 1) for c in ch[1:])
        self.feat_fuse = Conv(ch[0], c_hidden, 3)
        self.semseg = nn.Sequential(Conv(ch[0], c_hidden, 3), Conv(c_hidden, c_hidden, 3), nn.Conv2d(c_hidden, nc, 1))

    def fused(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """P3 plus every later level refined to P3's width and upsampled to its size (nearest)."""
        fused = xs[0]
        for refine, x in zip(self.feat_refine, xs[1:]):
            fused = fused + F.interpolate(refine(x), size=tuple(fused.shape[2:]), mode="nearest")
        return fused

    def forward(self, xs: Sequence[torch.Tensor]) -> Any:  # type: ignore[override]
        """Prototypes (b, c_out, 2 h3, 2 w3); in training also the semantic logits (b, nc, h3, w3)."""
        fused = self.fused(xs)
        protos = super().forward(self.feat_fuse(fused))
        return (protos, self.semseg(fused)) if self.training else protos


def segment26_args(row: Row) -> RowArgs:
    """``[nc, nm, npr]`` of an end-to-end config -> ``(nc, nm, scaled npr, reg_max, depthwise_cls, channels)``."""
    if not row.cfg.get("end2end"):
        raise ModelConfigError(f"{row.where}: Segment26 is the end-to-end head of YOLO26-seg; its config needs "
                               "end2end: True")
    if len(row.args) != 3:
        raise ModelConfigError(f"{row.where}: Segment26 takes [nc, masks, prototype width], got {str(row.args)[:60]}")
    nm, npr = mask_args(row, 1)
    nc, reg_max, depthwise_cls, channels = head_args(dataclasses.replace(row, args=row.args[:1])).args
    return RowArgs([nc, nm, npr, reg_max, depthwise_cls, channels], row.repeats, 0)


@register_module("Segment26", table_name="utils.tasks.segment.head_end_to_end.EndToEndSegmentHead")
class EndToEndSegmentHead(EndToEndDetect):
    """YOLO26-seg's head (see the module docstring)."""

    task = "segment"
    yaml_args = staticmethod(segment26_args)

    def __init__(self, nc: int = 80, nm: int = 32, npr: int = 256, reg_max: int = 1, depthwise_cls: bool = True,
                 ch: Sequence[int] = (), max_det: int = MAX_DET) -> None:
        super().__init__(nc, reg_max, depthwise_cls, ch, max_det)
        self.nm, self.npr = int(nm), int(npr)
        self.proto = Proto26(ch, self.npr, self.nm, nc)
        self.cv4 = coefficient_convs(ch, self.nm)
        self.one2one_cv4 = copy.deepcopy(self.cv4)

    @property
    def contract(self) -> OutputContract:
        return dataclasses.replace(super().contract, extra=self.nm, task=self.task)

    def export_metadata(self) -> dict[str, Any]:
        return {**super().export_metadata(), **mask_metadata(self)}

    def mask_branches(self, xs: list[torch.Tensor], one2one: bool) -> dict[str, Any]:
        """One branch set's raw outputs: the detection dict plus the mask ``coefficients`` (b, nm, n)."""
        box, cls, coefficient = ((self.one2one_cv2, self.one2one_cv3, self.one2one_cv4) if one2one
                                 else (self.cv2, self.cv3, self.cv4))
        out = self.branches(xs, box, cls)
        out["coefficients"] = torch.cat([branch(x).flatten(2) for branch, x in zip(coefficient, xs)], 2)
        return out

    def forward(self, xs: list[torch.Tensor]) -> Any:
        if self.training:
            protos, semantic = self.proto(xs)
            many, one = self.mask_branches(xs, one2one=False), self.mask_branches([x.detach() for x in xs], True)
            many.update(protos=protos, semantic=semantic)
            one.update(protos=protos.detach(), semantic=semantic.detach())
            return {"one2many": many, "one2one": one}
        protos = self.proto(xs)
        if not self.end_to_end:
            return self.decode_one2many(xs), protos
        out = self.mask_branches(xs, one2one=True)
        return self.select(super().decode(out, xywh=False), out["coefficients"].transpose(1, 2)), protos

    def decode(self, out: dict[str, Any], xywh: bool = True) -> torch.Tensor:
        """The raw dict -> (b, n, 4 + nc + nm): the detection rows, then the coefficients as they are."""
        return torch.cat((super().decode(out, xywh), out["coefficients"].transpose(1, 2)), 2)

    def decode_one2one(self, xs: list[torch.Tensor], xywh: bool = False) -> torch.Tensor:
        return self.decode(self.mask_branches(xs, one2one=True), xywh=xywh)

    def decode_one2many(self, xs: list[torch.Tensor], xywh: bool = True) -> torch.Tensor:
        return self.decode(self.mask_branches(xs, one2one=False), xywh=xywh)
