"""The anchor-free detection head of YOLOv8 and YOLO11: per level a box branch and a class branch, box sides as a
distribution over ``reg_max`` bins (DFL), decoded around each cell's centre.

Train mode returns what the loss reads (utils/training/loss_anchor_free.py), a dict:
``boxes`` (b, 4 * reg_max, n) raw side distributions, ``scores`` (b, nc, n) class logits, ``anchor_points`` (n, 2)
cell centres in grid units, ``stride_tensor`` (n, 1) and ``feature_sizes`` [(h, w) per level], n = cells of all
levels, P3 first. Eval mode (and export) returns the decoded (b, n, 4 + nc): centre x, y, width, height in input
pixels, then the sigmoid class scores (the ``xywh_cls`` contract; NMS follows).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from models.blocks import DEPTHWISE_CLS_HEAD, DWConv
from models.common import Conv, exporting
from models.registry import LIMITS, ModelConfigError, Row, RowArgs, register_module
from utils.tasks.contract import OutputContract


def make_anchors(sizes: Sequence[tuple[int, int]], strides: Sequence[float] | torch.Tensor, offset: float = 0.5,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell centres (n, 2) as (x, y) in grid units of their level and each cell's stride (n, 1), for feature maps
    of ``sizes`` [(h, w), ...] with ``strides`` (numbers, or a tensor such as the head's buffer, read by tensor
    arithmetic only, so torch.export does not treat its values as data to branch on), row-major per level, P3
    first."""
    points, stride_rows = [], []
    for (h, w), stride in zip(sizes, strides):
        ys = torch.arange(h, device=device, dtype=dtype) + offset
        xs = torch.arange(w, device=device, dtype=dtype) + offset
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), -1).view(-1, 2))
        stride_rows.append(torch.ones_like(points[-1][:, :1]) * stride)  # sizes may be traced (dynamic)
    return torch.cat(points), torch.cat(stride_rows)


def dist2bbox(distance: torch.Tensor, anchor_points: torch.Tensor, xywh: bool = True, dim: int = -1) -> torch.Tensor:
    """Distances (left, top, right, bottom) from ``anchor_points`` -> boxes (xywh, or xyxy), along ``dim``."""
    lt, rb = distance.chunk(2, dim)
    x1y1, x2y2 = anchor_points - lt, anchor_points + rb
    if xywh:
        return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)
    return torch.cat((x1y1, x2y2), dim)


class DFL(nn.Module):
    """The expected value of each box side's distribution over ``bins`` (a softmax, then a fixed 1x1 convolution
    with weights 0 .. bins - 1, a parameter that is not trained: release files hold it)."""

    def __init__(self, bins: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(bins, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([float(i) for i in range(bins)]).view(1, bins, 1, 1))
        self.c1 = bins  # the attribute name ultralytics' files hold

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, 4 * bins, n) -> (b, 4, n)
        b, _, n = x.shape
        probs = x.view(b, 4, self.c1, n).softmax(2)
        return (probs * self.conv.weight.view(1, 1, self.c1, 1).to(probs.dtype)).sum(2)


def _anchor_free(cfg: Mapping[str, Any], args: list) -> bool:
    """A ``Detect`` row without anchors in a config that is not end-to-end."""
    return len(args) == 1 and not cfg.get("end2end")


def head_args(row: Row) -> RowArgs:
    """``[nc]`` -> ``(nc, reg_max, depthwise_cls, source channels)``: ``reg_max`` from the config (16 if absent),
    the depthwise class branch when a C3k2 row came before (as ultralytics' builder decides it)."""
    reg_max = row.cfg.get("reg_max", 16)
    if isinstance(reg_max, bool) or not isinstance(reg_max, int) or not 1 <= reg_max <= LIMITS["reg_max"]:
        raise ModelConfigError(f"{row.where}: reg_max must be an integer in 1..{LIMITS['reg_max']}, got "
                               f"{str(reg_max)[:40]}")
    if not 1 <= len(row.channels_in) <= LIMITS["levels"]:
        raise ModelConfigError(f"{row.where}: a head takes 1..{LIMITS['levels']} input levels")
    return RowArgs([row.args[0], reg_max, bool(row.notes.get(DEPTHWISE_CLS_HEAD)), list(row.channels_in)],
                   row.repeats, 0)


