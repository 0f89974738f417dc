"""YOLO26's end-to-end detection head: the anchor-free head with a second, one-to-one set of branches whose
top-scoring rows are the final detections (no NMS).

Training trains both sets: the one-to-many branches (``cv2``/``cv3``, each object assigned to its top 10 cells, as
YOLOv8 does) and the one-to-one branches (``one2one_cv2``/``one2one_cv3``, each object assigned to one cell) on
features detached from the network, so only the one-to-many loss shapes the backbone. Train mode returns
``{"one2many": dict, "one2one": dict}`` (each the dict models/head_anchor_free.py describes). Eval mode (and
export) runs the one-to-one branches alone and returns final rows (b, k, 6): x1, y1, x2, y2 in input pixels, score,
class index, best first, k = min(max_det, cells) (the ``xyxy_score_cls`` contract).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from models.head_anchor_free import AnchorFreeDetect, head_args
from models.registry import register_module
from utils.tasks.contract import OutputContract

MAX_DET = 300  # final rows per image (ultralytics' default)


def _end_to_end(cfg: Mapping[str, Any], args: list) -> bool:
    """A ``Detect`` row without anchors in a config with ``end2end: true``."""
    return len(args) == 1 and bool(cfg.get("end2end"))


@register_module("Detect", when=_end_to_end, table_name="models.head_end_to_end.EndToEndDetect")
class EndToEndDetect(AnchorFreeDetect):
    """The anchor-free head plus one-to-one copies of its branches (see the module docstring)."""

    family = "yolo26"
    yaml_args = staticmethod(head_args)

    def __init__(self, nc: int = 80, reg_max: int = 16, depthwise_cls: bool = True, ch: Sequence[int] = (),
                 max_det: int = MAX_DET) -> None:
        super().__init__(nc, reg_max, depthwise_cls, ch)
        self.one2one_cv2 = copy.deepcopy(self.cv2)
        self.one2one_cv3 = copy.deepcopy(self.cv3)
        self.max_det = max_det
        self.end_to_end = True  # eval output: final one-to-one rows (False: the one-to-many decode, for NMS)

    @property
    def contract(self) -> OutputContract:
        return OutputContract("xyxy_score_cls" if self.end_to_end else "xywh_cls", self.nc)

    def init_biases(self, class_freq: torch.Tensor | None = None) -> None:
        """Both sets of branches start from the same priors (see AnchorFreeDetect.init_biases)."""
        self._init_branch_biases(self.cv2, self.cv3, class_freq)
        self._init_branch_biases(self.one2one_cv2, self.one2one_cv3, class_freq)

    def export_metadata(self) -> dict[str, Any]:
        return {**super().export_metadata(), "max_det": int(self.max_det)}

    def forward(self, xs: list[torch.Tensor]) -> dict[str, Any] | torch.Tensor:
        if self.training:
            return {"one2many": self.branches(xs, self.cv2, self.cv3),
                    "one2one": self.branches([x.detach() for x in xs], self.one2one_cv2, self.one2one_cv3)}
        if not self.end_to_end:
            return self.decode_one2many(xs)
        return self.select(self.decode_one2one(xs))

    def inference_rows(self, out: dict[str, Any]) -> torch.Tensor:
        """The raw rows of the branches eval mode runs (one-to-one, or one-to-many without end_to_end)."""
        return super().inference_rows(out["one2one" if self.end_to_end else "one2many"])

    def decode_one2one(self, xs: list[torch.Tensor], xywh: bool = False) -> torch.Tensor:
        """The one-to-one branches decoded, before selection: (b, n, 4 + nc), boxes xyxy (or xywh) in pixels."""
        return self.decode(self.branches(xs, self.one2one_cv2, self.one2one_cv3), xywh=xywh)

    def decode_one2many(self, xs: list[torch.Tensor], xywh: bool = True) -> torch.Tensor:
        """The one-to-many branches decoded as an anchor-free head's output (b, n, 4 + nc), xywh (for NMS; the
        output of ultralytics 8.4's fixture files, tests/fixtures/ultralytics)."""
        return self.decode(self.branches(xs, self.cv2, self.cv3), xywh=xywh)

    def select(self, decoded: torch.Tensor, extra: torch.Tensor | None = None, box_columns: int = 4) -> torch.Tensor:
        """(b, n, 4 + nc) xyxy rows -> the (b, k, 6) best (box, class) pairs: the k cells with the highest class
        score, then the k highest scores among their nc classes each (a cell may appear with two classes); a task's
        columns ``extra`` (b, n, e) (keypoints, mask coefficients) follow their cell: (b, k, 6 + e). Given apart,
        not concatenated to the rows and split again: OpenVINO 2026's CPU plugin merges such a concat and split
        into a wrong shape. A box of ``box_columns`` values (5: a rotated box's xywhr) gives (b, k, box_columns + 2)."""
        b, n, _ = decoded.shape
        k = min(self.max_det, n)
        boxes, scores = decoded.split((box_columns, self.nc), dim=-1)
        cells = scores.amax(-1).topk(k, dim=1).indices  # (b, k)
        scores = scores.gather(1, cells.unsqueeze(-1).expand(-1, -1, self.nc))  # (b, k, nc)
        top, flat = scores.flatten(1).topk(k, dim=1)  # (b, k)
        cell = cells.gather(1, (flat // self.nc).long())  # (b, k) indices into n (long: Core ML divides in float)
        boxes = boxes.gather(1, cell.unsqueeze(-1).expand(-1, -1, box_columns))
        rows = [boxes, top.unsqueeze(-1), (flat % self.nc).unsqueeze(-1).to(boxes.dtype)]
        if extra is not None:
            rows.append(extra.gather(1, cell.unsqueeze(-1).expand(-1, -1, extra.shape[-1])))
        return torch.cat(rows, -1)
