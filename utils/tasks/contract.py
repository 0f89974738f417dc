"""What a head's inference output holds (OutputContract), and the one post-processing call every consumer uses.

Every head, in eval mode, returns its detections as one tensor (b, n, columns) whose row layout is named by its
contract, followed by the other outputs its task declares (a segmenter's prototypes (b, nm, h, w); see
utils/tasks/registry.py, ``Task.outputs``). detect.py, test.py and training's validation, the hub model, the
trackers' image logging and every exported format turn that tensor into per-image detections through
``postprocess``, reading the layout from the model's head or from the exported file's metadata
(``OutputContract.metadata()`` / ``from_metadata``), never by testing which head made it.

Layouts (columns of one row):
- ``xywh_obj_cls``: centre x, y, width, height in input pixels, objectness, nc class scores (YOLOv5: conf is
  objectness x class score), then the task's ``extra`` columns;
- ``xywh_cls``: centre x, y, width, height, nc class scores (anchor-free heads: YOLOv8, YOLO11), then the
  ``extra`` columns; NMS follows;
- ``xyxy_score_cls``: x1, y1, x2, y2, score, class index, then the ``extra`` columns: already final (end-to-end
  heads such as YOLO26's), so no NMS: only the threshold, the class filter and ``max_det``;
- ``probs``: no rows at all, one (b, nc) tensor of class probabilities per batch (a classifier): its task
  post-processes it (``Task.postprocess``), as there are no boxes to suppress.

The ``extra`` columns are the task's (``task``: a registered task; its ``columns`` say what they hold: a
segmenter's mask coefficients); post-processing carries them along with their rows, and a task with its own
``postprocess`` (rotated NMS) replaces the layout's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from utils.boxes import non_max_suppression
from utils.errors import UserError
from utils.tasks.registry import BASE_TASK, TaskError, all_tasks, get_task

LAYOUTS = ("xywh_obj_cls", "xywh_cls", "xyxy_score_cls", "probs")
MAX_CLASSES = 10_000
MAX_EXTRA = 1024  # a task's extra columns per row (mask coefficients, keypoints x 3, an angle)
METADATA_KEYS = ("layout", "nc", "extra", "task")


class ContractError(UserError, ValueError):
    """An output contract (from metadata or a model) that cannot be honoured; one line."""


@dataclass(frozen=True)
class OutputContract:
    """The row layout of a head's inference output (see the module docstring): its class count, and the ``extra``
    columns of its ``task`` after the class scores."""

    layout: str = "xywh_obj_cls"
    nc: int = 80
    extra: int = 0  # the task's columns after the class scores (its other outputs follow the rows)
    task: str = BASE_TASK

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ContractError(f"output layout {str(self.layout)[:40]!r} is not one of {', '.join(LAYOUTS)}")
        for name, value, low, top in (("nc", self.nc, 1, MAX_CLASSES), ("extra", self.extra, 0, MAX_EXTRA)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top:
                raise ContractError(f"output contract: {name} must be an integer in {low}..{top}, "
                                    f"got {str(value)[:40]}")
        try:
            task = get_task(self.task)
        except TaskError as e:
            raise ContractError(f"output contract: {e}") from None
        if self.extra and not task.columns:
            raise ContractError(f"output contract: the {task.name} task has no extra columns, got {self.extra}")

    @property
    def end_to_end(self) -> bool:
        """True when the rows are final detections (no NMS)."""
        return self.layout == "xyxy_score_cls"

    @property
    def columns(self) -> int:
        """The width of one row (of the (b, nc) probabilities for ``probs``)."""
        if self.layout == "probs":
            return self.nc + self.extra
        if self.end_to_end:
            return 6 + self.extra
        return 4 + (self.layout == "xywh_obj_cls") + self.nc + self.extra

    @property
    def has_boxes(self) -> bool:
        """Whether the rows are boxes (a classifier's ``probs`` rows are its class probabilities only)."""
        return self.layout != "probs"

    @property
    def boxes_alone(self) -> bool:
        """Whether the model predicts boxes alone (rows of boxes, no task columns, no other outputs)."""
        return self.has_boxes and not self.extra and len(self.outputs) == 1

    @property
    def rank(self) -> int:
        """The dimensions of the first output: (b, n, columns), or (b, columns) for ``probs``."""
        return 3 if self.has_boxes else 2

    @property
    def outputs(self) -> tuple[str, ...]:
        """What the eval forward returns, in order: the rows, then the task's other outputs."""
        return get_task(self.task).outputs

    def check(self, pred: Any, where: str = "model output") -> None:
        """Refuse, in one line, an output that is not (b, n, columns) (a stranger's exported file, a wrong head)."""
        shape = tuple(getattr(pred, "shape", ()))
        if len(shape) != self.rank or shape[-1] != self.columns:
            wanted = "batch, boxes" if self.rank == 3 else "batch"
            raise ContractError(f"{where} has shape {shape}; its contract ({self.layout}, nc {self.nc}, "
                                f"{self.task} task, {self.extra} extra) needs ({wanted}, {self.columns})")

    def metadata(self) -> dict[str, Any]:
        """Plain values for a checkpoint's or an exported file's metadata."""
        return asdict(self)

    @classmethod
    def from_metadata(cls, meta: Any, nc: int | None = None) -> OutputContract:
        """The contract an exported file or checkpoint recorded; files from before contracts existed were YOLOv5
        detectors (``xywh_obj_cls`` with ``nc`` classes), files from before tasks were recorded name their extra
        columns by their task's ``legacy_key``."""
        if meta is None:
            if nc is None:
                raise ContractError("no output contract recorded and no class count to assume YOLOv5's")
            return cls("xywh_obj_cls", nc)
        legacy = {task.legacy_key: task.name for task in all_tasks() if task.legacy_key}
        if not isinstance(meta, dict) or set(meta) - {*METADATA_KEYS, *legacy}:
            raise ContractError(f"output contract must be a mapping of {', '.join(METADATA_KEYS)}; got "
                                f"{str(meta)[:80]}")
        values = {"layout": meta.get("layout", "xywh_obj_cls"), "nc": meta.get("nc", nc),
                  "extra": meta.get("extra", 0), "task": meta.get("task", BASE_TASK)}
        for key, task in legacy.items():
            if meta.get(key) and "extra" not in meta:  # an older file: its task's columns by their own name
                values.update(extra=meta[key], task=task)
        return cls(**values)


def postprocess(pred: torch.Tensor, contract: OutputContract, conf_thres: float = 0.25, iou_thres: float = 0.45,
                classes: list[int] | None = None, agnostic: bool = False, multi_label: bool = False,
                max_det: int = 300, max_nms: int = 30000) -> list[torch.Tensor]:
    """A head's decoded output -> per image (k, 6 + extra) [x1, y1, x2, y2, conf, cls, the task's columns...], best
    first: NMS for ``xywh_*`` layouts (utils.boxes.non_max_suppression), thresholds only for end-to-end rows; a
    task with its own post-processing (``Task.postprocess``, called with the same arguments) instead."""
    contract.check(pred)
    own = get_task(contract.task).load("postprocess")
    if own is not None:
        return own(pred, contract, conf_thres, iou_thres, classes, agnostic, multi_label, max_det, max_nms)
    if contract.layout == "probs":
        raise ContractError(f"the {contract.task} task's probabilities need its own post-processing (Task.postprocess)")
    if contract.end_to_end:
        return [_final_rows(image, conf_thres, classes, max_det) for image in pred]
    return non_max_suppression(pred, conf_thres, iou_thres, classes, agnostic, multi_label, max_det, max_nms,
                               objectness=contract.layout == "xywh_obj_cls", num_classes=contract.nc)


def _final_rows(rows: torch.Tensor, conf_thres: float, classes: list[int] | None, max_det: int) -> torch.Tensor:
    """An end-to-end head's rows of one image (n, 6 + extra) above the threshold and in ``classes``, best first."""
    keep = rows[:, 4] > conf_thres
    if classes is not None:
        keep &= (rows[:, 5:6] == torch.tensor(classes, device=rows.device, dtype=rows.dtype)).any(1)
    rows = rows[keep]
    order = rows[:, 4].argsort(descending=True, stable=True)[:max_det]
    return rows[order]
