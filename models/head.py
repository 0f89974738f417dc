"""The Detect head: per-level 1x1 convolutions, anchors and strides as buffers, the box decode.

In eval mode the head decodes its maps into ``(b, n, 5 + nc)`` boxes (centre, size in input pixels, objectness,
class scores); in train mode it returns the raw maps the loss reads.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from models.common import apply_conv, autocasting, exporting, linear_rows, pixel_matrix, pixel_rows
from models.registry import LIMITS, ModelConfigError, Row, RowArgs, is_number, register_module
from utils.tasks.contract import OutputContract


def _has_anchors(cfg: Any, args: list) -> bool:
    """A ``Detect`` row of the YOLOv5 family: it passes anchors (``[nc, anchors]``)."""
    return len(args) >= 2


@register_module("Detect", when=_has_anchors, table_name="models.yolo.Detect")
class Detect(nn.Module):
    """Per-level 1x1 convolutions to ``na * (5 + nc)`` channels; decodes boxes in eval mode.

    ``anchors`` (nl, na, 2) in input pixels and ``stride`` (nl,) are buffers: they follow
    ``.to()`` and are saved in the state dict. Training mode returns the raw maps, a list of
    (b, na, ny, nx, 5 + nc); eval mode returns decoded (b, sum(na*ny*nx), 5 + nc) with
    xywh in input pixels and sigmoid objectness and class scores.

    The head interface every head offers (callers ask it, never test which head it is): ``family`` (whose loss,
    assigner and recipe train it), ``task``, ``anchor_based`` (anchors, autoanchor and objectness exist only then),
    ``contract`` (the row layout of the eval output, utils.tasks.contract), ``init_biases`` and ``export_metadata``.
    """

    family = "yolov5"
    task = "detect"
    anchor_based = True

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[nc, anchors]`` -> ``(nc, anchors, source channels)``; anchors are per-level pixel lists, one level per
        source."""
        anchors = row.args[1]
        if not (isinstance(anchors, list) and 0 < len(anchors) <= LIMITS["levels"] and all(
                isinstance(a, list) and len(a) % 2 == 0 and 0 < len(a) <= 2 * LIMITS["anchors"] and all(
                    is_number(v) and 0 < v <= 1e5 for v in a) for a in anchors)):
            raise ModelConfigError(f"{row.where}: anchors must be a list of per-level [w1, h1, w2, h2, ...] pixel "
                                   f"lists (at most {LIMITS['levels']} levels of {LIMITS['anchors']} positive sizes)")
        if len({len(a) for a in anchors}) != 1:
            raise ModelConfigError(f"{row.where}: every anchor level needs the same number of anchors")
        if len(anchors) != len(row.channels_in):
            raise ModelConfigError(f"{row.where}: Detect has {len(row.channels_in)} inputs but {len(anchors)} anchor "
                                   "levels")
        return RowArgs([*row.args, list(row.channels_in)], row.repeats, 0)

    def __init__(self, nc: int = 80, anchors: Sequence[Sequence[float]] = (), ch: Sequence[int] = ()) -> None:
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        self.register_buffer("anchors", torch.tensor(anchors, dtype=torch.float32).view(self.nl, self.na, 2))
        self.register_buffer("stride", torch.zeros(self.nl))
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
        self._grids: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def contract(self) -> OutputContract:
        return OutputContract("xywh_obj_cls", self.nc)

    def set_strides(self, stride: torch.Tensor) -> None:
        """The builder's dry run found the strides: keep them and order the anchors to grow with them."""
        with torch.no_grad():
            self.stride.copy_(stride)
        check_anchor_order(self)

    def init_biases(self, class_freq: torch.Tensor | None = None) -> None:
        """Objectness prior of ~8 objects per 640 px image; class prior 0.6/nc (or class frequencies).
        Needs ``stride`` set (the builder's dry run)."""
        with torch.no_grad():
            for conv, s in zip(self.m, self.stride):
                b = conv.bias.view(self.na, -1)
                b[:, 4] += math.log(8 / (640 / float(s)) ** 2)
                if class_freq is None:
                    b[:, 5:] += math.log(0.6 / (self.nc - 0.99))
                else:
                    b[:, 5:] += torch.log(class_freq / class_freq.sum())

    def export_metadata(self) -> dict[str, Any]:
        """What an exported file records for its consumers: the output contract, strides and anchors (pixels)."""
        return {"contract": self.contract.metadata(), "stride": [float(s) for s in self.stride],
                "anchors": self.anchors.tolist()}

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor] | torch.Tensor:
        if not self.training and self._decode_in_place_ok(xs):
            return self.decode_into(xs, convs=self.m)
        maps = []
        for i, conv in enumerate(self.m):
            x = apply_conv(conv, xs[i])
            b, _, ny, nx = x.shape
            maps.append(x.view(b, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous())  # (b,na,ny,nx,no)
        return maps if self.training else self.decode(maps)

    @staticmethod
    def _decode_in_place_ok(xs: list[torch.Tensor]) -> bool:
        """In-place decoding needs no autograd and no tracer (an export keeps the shape-generic ``decode``)."""
        if exporting():
            return False
        return not (torch.is_grad_enabled() and any(x.requires_grad for x in xs))

    def decode_into(self, outputs: list[torch.Tensor], convs: Sequence[nn.Conv2d] | None = None) -> torch.Tensor:
        """The conv outputs (b, na * no, ny, nx) -> ``decode``'s result, written in one buffer without autograd:
        one permuted copy and an in-place sigmoid per level instead of copies, slices and two concatenations.
        With ``convs``, ``outputs`` are their inputs and the products are written into the buffer (no copy)."""
        b = outputs[0].shape[0]
        total = sum(self.na * x.shape[-2] * x.shape[-1] for x in outputs)
        out = torch.empty(b, total, self.no, device=outputs[0].device, dtype=outputs[0].dtype)
        start = 0
        for i, x in enumerate(outputs):
            _, _, ny, nx = x.shape
            cells = out[:, start:start + self.na * ny * nx].view(b, self.na, ny, nx, self.no)
            start += self.na * ny * nx
            if (convs is not None and pixel_rows(x) and convs[i].kernel_size == (1, 1)
                    and x.dtype == convs[i].weight.dtype and not autocasting(x)):
                self._products_into(cells, convs[i], x)
            else:
                x = x if convs is None else apply_conv(convs[i], x)
                cells.copy_(x.view(b, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2))
            cells.sigmoid_()  # over the contiguous buffer, not a strided view
            grid, anchor_grid = self._grid(i, ny, nx, x)
            xy, wh = cells[..., :2], cells[..., 2:4]
            xy.mul_(2).sub_(0.5).add_(grid).mul_(self.stride[i])
            wh.mul_(2).square_().mul_(anchor_grid)
        return out

    def _products_into(self, cells: torch.Tensor, conv: nn.Conv2d, x: torch.Tensor) -> None:
        """``cells`` (b, na, ny, nx, no) = the 1x1 ``conv`` of the channels_last ``x``, one matrix product per image
        and anchor written in place: the product's (pixels, na * no) layout never has to be permuted."""
        cells_per_image = x.size(2) * x.size(3)
        rows = pixel_matrix(x)
        weight = conv.weight.view(self.na, self.no, -1)
        bias = conv.bias.view(self.na, self.no) if conv.bias is not None else [None] * self.na
        for image in range(x.size(0)):
            pixels = rows[image * cells_per_image:(image + 1) * cells_per_image]
            for anchor in range(self.na):
                linear_rows(pixels, weight[anchor], bias[anchor], out=cells[image, anchor].view(cells_per_image, -1))

    def decode(self, maps: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps -> (b, n, 5 + nc): centre xy and wh in input pixels, then sigmoid scores."""
        out = []
        for i, x in enumerate(maps):
            b, _, ny, nx, _ = x.shape
            grid, anchor_grid = self._grid(i, ny, nx, x)
            y = x.sigmoid()
            xy = (y[..., :2] * 2 - 0.5 + grid) * self.stride[i]
            wh = (y[..., 2:4] * 2) ** 2 * anchor_grid
            out.append(torch.cat((xy, wh, y[..., 4:]), -1).view(b, -1, self.no))
        return torch.cat(out, 1)

    def _grid(self, level: int, ny: int, nx: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell offsets (1, 1, ny, nx, 2) and anchor sizes (1, na, 1, 1, 2), cached per map size.

        While tracing for export the grid is rebuilt from the shapes, so dynamic sizes stay dynamic.
        """
        tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
        key = (level, ny, nx, like.device, like.dtype)
        if not tracing and key in self._grids:
            return self._grids[key]
        ys = torch.arange(ny, device=like.device, dtype=like.dtype)
        xs = torch.arange(nx, device=like.device, dtype=like.dtype)
        yv, xv = torch.meshgrid(ys, xs, indexing="ij")
        grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2)
        anchor_grid = self.anchors[level].to(like.dtype).view(1, self.na, 1, 1, 2)
        if not tracing:
            self._grids[key] = (grid, anchor_grid)
        return grid, anchor_grid

    def clear_grid_cache(self) -> None:
        """Forget cached grids (call after the anchors change, e.g. after autoanchor)."""
        self._grids.clear()

    def _apply(self, fn, recurse: bool = True):  # .to()/.half(): cached grids would be stale
        self._grids = {}
        return super()._apply(fn, recurse)

    def __deepcopy__(self, memo: dict) -> Detect:
        clone = copy.copy(self)
        memo[id(self)] = clone
        clone.__dict__ = {k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "_grids"}
        clone._grids = {}
        return clone


def check_anchor_order(detect: Detect) -> None:
    """Anchors must grow with stride (P3 smallest); flip them when the YAML lists them the other way."""
    area = detect.anchors.prod(-1).mean(-1)  # (nl,)
    if (area[-1] - area[0]).sign() != (detect.stride[-1] - detect.stride[0]).sign():
        detect.anchors.copy_(detect.anchors.flip(0))
