"""Oriented-box heads: the anchor-free head with an angle branch (YOLOv8-obb, YOLO11-obb) and YOLO26's end-to-end
one (OBB26).

Each cell predicts the four sides of a box in the box's own (rotated) frame, the class scores and the box's angle
``r`` in radians; the box's centre is the cell centre plus the sides' offset turned by ``r``, its width and height
the sums of opposite sides (``dist2rbox``). The angle branch (``cv4``: per level 3x3 Conv, 3x3 Conv, 1x1 conv to
``ne`` = 1 value, ``max(ch[0] // 4, ne)`` hidden channels) is registered after the detection head's own modules, as
in ultralytics' files. YOLOv8/YOLO11 map the raw value into [-pi/4, 3pi/4) by ``(sigmoid - 0.25) * pi``; YOLO26 uses
the raw value (its loss handles the period).

Train mode returns the detection head's dict (models/head_anchor_free.py) plus ``angles`` (b, ne, n) in radians
(for YOLO26 ``{"one2many": ..., "one2one": ...}``, each such a dict). Eval mode returns, as ultralytics' heads do
(the output contract's layouts with the obb task's one extra column, the angle; utils/tasks/contract.py):
- anchor-free (``xywh_cls``): (b, n, 4 + nc + 1): centre x, y, width, height in input pixels, nc sigmoid class
  scores, the angle; the obb task's rotated NMS follows (utils/tasks/obb/postprocess.py);
- end-to-end (``xyxy_score_cls``): (b, k, 7) final rows: centre x, y, width, height (an oriented box's, where a
  detector's rows hold corners), score, class index, angle, best first.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from models.common import Conv
from models.head_anchor_free import AnchorFreeDetect, head_args
from models.head_end_to_end import MAX_DET, EndToEndDetect
from models.registry import ModelConfigError, Row, RowArgs, register_module
from utils.tasks.contract import OutputContract


def dist2rbox(distance: torch.Tensor, angle: torch.Tensor, anchor_points: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Sides (left, top, right, bottom) in the box's frame, its angle and the cell centres -> xywh of the rotated
    box (centre turned by the angle), along ``dim``; the angle itself is not included."""
    lt, rb = distance.chunk(2, dim)
    cos, sin = torch.cos(angle), torch.sin(angle)
    half_x, half_y = ((rb - lt) / 2).chunk(2, dim)
    x, y = half_x * cos - half_y * sin, half_x * sin + half_y * cos
    return torch.cat((torch.cat((x, y), dim) + anchor_points, lt + rb), dim)


