"""The tasks the trainer knows (detection, instance segmentation, ...): an open registry of Task records, one per
task, beside the family registry (utils/training/families.py) and built the same way.

A task owns everything that differs between tasks, and shared code asks it instead of testing its name: what its
labels hold and how they are read, what its samples carry beside the boxes and how augmentation moves it, how a
batch collates it, its heads and its loss per family, the extra columns and outputs of its output contract, its
post-processing, its metric (the validation columns, which become results.csv's, and what fitness weighs), its
drawing and label files, its export outputs, its synthetic offline set and its hub entry points.

The record holds facts (names, metric columns, fitness weights) and lazy references, ``"module:attribute"``
strings that ``Task.load`` imports when a run first needs them, so this low-layer registry never imports the
higher layers the task's pieces live in; the pieces live in the task's room (``utils/tasks/<name>/``), each at the
layer of the subsystem it extends (docs/architecture.md, "Adding a task"). A reference left ``None`` means the task
adds nothing there to what the base task (detection) does.

Adding a task is its room and one ``register_task`` line (below).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from utils.errors import UserError

BASE_TASK = "detect"  # the base: boxes and classes; every other task extends it
BOX_METRICS = ("precision", "recall", "mAP_0.5", "mAP_0.5:0.95")  # the boxes' validation columns
BOX_FITNESS = {"mAP_0.5": 0.1, "mAP_0.5:0.95": 0.9}  # what picks best.pt: 0.1 mAP@.5 + 0.9 mAP@.5:.95
PARTS = ("dataset", "labels", "sample", "postprocess", "predict", "metric", "export", "synthetic", "hub", "releases",
         "class_names")


class TaskError(UserError, ValueError):
    """A task that is not registered, or whose piece is not installed; one line."""


@dataclass(frozen=True)
class Task:
    """One task. Facts:

    - ``words``: its vocabulary (the names its samples, batches and outputs carry: ``masks``, ``outlines``, ...),
      which scripts and shared modules never spell (tests/test_task_rooms.py);
    - ``outputs``: what the model's eval forward returns, in order: the rows first, then the task's other outputs
      (a segmenter's ``prototypes``); ``columns``: what its extra row columns hold (after the class scores);
      ``legacy_key``: the metadata key files from before the registry recorded those columns under;
    - ``metrics``: its validation columns (``metrics/<name>`` in results.csv), ``fitness``: each column's weight in
      the fitness that picks best.pt (tasks that share a column give it the same weight);
    - ``default_data``: the data YAML in data/ a model of the task trains on without --data (the built-in set);
    - ``model_noun``, ``results_noun``: what messages call a model of the task and what it predicts beyond boxes;
    - ``data_keys``: the keys of a data YAML it reads (a pose set's ``kpt_shape``, ``flip_idx``), handed to its
      sample part as ``DatasetOptions.task_options`` (utils.data.config.DataConfig.task_options), and to its
      ``labels`` part when that is a function of them; ``model_keys``: those of them a model trained on the data is
      built with, written into its config as the data's class count is (a pose set's ``kpt_shape``: the head's
      keypoint count follows the data's);
    - ``evolve_bounds``: --evolve's (mutation gain, low, high) of the hyperparameters its losses read beyond the
      family's (a pose model's keypoint gains).

    Lazy references (``"module:attribute"``, loaded by ``load``; None: nothing beyond the base's): ``dataset`` (a
    data set class called as utils.data.datasets.YoloDataset is, for a task whose data is not YOLO labels: a
    classifier's class folders), ``labels`` (a
    utils.data.annotations.LabelReader), ``sample`` (a utils.data.samples.SampleExtras subclass, called with the
    DatasetOptions; a utils.data.augment.Geometry), ``postprocess`` (called as utils.tasks.contract.postprocess, it
    replaces NMS), ``predict`` (how an image becomes the model's input, per-image extras
    from the outputs, their drawing and label rows: utils.evaluation.task_outputs.TaskOutputs), ``metric`` (a
    utils.evaluation.task_metric.TaskMetric), ``export`` (a module that registers the export translations of its
    heads), ``synthetic`` (the offline set's ``ensure`` function), ``hub`` (torch.hub entries: (name, parameters)
    pairs, or (name, parameters, classes) where its release files' class count is not 80), ``releases`` (per
    weights reader, ``yolov5`` and ``ultralytics``, its classes in their release files:
    ``models``, ``heads``, ``settings``, ``aliases``; utils/weights/release_reader.py); ``heads``: the modules
    that register its heads in the model registry; ``losses``: per family name, its loss class (called as
    utils.training.families.lazy_loss calls a family's); ``class_names`` (called with a data set's training split
    folder when its data YAML gives neither ``nc`` nor ``names``: the class names that folder holds in the task's
    layout, or None: a classifier's class folders).
    """

    name: str
    summary: str
    words: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ("rows",)
    columns: str = ""
    legacy_key: str | None = None
    metrics: tuple[str, ...] = BOX_METRICS
    fitness: Mapping[str, float] = field(default_factory=lambda: dict(BOX_FITNESS))
    default_data: str = "synthetic.yaml"
    model_noun: str = "a detector"
    results_noun: str = "boxes"
    data_keys: tuple[str, ...] = ()
    model_keys: tuple[str, ...] = ()
    evolve_bounds: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    heads: tuple[str, ...] = ()
    losses: Mapping[str, str] = field(default_factory=dict)
    dataset: str | None = None
    labels: str | None = None
    sample: str | None = None
    postprocess: str | None = None
    predict: str | None = None
    metric: str | None = None
    export: str | None = None
    synthetic: str = "utils.data.synthetic:ensure_synthetic"
    hub: str | None = None
    releases: str | None = None
    class_names: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fitness", MappingProxyType(dict(self.fitness)))
        object.__setattr__(self, "losses", MappingProxyType(dict(self.losses)))
        object.__setattr__(self, "evolve_bounds", MappingProxyType(dict(self.evolve_bounds)))

    @property
    def base(self) -> bool:
        """Whether this is the base task (detection), whose pieces are the shared code's own."""
        return self.name == BASE_TASK

    def load(self, part: str) -> Any:
        """The object ``part`` (one of PARTS) refers to, imported now; None when the task has none."""
        if part not in PARTS:
            raise ValueError(f"{part!r} is not a part of a task (one of {', '.join(PARTS)})")
        reference = getattr(self, part)
        return None if reference is None else load_reference(reference, f"the {self.name} task's {part}")

    def loss_reference(self, family: str) -> str | None:
        """Its loss for heads of ``family`` (``"module:attribute"``), None when it has none."""
        return self.losses.get(str(family))


def load_reference(reference: str, what: str) -> Any:
    """``"module:attribute"`` (or ``"module"``) imported; a one-line TaskError naming ``what`` when it is not
    installed."""
    module, _, attribute = reference.partition(":")
    try:
        found = importlib.import_module(module)
        return getattr(found, attribute) if attribute else found
    except (ImportError, AttributeError) as e:
        raise TaskError(f"{what} ({reference}) is not available in this installation "
                        f"({str(e).splitlines()[0][:120]})") from None


_TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add (or replace) ``task``; its fitness may weigh only its own metric columns. Returns it."""
    if set(task.fitness) - set(task.metrics):
        raise ValueError(f"task {task.name!r} weighs {sorted(set(task.fitness) - set(task.metrics))}, which are not "
                         "among its metrics")
    _TASKS[task.name] = task
    return task


def get_task(name: str | None = None) -> Task:
    """The task called ``name`` (None: the base); a one-line TaskError naming the known ones otherwise."""
    found = _TASKS.get(BASE_TASK if name is None else str(name))
    if found is None:
        raise TaskError(f"task {str(name)[:40]!r} is not registered (known: {', '.join(_TASKS)})")
    return found


def task_names() -> list[str]:
    return list(_TASKS)


def all_tasks() -> list[Task]:
    return list(_TASKS.values())


def fitness_weights(columns: Iterable[str]) -> Mapping[str, float]:
    """The fitness weights of the task whose metric columns ``columns`` are (a validation row's, an EvalResult's);
    the base task's when no task has exactly these columns."""
    found = set(columns)
    return next((task.fitness for task in _TASKS.values() if set(task.metrics) == found), _TASKS[BASE_TASK].fitness)


# ------------------------------------------------------------------------------------------------ the tasks
register_task(Task(BASE_TASK, "boxes and classes"))
register_task(Task(
    "segment", "instance segmentation: boxes, classes and each object's mask",
    words=("masks", "outlines", "segments", "prototypes", "protos", "nm", "mask_ratio", "overlap_mask"),
    outputs=("rows", "prototypes"), columns="mask coefficients", legacy_key="nm",
    metrics=(*BOX_METRICS, *(f"mask_{name}" for name in BOX_METRICS)),
    fitness={**BOX_FITNESS, "mask_mAP_0.5": 0.1, "mask_mAP_0.5:0.95": 0.9},
    default_data="synthetic-seg.yaml", model_noun="a segmenter", results_noun="masks",
    heads=("utils.tasks.segment.head", "utils.tasks.segment.head_end_to_end"),
    releases="utils.tasks.segment.releases:RELEASES",
    losses={"yolov5": "utils.tasks.segment.loss:YoloV5SegmentLoss",
            **dict.fromkeys(("yolov8", "yolo11"), "utils.tasks.segment.loss:AnchorFreeSegmentLoss"),
            "yolo26": "utils.tasks.segment.loss:EndToEndSegmentLoss"},
    labels="utils.tasks.segment.labels:READER", sample="utils.tasks.segment.sample:Outlines",
    predict="utils.tasks.segment.predict:OUTPUTS", metric="utils.tasks.segment.metric:METRIC",
    export="utils.tasks.segment.export", synthetic="utils.tasks.segment.synthetic:ensure_synthetic_seg",
    hub="utils.tasks.segment.hub:ENTRIES"))
register_task(Task(
    "pose", "pose: boxes, classes and each object's keypoints",
    words=("keypoints", "kpt_shape", "flip_idx", "kpt_sigmas", "kobj", "keypoint_labels", "skeleton"),
    columns="keypoints: x, y and visibility of each", metrics=(*BOX_METRICS, *(f"pose_{name}" for name in BOX_METRICS)),
    fitness={**BOX_FITNESS, "pose_mAP_0.5": 0.1, "pose_mAP_0.5:0.95": 0.9},
    default_data="synthetic-pose.yaml", model_noun="a pose model", results_noun="keypoints",
    data_keys=("kpt_shape", "flip_idx", "kpt_sigmas"), model_keys=("kpt_shape", "flip_idx"),
    evolve_bounds={"pose": (1, 1.0, 30.0), "kobj": (1, 0.2, 4.0), "rle": (1, 0.2, 4.0)},
    heads=("utils.tasks.pose.head",), releases="utils.tasks.pose.releases:RELEASES",
    losses={**dict.fromkeys(("yolov8", "yolo11"), "utils.tasks.pose.loss:AnchorFreePoseLoss"),
            "yolo26": "utils.tasks.pose.loss:EndToEndPoseLoss"},
    labels="utils.tasks.pose.labels:reader", sample="utils.tasks.pose.sample:Keypoints",
    predict="utils.tasks.pose.predict:OUTPUTS", metric="utils.tasks.pose.metric:METRIC",
    export="utils.tasks.pose.export", synthetic="utils.tasks.pose.synthetic:ensure_synthetic_pose",
    hub="utils.tasks.pose.hub:ENTRIES"))
register_task(Task(
    "classify", "image classification: one class per image, no boxes",
    words=("top5",), metrics=("accuracy_top1", "accuracy_top5"), fitness={"accuracy_top1": 1.0},
    default_data="synthetic-cls.yaml", model_noun="a classifier", results_noun="class probabilities",
    heads=("utils.tasks.classify.head",), releases="utils.tasks.classify.releases:RELEASES",
    losses=dict.fromkeys(("yolov8", "yolo11"), "utils.tasks.classify.loss:ClassifyLoss"),
    dataset="utils.tasks.classify.dataset:ClassFolders", postprocess="utils.tasks.classify.predict:postprocess",
    predict="utils.tasks.classify.predict:OUTPUTS", metric="utils.tasks.classify.metric:METRIC",
    export="utils.tasks.classify.export", synthetic="utils.tasks.classify.synthetic:ensure_synthetic_cls",
    hub="utils.tasks.classify.hub:ENTRIES", class_names="utils.tasks.classify.folders:names_in_split"))
register_task(Task(
    "obb", "oriented boxes: classes and rotated boxes (aerial, satellite and document images)",
    words=("rboxes", "quads"), columns="angle", default_data="synthetic-obb.yaml",
    model_noun="an oriented-box detector", results_noun="oriented boxes",
    heads=("utils.tasks.obb.head",), releases="utils.tasks.obb.releases:RELEASES",
    losses={**dict.fromkeys(("yolov8", "yolo11"), "utils.tasks.obb.loss:AnchorFreeObbLoss"),
            "yolo26": "utils.tasks.obb.loss:EndToEndObbLoss"},
    labels="utils.tasks.obb.labels:READER", sample="utils.tasks.obb.sample:Corners",
    postprocess="utils.tasks.obb.postprocess:postprocess", predict="utils.tasks.obb.predict:OUTPUTS",
    metric="utils.tasks.obb.metric:METRIC", export="utils.tasks.obb.export",
    synthetic="utils.tasks.obb.synthetic:ensure_synthetic_obb", hub="utils.tasks.obb.hub:ENTRIES"))
