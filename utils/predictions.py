"""What a head's inference output holds (OutputContract), and the one post-processing call every consumer uses.

Every head, in eval mode, returns its detections as one tensor (b, n, columns) whose row layout is named by its
contract; a segmentation head also returns its prototypes (b, nm, h, w) as a second output. detect.py, test.py and
training's validation, the hub model, the trackers' image logging and every exported format turn that tensor into
per-image detections through ``postprocess``, reading the layout from the model's head or from the exported file's
metadata (``OutputContract.metadata()`` / ``from_metadata``), never by testing which head made it.

Layouts (columns of one row):
- ``xywh_obj_cls``: centre x, y, width, height in input pixels, objectness, nc class scores (YOLOv5: conf is
  objectness x class score), then nm mask coefficients;
- ``xywh_cls``: centre x, y, width, height, nc class scores (anchor-free heads: YOLOv8, YOLO11), then nm
  coefficients; NMS follows;
- ``xyxy_score_cls``: x1, y1, x2, y2, score, class index, then nm coefficients: already final (end-to-end heads
  such as YOLO26's), so no NMS: only the threshold, the class filter and ``max_det``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from utils.boxes import non_max_suppression
from utils.errors import UserError

LAYOUTS = ("xywh_obj_cls", "xywh_cls", "xyxy_score_cls")
MAX_CLASSES = 10_000
MAX_MASKS = 256


class ContractError(UserError, ValueError):
    """An output contract (from metadata or a model) that cannot be honoured; one line."""


@dataclass(frozen=True)
class OutputContract:
    """The row layout of a head's inference output (see the module docstring), its class and mask-coefficient
    counts."""

    layout: str = "xywh_obj_cls"
    nc: int = 80
    nm: int = 0  # mask coefficients after the class columns; the prototypes are the head's second output

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ContractError(f"output layout {str(self.layout)[:40]!r} is not one of {', '.join(LAYOUTS)}")
        for name, value, top in (("nc", self.nc, MAX_CLASSES), ("nm", self.nm, MAX_MASKS)):
            if isinstance(value, bool) or not isinstance(value, int) or not (name == "nm" or value >= 1) \
                    or not 0 <= value <= top:
                raise ContractError(f"output contract: {name} must be an integer in {int(name == 'nc')}..{top}, "
                                    f"got {str(value)[:40]}")

    @property
    def end_to_end(self) -> bool:
        """True when the rows are final detections (no NMS)."""
        return self.layout == "xyxy_score_cls"

    @property
    def columns(self) -> int:
        """The width of one row."""
        if self.end_to_end:
            return 6 + self.nm
        return 4 + (self.layout == "xywh_obj_cls") + self.nc + self.nm

    def check(self, pred: Any, where: str = "model output") -> None:
        """Refuse, in one line, an output that is not (b, n, columns) (a stranger's exported file, a wrong head)."""
        shape = tuple(getattr(pred, "shape", ()))
        if len(shape) != 3 or shape[2] != self.columns:
            raise ContractError(f"{where} has shape {shape}; its contract ({self.layout}, nc {self.nc}, nm {self.nm}) "
                                f"needs (batch, boxes, {self.columns})")

    def metadata(self) -> dict[str, Any]:
        """Plain values for a checkpoint's or an exported file's metadata."""
        return asdict(self)

    @classmethod
    def from_metadata(cls, meta: Any, nc: int | None = None) -> OutputContract:
        """The contract an exported file or checkpoint recorded; files from before contracts existed were YOLOv5
        detectors (``xywh_obj_cls`` with ``nc`` classes)."""
        if meta is None:
            if nc is None:
                raise ContractError("no output contract recorded and no class count to assume YOLOv5's")
            return cls("xywh_obj_cls", nc, 0)
        if not isinstance(meta, dict) or set(meta) - {"layout", "nc", "nm"}:
            raise ContractError(f"output contract must be a mapping of layout, nc, nm; got {str(meta)[:80]}")
        return cls(meta.get("layout", "xywh_obj_cls"), meta.get("nc", nc), meta.get("nm", 0))


def postprocess(pred: torch.Tensor, contract: OutputContract, conf_thres: float = 0.25, iou_thres: float = 0.45,
                classes: list[int] | None = None, agnostic: bool = False, multi_label: bool = False,
                max_det: int = 300, max_nms: int = 30000) -> list[torch.Tensor]:
    """A head's decoded output -> per image (k, 6 + nm) [x1, y1, x2, y2, conf, cls, mask coefficients...], best
    first: NMS for ``xywh_*`` layouts (utils.boxes.non_max_suppression), thresholds only for end-to-end rows."""
    contract.check(pred)
    if contract.end_to_end:
        return [_final_rows(image, conf_thres, classes, max_det) for image in pred]
    return non_max_suppression(pred, conf_thres, iou_thres, classes, agnostic, multi_label, max_det, max_nms,
                               objectness=contract.layout == "xywh_obj_cls", num_classes=contract.nc)


def _final_rows(rows: torch.Tensor, conf_thres: float, classes: list[int] | None, max_det: int) -> torch.Tensor:
    """An end-to-end head's rows of one image (n, 6 + nm) above the threshold and in ``classes``, best first."""
    keep = rows[:, 4] > conf_thres
    if classes is not None:
        keep &= (rows[:, 5:6] == torch.tensor(classes, device=rows.device, dtype=rows.dtype)).any(1)
    rows = rows[keep]
    order = rows[:, 4].argsort(descending=True, stable=True)[:max_det]
    return rows[order]