def angle_convs(ch: Sequence[int], ne: int) -> nn.ModuleList:
    """The angle branch (``cv4``): per level 3x3 Conv, 3x3 Conv, 1x1 conv to ``ne``."""
    hidden = max(ch[0] // 4, ne)
    return nn.ModuleList(nn.Sequential(Conv(c, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, ne, 1))
                         for c in ch)


def obb_args(row: Row) -> RowArgs:
    """``[nc, ne]`` -> ``(nc, ne, reg_max, depthwise_cls, source channels)``."""
    ne = row.args[1] if len(row.args) > 1 else 1
    if isinstance(ne, bool) or not isinstance(ne, int) or ne != 1:
        raise ModelConfigError(f"{row.where}: an OBB head predicts one angle per box ([nc, 1]), got {str(ne)[:40]}")
    nc, reg_max, depthwise_cls, channels = head_args(row).args
    return RowArgs([nc, ne, reg_max, depthwise_cls, channels], row.repeats, 0)


def _anchor_free_obb(cfg: Mapping[str, Any], args: list) -> bool:
    return 1 <= len(args) <= 2 and not cfg.get("end2end")


def _end_to_end_obb(cfg: Mapping[str, Any], args: list) -> bool:
    return 1 <= len(args) <= 2 and bool(cfg.get("end2end"))


class AngleBranch:
    """The angle of every cell from an angle branch, (b, ne, n) in radians, levels P3 first (a mixin of the heads
    below: ``sigmoid_angle`` chooses the YOLOv8/YOLO11 mapping or YOLO26's raw value)."""

    sigmoid_angle = True

    def angles(self, xs: Sequence[torch.Tensor], branch: nn.ModuleList) -> torch.Tensor:
        raw = torch.cat([conv(x).flatten(2) for conv, x in zip(branch, xs)], 2)
        return (raw.sigmoid() - 0.25) * math.pi if self.sigmoid_angle else raw

    def decode_rotated(self, out: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A branch set's raw dict -> (xywh (b, 4, n) in pixels, sigmoid scores (b, nc, n), angles (b, ne, n))."""
        dist = self.dfl(out["boxes"])  # type: ignore[attr-defined]
        points = out["anchor_points"].transpose(0, 1).unsqueeze(0)
        boxes = dist2rbox(dist, out["angles"], points, dim=1) * out["stride_tensor"].transpose(0, 1)
        return boxes, out["scores"].sigmoid(), out["angles"]


@register_module("OBB", when=_anchor_free_obb, table_name="utils.tasks.obb.head.AnchorFreeOBB")
class AnchorFreeOBB(AngleBranch, AnchorFreeDetect):
    """YOLOv8-obb and YOLO11-obb (YOLO11's depthwise class branch when a C3k2 row came before). YAML row
    ``[[15, 18, 21], 1, OBB, [nc, 1]]``."""

    task = "obb"
    yaml_args = staticmethod(obb_args)

    def __init__(self, nc: int = 80, ne: int = 1, reg_max: int = 16, depthwise_cls: bool = False,
                 ch: Sequence[int] = ()) -> None:
        super().__init__(nc, reg_max, depthwise_cls, ch)
        self.ne = int(ne)
        self.cv4 = angle_convs(ch, self.ne)

    @property
    def contract(self) -> OutputContract:
        return OutputContract("xywh_cls", self.nc, extra=self.ne, task=self.task)

    def forward(self, xs: list[torch.Tensor]) -> dict[str, Any] | torch.Tensor:
        out = self.branches(xs, self.cv2, self.cv3)
        out["angles"] = self.angles(xs, self.cv4)
        return out if self.training else self.decode(out)

    def decode(self, out: dict[str, Any], xywh: bool = True) -> torch.Tensor:  # type: ignore[override]
        """The raw dict -> (b, n, 4 + nc + 1): rotated xywh in pixels, sigmoid class scores, the angle."""
        return torch.cat(self.decode_rotated(out), 1).transpose(1, 2)

    def inference_rows(self, out: dict[str, Any]) -> torch.Tensor:
        return torch.cat((out["boxes"], out["scores"], out["angles"]), 1)


@register_module("OBB26", table_name="utils.tasks.obb.head.EndToEndOBB")
@register_module("OBB", when=_end_to_end_obb, table_name="utils.tasks.obb.head.EndToEndOBB")
class EndToEndOBB(AngleBranch, EndToEndDetect):
    """YOLO26-obb: YOLO26's end-to-end head with an angle branch on each set of branches (``cv4``,
    ``one2one_cv4``), the raw angle. YAML row ``[[16, 19, 22], 1, OBB26, [nc, 1]]`` in a config with
    ``end2end: true``."""

    task = "obb"
    sigmoid_angle = False
    yaml_args = staticmethod(obb_args)

    def __init__(self, nc: int = 80, ne: int = 1, reg_max: int = 16, depthwise_cls: bool = True,
                 ch: Sequence[int] = (), max_det: int = MAX_DET) -> None:
        super().__init__(nc, reg_max, depthwise_cls, ch, max_det)
        self.ne = int(ne)
        self.cv4 = angle_convs(ch, self.ne)
        self.one2one_cv4 = copy.deepcopy(self.cv4)

    @property
    def contract(self) -> OutputContract:
        return OutputContract("xyxy_score_cls" if self.end_to_end else "xywh_cls", self.nc, extra=self.ne,
                              task=self.task)

    def rotated_branches(self, xs: list[torch.Tensor], one2one: bool) -> dict[str, Any]:
        """The raw dict of one set of branches with its angles (the one-to-one set reads detached features)."""
        if one2one:
            xs = [x.detach() for x in xs] if self.training else xs
            out = self.branches(xs, self.one2one_cv2, self.one2one_cv3)
            out["angles"] = self.angles(xs, self.one2one_cv4)
        else:
            out = self.branches(xs, self.cv2, self.cv3)
            out["angles"] = self.angles(xs, self.cv4)
        return out

    def forward(self, xs: list[torch.Tensor]) -> dict[str, Any] | torch.Tensor:
        if self.training:
            return {"one2many": self.rotated_branches(xs, False), "one2one": self.rotated_branches(xs, True)}
        if not self.end_to_end:
            return self.decode_one2many(xs)
        boxes, scores, angles = self.decode_rotated(self.rotated_branches(xs, True))
        rows = self.select(torch.cat((boxes, angles, scores), 1).transpose(1, 2), box_columns=5)  # xywhr, score, cls
        return torch.cat((rows[..., :4], rows[..., 5:7], rows[..., 4:5]), -1)  # xywh, score, cls, angle

    def decode_one2many(self, xs: list[torch.Tensor], xywh: bool = True) -> torch.Tensor:
        """The one-to-many branches decoded as an anchor-free OBB head's output (b, n, 4 + nc + 1), for NMS."""
        return torch.cat(self.decode_rotated(self.rotated_branches(xs, False)), 1).transpose(1, 2)

    def decode_one2one(self, xs: list[torch.Tensor], xywh: bool = True) -> torch.Tensor:
        """The one-to-one branches decoded, before selection: (b, n, 4 + nc + 1)."""
        return torch.cat(self.decode_rotated(self.rotated_branches(xs, True)), 1).transpose(1, 2)

    def inference_rows(self, out: dict[str, Any]) -> torch.Tensor:
        branch = out["one2one" if self.end_to_end else "one2many"]
        return torch.cat((branch["boxes"], branch["scores"], branch["angles"]), 1)
