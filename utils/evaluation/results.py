"""What evaluation is asked (EvalOptions) and what it gives: the metrics of a validation pass (EvalResult, its
results.csv columns by name) and the per-image record every rank gathers (ImageStats)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from utils.data.coco_json import CocoIds
from utils.evaluation.metrics import ConfusionMatrix, DetectionMetrics
from utils.tasks.registry import BOX_METRICS, all_tasks

METRIC_NAMES = BOX_METRICS  # results.csv's validation columns of the boxes


@dataclass
class EvalOptions:
    """How ``evaluate`` judges and what it writes."""

    conf_thres: float = 0.001
    iou_thres: float = 0.6
    max_det: int = 300
    single_cls: bool = False
    agnostic: bool = False
    half: bool = False  # mixed precision (float16 on CUDA, bfloat16 on the CPU)
    save_dir: Path | None = None
    plots: bool = False
    save_json: bool = False
    save_txt: bool = False
    save_conf: bool = False
    verbose: bool = False
    is_coco: bool = False
    anno_json: Path | None = None  # COCO annotations for pycocotools (with save_json)
    coco_ids: CocoIds | None = None  # a COCO JSON split's own image and category ids, for the predictions JSON
    augment: bool = False  # test-time augmentation (utils/evaluation/tta.py)
    save_hybrid: bool = False  # the labels join the predictions before NMS (auto-labelling; inflates the mAP)


@dataclass
class EvalResult:
    """What a validation pass measured; identical on every rank."""

    MAP_LABEL: ClassVar[str] = "mAP@.5:.95"  # what ``map`` measures, as an INT8 export's check names it

    mp: float = 0.0
    mr: float = 0.0
    map50: float = 0.0
    map: float = 0.0
    maps: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (nc,) mAP@.5:.95 per class
    speed: tuple[float, float, float] = (0.0, 0.0, 0.0)  # pre-process, inference, NMS ms per image
    loss: dict[str, float] | None = None  # the mean of each loss term by its name, when compute_loss was given
    seen: int = 0
    n_labels: int = 0
    metrics: DetectionMetrics | None = None  # per-class details and curves
    confusion: ConfusionMatrix | None = None  # (nc + 1, nc + 1) counts at conf 0.25, IoU 0.45
    json_path: Path | None = None
    coco_map50: float | None = None  # pycocotools' figures, when it ran (rank 0 only)
    coco_map: float | None = None
    views: dict[str, DetectionMetrics] = field(default_factory=dict)  # a task's other views of the same detections

    def results(self) -> tuple[float, float, float, float]:
        """(P, R, mAP@.5, mAP@.5:.95), the order results.csv and fitness use."""
        return self.mp, self.mr, self.map50, self.map

    def named_results(self) -> dict[str, float]:
        """The validation columns of results.csv by name: the boxes' P, R, mAP@.5, mAP@.5:.95, then each view's of
        the task's metric (``<view>_precision``, ...)."""
        values = dict(zip(METRIC_NAMES, (float(v) for v in self.results())))
        for view, metrics in self.views.items():
            values.update(zip((f"{view}_{n}" for n in METRIC_NAMES), (float(v) for v in metrics.mean_results())))
        return values

    def __getattr__(self, name: str) -> DetectionMetrics | None:
        """A view's metrics by its name (``result.<view>``: a segmenter's ``mask``); None for the view of another
        task (a detector's ``mask``); AttributeError for another name."""
        views = self.__dict__.get("views") or {}
        if name in views:
            return views[name]
        if any(column.startswith(f"{name}_") for task in all_tasks() for column in task.metrics):
            return None
        raise AttributeError(f"{type(self).__name__} has no attribute or view {name!r}")


@dataclass
class ImageStats:
    """One image's evaluation record: small, picklable, gathered across ranks."""

    path: str
    correct: np.ndarray  # (n, 10) bool
    ignored: np.ndarray  # (n, 10) bool: taken by no label, on an ignore region (counts for nothing)
    conf: np.ndarray  # (n,)
    pred_cls: np.ndarray  # (n,)
    target_cls: np.ndarray  # (m,)
    json_rows: list[dict] = field(default_factory=list)
    views: dict[str, np.ndarray] = field(default_factory=dict)  # per view of the task's metric, (n, 10) bool
    view_ignored: dict[str, np.ndarray] = field(default_factory=dict)  # a view's own ignored detections (n, 10)
    view_target_cls: dict[str, np.ndarray] = field(default_factory=dict)  # a view's own counted labels' classes
