"""Segmentation heads: the prototype module (Proto) and the Segment heads of the YOLOv5 and anchor-free families.

A segmenter predicts, for every box it predicts, ``nm`` mask coefficients (32), and once per image ``nm``
prototype masks at 1/4 of the input's resolution (the P3 map upsampled 2x). An instance's mask is the sigmoid of
its coefficients times the prototypes, cropped to its box (utils.tasks.segment.masks.process_masks).

The heads offer the head interface of models/head.py with ``task = "segment"`` and a contract whose ``extra``
columns are the ``nm`` coefficients; their eval-mode output is a tuple ``(decoded, protos)``: the decoded rows
(b, n, columns) of
the family's layout with the coefficients as the last ``nm`` columns, and the prototypes (b, nm, h/4, w/4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from models.common import Conv, apply_conv
from models.head import Detect
from models.head_anchor_free import AnchorFreeDetect, head_args
from models.registry import LIMITS, ModelConfigError, Row, RowArgs, is_number, register_module
from utils.tasks.contract import OutputContract

PROTO_UPSAMPLE = ("nearest", "transpose")


class Proto(nn.Module):
    """Prototype masks from the P3 map: 3x3 conv, 2x upsample, 3x3 conv, 1x1 conv to ``c_out`` prototypes.

    ``upsample`` is YOLOv5's nearest-neighbour ``nn.Upsample`` ("nearest") or the anchor-free families' learned
    ``nn.ConvTranspose2d(c, c, 2, 2)`` ("transpose"). The children's names and order are the reference's (cv1,
    upsample, cv2, cv3), so release files' tensors load by name."""

    def __init__(self, c_in: int, c_hidden: int = 256, c_out: int = 32, upsample: str = "nearest") -> None:
        super().__init__()
        if upsample not in PROTO_UPSAMPLE:
            raise ValueError(f"Proto upsample must be one of {PROTO_UPSAMPLE}, got {upsample!r}")
        self.cv1 = Conv(c_in, c_hidden, 3)
        self.upsample: nn.Module = (nn.Upsample(scale_factor=2.0, mode="nearest") if upsample == "nearest"
                                    else nn.ConvTranspose2d(c_hidden, c_hidden, 2, 2, 0, bias=True))
        self.cv2 = Conv(c_hidden, c_hidden, 3)
        self.cv3 = Conv(c_hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(self.cv2(self.upsample(self.cv1(x))))


def mask_args(row: Row, first: int) -> tuple[int, int]:
    """(nm, scaled npr) from a Segment row's ``args[first:first + 2]``: the coefficient count as written, the
    prototype width scaled by the width multiple and capped by the scale's channels (as the references build it)."""
    values = row.args[first:first + 2]
    if len(values) != 2 or not all(is_number(v) and v == int(v) and 1 <= v <= LIMITS["channels"] for v in values):
        raise ModelConfigError(f"{row.where}: Segment takes the mask coefficient count and the prototype width as "
                               f"positive integers up to {LIMITS['channels']}, got {str(values)[:60]}")
    return int(values[0]), row.scaled(values[1])


def _yolov5_segment(cfg: Any, args: list) -> bool:
    """A ``Segment`` row of the YOLOv5 family: ``[nc, anchors, nm, npr]``."""
    return len(args) == 4 and isinstance(args[1], list)


def _anchor_free_segment(cfg: Any, args: list) -> bool:
    """A ``Segment`` row of YOLOv8/YOLO11: ``[nc, nm, npr]`` in a config that is not end-to-end."""
    return len(args) == 3 and not isinstance(args[1], list) and not cfg.get("end2end")


@register_module("Segment", when=_yolov5_segment, table_name="models.yolo.Segment")
class Segment(Detect):
    """YOLOv5's Segment head: Detect whose per-anchor rows carry ``nm`` mask coefficients after the class scores,
    plus a Proto on the first (P3) input.

    Train mode returns ``(maps, protos)``: the raw maps, a list of (b, na, ny, nx, 5 + nc + nm), and the prototypes
    (b, nm, 2 ny0, 2 nx0). Eval mode returns ``(decoded, protos)``: decoded (b, sum(na ny nx), 5 + nc + nm) with xywh
    in input pixels, sigmoid objectness and class scores, and the coefficients as they are (no sigmoid).

    YAML row (the reference's): ``[[17, 20, 23], 1, Segment, [nc, anchors, 32, 256]]``; the builder scales the
    prototype width ``npr`` by the width multiple (make_divisible(256 * w, 8): 64 for yolov5n) and appends ``ch``.
    """

    task = "segment"

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[nc, anchors, nm, npr]`` -> ``(nc, anchors, nm, scaled npr, source channels)``."""
        detect = Detect.yaml_args(dataclasses.replace(row, args=row.args[:2]))
        nm, npr = mask_args(row, 2)
        return RowArgs([*row.args[:2], nm, npr, detect.args[-1]], detect.repeats, 0)

    def __init__(self, nc: int = 80, anchors: Sequence[Sequence[float]] = (), nm: int = 32, npr: int = 256,
                 ch: Sequence[int] = ()) -> None:
        super().__init__(nc, anchors, ch)
        self.nm, self.npr = int(nm), int(npr)
        self.no = 5 + nc + self.nm
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)  # replaces Detect's, same place
        self.proto = Proto(ch[0], self.npr, self.nm, upsample="nearest")

    @classmethod
    def decoder(cls, nc: int, anchors: Sequence[Sequence[float]], nm: int) -> Segment:
        """A Segment head without convolutions, for its ``decode`` alone (an export whose graph ends at the raw
        maps, as NCNN's does); the caller sets ``stride``."""
        head = cls.__new__(cls)
        Detect.__init__(head, nc, anchors, ())
        head.nm, head.npr, head.no = int(nm), 0, 5 + nc + int(nm)
        return head

    @property
    def contract(self) -> OutputContract:
        return OutputContract("xywh_obj_cls", self.nc, self.nm, self.task)

    def init_biases(self, class_freq: torch.Tensor | None = None) -> None:
        """Detect's priors on objectness and the class scores only (the mask coefficients keep their init)."""
        coefficient_biases = [conv.bias.view(self.na, -1)[:, 5 + self.nc:].clone() for conv in self.m]
        super().init_biases(class_freq)
        with torch.no_grad():
            for conv, kept in zip(self.m, coefficient_biases):
                conv.bias.view(self.na, -1)[:, 5 + self.nc:] = kept

    def export_metadata(self) -> dict[str, Any]:
        return {**super().export_metadata(), **mask_metadata(self)}

    def forward(self, xs: list[torch.Tensor]) -> tuple[Any, torch.Tensor]:  # type: ignore[override]
        protos = self.proto(xs[0])
        maps = []
        for i, conv in enumerate(self.m):
            x = apply_conv(conv, xs[i])
            b, _, ny, nx = x.shape
            maps.append(x.view(b, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous())  # (b,na,ny,nx,no)
        return (maps, protos) if self.training else (self.decode(maps), protos)

    def decode(self, maps: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps -> (b, n, 5 + nc + nm): boxes and scores as Detect decodes them, the coefficients unchanged."""
        out, scored = [], 5 + self.nc
        for i, x in enumerate(maps):
            b, _, ny, nx, _ = x.shape
            grid, anchor_grid = self._grid(i, ny, nx, x)
            y = x[..., :scored].sigmoid()
            xy = (y[..., :2] * 2 - 0.5 + grid) * self.stride[i]
            wh = (y[..., 2:4] * 2) ** 2 * anchor_grid
            out.append(torch.cat((xy, wh, y[..., 4:], x[..., scored:]), -1).view(b, -1, self.no))
        return torch.cat(out, 1)


def mask_metadata(head: nn.Module) -> dict[str, Any]:
    """What a segmenter's exported file records beside the detection metadata: the coefficient count and the
    prototypes' stride (input pixels per prototype pixel: half the first level's stride)."""
    return {"task": head.task, "nm": int(head.nm), "proto_stride": float(head.stride[0]) / 2}


def coefficient_convs(ch: Sequence[int], nm: int) -> nn.ModuleList:
    """The anchor-free families' mask-coefficient branch (``cv4``): per level 3x3 Conv, 3x3 Conv, 1x1 conv to
    ``nm``, with max(ch[0] // 4, nm) hidden channels (the reference's widths)."""
    hidden = max(ch[0] // 4, nm)
    return nn.ModuleList(nn.Sequential(Conv(c, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, nm, 1))
                         for c in ch)


class AnchorFreeSegment:
    """The segment task on an anchor-free detection head (YOLOv8, YOLO11): a mixin placed before that head's class,
    ``class Segment(AnchorFreeSegment, DetectV8)``, adding a Proto (learned 2x upsample) and ``cv4``, the
    coefficient branch, registered after the base head's own modules (the reference's state-dict order).

    The base head must accept ``nc=`` and ``ch=`` keywords, keep ``nl``, ``nc`` and ``stride``, offer ``contract``
    and ``export_metadata``, and in eval mode return its decoded (b, n, 4 + nc) rows with anchor points ordered
    level by level, then row by row, then column by column (as the coefficients here are flattened).

    Train mode returns ``(base_output, coefficients (b, nm, n), protos (b, nm, h, w))``; eval mode returns
    ``(rows (b, n, 4 + nc + nm), protos)``. YAML row: ``[[15, 18, 21], 1, Segment, [nc, 32, 256]]``, the
    prototype width scaled by the builder (make_divisible(min(256, max_channels) * w, 8): 64 for the n models).
    """

    task = "segment"

    def __init__(self, nc: int = 80, nm: int = 32, npr: int = 256, ch: Sequence[int] = (),
                 **base_options: Any) -> None:
        super().__init__(nc=nc, ch=ch, **base_options)  # type: ignore[call-arg]
        self.nm, self.npr = int(nm), int(npr)
        self.proto = Proto(ch[0], self.npr, self.nm, upsample="transpose")
        self.cv4 = coefficient_convs(ch, self.nm)

    @property
    def contract(self) -> OutputContract:
        return dataclasses.replace(super().contract, extra=self.nm, task=self.task)  # type: ignore[misc]

    def export_metadata(self) -> dict[str, Any]:
        return {**super().export_metadata(), **mask_metadata(self)}  # type: ignore[misc]

    def coefficients(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The mask coefficients of every anchor point, (b, nm, n), level by level, row-major within a level."""
        return torch.cat([branch(x).flatten(2) for branch, x in zip(self.cv4, xs)], 2)

    def forward(self, xs: list[torch.Tensor]) -> tuple[Any, ...]:
        protos = self.proto(xs[0])
        coefficients = self.coefficients(xs)
        out = super().forward(list(xs))  # type: ignore[misc]  # a copy: some heads write into their input list
        if self.training:
            return out, coefficients, protos
        return torch.cat((out, coefficients.transpose(1, 2).to(out.dtype)), 2), protos


@register_module("Segment", when=_anchor_free_segment, table_name="utils.tasks.segment.head.AnchorFreeSegmentHead")
class AnchorFreeSegmentHead(AnchorFreeSegment, AnchorFreeDetect):
    """The Segment head of YOLOv8-seg and YOLO11-seg: the anchor-free Detect (YOLO11's depthwise class branch when
    a C3k2 row came before) with the prototypes and the coefficient branch. YAML row ``[[15, 18, 21], 1, Segment,
    [nc, 32, 256]]``."""

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[nc, nm, npr]`` -> ``(nc, nm, scaled npr, reg_max, depthwise_cls, source channels)``."""
        nm, npr = mask_args(row, 1)
        nc, reg_max, depthwise_cls, channels = head_args(dataclasses.replace(row, args=row.args[:1])).args
        return RowArgs([nc, nm, npr, reg_max, depthwise_cls, channels], row.repeats, 0)

    def __init__(self, nc: int = 80, nm: int = 32, npr: int = 256, reg_max: int = 16, depthwise_cls: bool = False,
                 ch: Sequence[int] = ()) -> None:
        super().__init__(nc, nm, npr, ch, reg_max=reg_max, depthwise_cls=depthwise_cls)