@register_module("Detect", when=_anchor_free, table_name="models.head_anchor_free.AnchorFreeDetect")
class AnchorFreeDetect(nn.Module):
    """Per level: a box branch (two 3x3 Convs, a 1x1 to 4 * reg_max) and a class branch (two 3x3 Convs, or with
    ``depthwise_cls`` two depthwise-3x3 + 1x1 pairs, then a 1x1 to nc). See the module docstring for the outputs.

    The head interface (models/head.py's Detect has the same): ``family``, ``task``, ``anchor_based``,
    ``contract``, ``stride`` (a buffer set by the builder), ``init_biases``, ``export_metadata``.
    """

    task = "detect"
    anchor_based = False
    yaml_args = staticmethod(head_args)

    def __init__(self, nc: int = 80, reg_max: int = 16, depthwise_cls: bool = False, ch: Sequence[int] = ()) -> None:
        super().__init__()
        self.nc, self.nl, self.reg_max = nc, len(ch), reg_max
        self.no = nc + 4 * reg_max
        self.depthwise_cls = bool(depthwise_cls)
        self.register_buffer("stride", torch.zeros(self.nl))
        c_box, c_cls = max(16, ch[0] // 4, 4 * reg_max), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(c, c_box, 3), Conv(c_box, c_box, 3), nn.Conv2d(c_box, 4 * reg_max, 1)) for c in ch)
        self.cv3 = nn.ModuleList(self._cls_branch(c, c_cls) for c in ch)
        self.dfl = DFL(reg_max) if reg_max > 1 else nn.Identity()
        self._anchors: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _cls_branch(self, c_in: int, hidden: int) -> nn.Sequential:
        if self.depthwise_cls:  # YOLO11, YOLO26
            return nn.Sequential(nn.Sequential(DWConv(c_in, c_in, 3), Conv(c_in, hidden, 1)),
                                 nn.Sequential(DWConv(hidden, hidden, 3), Conv(hidden, hidden, 1)),
                                 nn.Conv2d(hidden, self.nc, 1))
        return nn.Sequential(Conv(c_in, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, self.nc, 1))

    @property
    def family(self) -> str:
        """The family whose loss and recipe train this head: YOLO11's has the depthwise class branch."""
        return "yolo11" if self.depthwise_cls else "yolov8"

    @property
    def contract(self) -> OutputContract:
        return OutputContract("xywh_cls", self.nc)

    def set_strides(self, stride: torch.Tensor) -> None:
        """The builder's dry run found the strides."""
        with torch.no_grad():
            self.stride.copy_(stride)
        self.clear_grid_cache()

    def init_biases(self, class_freq: torch.Tensor | None = None) -> None:
        """Box sides start at 2 cells; class logits at ~5 objects per 640 px image spread over the classes (or in
        proportion to ``class_freq``). Needs ``stride`` set (the builder's dry run)."""
        self._init_branch_biases(self.cv2, self.cv3, class_freq)

    def _init_branch_biases(self, box_branches: nn.ModuleList, cls_branches: nn.ModuleList,
                            class_freq: torch.Tensor | None) -> None:
        share = (torch.full((self.nc,), 1.0 / self.nc) if class_freq is None
                 else class_freq.float() / class_freq.float().sum())
        with torch.no_grad():
            for box, cls, s in zip(box_branches, cls_branches, self.stride):
                box[-1].bias.fill_(2.0)
                cls[-1].bias.copy_(torch.log(5 * share.clamp(min=1e-12) / (640 / float(s)) ** 2))

    def export_metadata(self) -> dict[str, Any]:
        """What an exported file records for its consumers: the output contract, strides and DFL bins."""
        return {"contract": self.contract.metadata(), "stride": [float(s) for s in self.stride],
                "reg_max": int(self.reg_max)}

    def forward(self, xs: list[torch.Tensor]) -> dict[str, Any] | torch.Tensor:
        out = self.branches(xs, self.cv2, self.cv3)
        return out if self.training else self.decode(out)

    def inference_rows(self, out: dict[str, Any]) -> torch.Tensor:
        """A train-mode output -> the raw rows eval mode decodes, (b, 4 * reg_max + nc, n), levels P3 first: where
        an export whose decode runs outside its graph ends (NCNN of YOLO26, utils/deploy/head_maps.py)."""
        return torch.cat((out["boxes"], out["scores"]), 1)

    def branches(self, xs: list[torch.Tensor], box_branches: nn.ModuleList,
                 cls_branches: nn.ModuleList) -> dict[str, Any]:
        """The raw outputs of one set of branches over the levels ``xs`` (the train-mode dict)."""
        b = xs[0].shape[0]
        boxes = torch.cat([box(x).reshape(b, 4 * self.reg_max, -1) for box, x in zip(box_branches, xs)], 2)
        scores = torch.cat([cls(x).reshape(b, self.nc, -1) for cls, x in zip(cls_branches, xs)], 2)
        sizes = [(int(x.shape[2]), int(x.shape[3])) for x in xs]
        points, strides = self.anchors(sizes, boxes, xs)
        return {"boxes": boxes, "scores": scores, "anchor_points": points, "stride_tensor": strides,
                "feature_sizes": sizes}

    def anchors(self, sizes: list[tuple[int, int]], like: torch.Tensor,
                maps: Sequence[torch.Tensor] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """``make_anchors`` for these feature sizes, cached; while tracing rebuilt from the feature ``maps``' own
        (traced) sizes, so an export with dynamic sizes computes them from its input.

        Float32 (cell centres of large maps are not exact in bf16 or fp16), except in an export, whose graph keeps
        the model's own dtype."""
        tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
        dtype = like.dtype if exporting() else torch.float32
        key = (tuple(sizes), like.device, dtype) if not tracing else None
        if not tracing and key in self._anchors:
            return self._anchors[key]
        if tracing and maps:
            sizes = [(m.shape[2], m.shape[3]) for m in maps]  # traced sizes, not constants
        found = make_anchors(sizes, self.stride, 0.5, like.device, dtype)
        if not tracing:
            self._anchors[key] = found
        return found

    def decode(self, out: dict[str, Any], xywh: bool = True) -> torch.Tensor:
        """The raw dict -> (b, n, 4 + nc): boxes in input pixels (xywh, or xyxy), then sigmoid class scores."""
        dist = self.dfl(out["boxes"])  # (b, 4, n) in grid units
        points = out["anchor_points"].transpose(0, 1).unsqueeze(0)  # (1, 2, n)
        boxes = dist2bbox(dist, points, xywh=xywh, dim=1) * out["stride_tensor"].transpose(0, 1)
        return torch.cat((boxes, out["scores"].sigmoid()), 1).transpose(1, 2)

    def clear_grid_cache(self) -> None:
        """Forget cached anchor points (after the strides change)."""
        self._anchors.clear()

    def _apply(self, fn: Any, recurse: bool = True) -> Any:  # .to()/.half(): cached anchors would be stale
        self._anchors = {}
        return super()._apply(fn, recurse)

    def __deepcopy__(self, memo: dict) -> AnchorFreeDetect:
        clone = copy.copy(self)
        memo[id(self)] = clone
        clone.__dict__ = {k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "_anchors"}
        clone._anchors = {}
        return clone
