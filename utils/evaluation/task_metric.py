"""What a task adds to the boxes' evaluation: its metric (a task's ``metric`` part, utils/tasks/registry.py).

Evaluation (utils/evaluation/evaluate.py) matches every image's detections to its labels by box IoU, the base
task's metric. A task whose outputs say more (a segmenter's masks) judges the same detections once more per
``view`` it declares (``{"mask": "masks"}``: the view's name, which prefixes its results.csv columns, and what the
table's ``all (...)`` row calls it): ``match`` returns, for one image, each view's true positives (n, 10) and what
each detection's JSON row gains (a mask's RLE). A view may judge by rules of its own (COCOeval's for keypoints: labels
without any keypoint count for nothing, only each class's 20 best detections are judged): then ``match`` also
gives, per view, which detections it ignores and the classes of the labels it counts (the boxes' otherwise).
Sharded evaluation gathers these plain arrays and computes each view's P, R and mAP once, as it does the boxes'. A
task whose objects the box IoU does not judge (oriented boxes) gives the overlaps of the image's detections and
labels (``TaskMatch.overlaps``), which the boxes' own matching, P, R, mAP and confusion matrix then read in place of
the box IoU.

A task whose outputs are not boxes at all (a classifier's probabilities) gives its metric a ``run(model, loader,
device, names, options, compute_loss)`` method instead, which evaluate() hands the whole pass (sharded and gathered
through utils.distributed.comm as the boxes' is) and whose result (an EvalResult, or one with ``named_results``
and ``maps``) it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class ImageContext:
    """One image as a task's metric sees it."""

    index: int  # the image's place in its batch
    rows: torch.Tensor  # its post-processed detections (n, 6 + extra) in the batch's input pixels
    outputs: tuple  # the model's other outputs for the whole batch (a segmenter's prototypes)
    batch: Mapping[str, Any]  # the batch's extras by name (what the task's collate added)
    img_hw: tuple[int, int]  # the batch's input size
    shape: Any  # ((h0, w0), ((ratio_h, ratio_w), (pad_w, pad_h))): the letterbox of this image
    labels: torch.Tensor  # (m, 5) [cls, x1, y1, x2, y2] in the image's original pixels
    det: torch.Tensor  # (n, 6) [x1, y1, x2, y2, conf, cls] in the image's original pixels
    json: bool = False  # whether its detections' COCO JSON rows are written (--save-json)
    ignore: np.ndarray | None = None  # its ignore regions (r, 6) [cls, x1, y1, x2, y2, crowd], original pixels


@dataclass
class TaskMatch:
    """One image's matching beyond the boxes: per view its true positives (n, 10), and per detection the keys its
    COCO JSON row gains (None: nothing); per view, where it has rules of its own, the detections it ignores (n, 10)
    and the classes of the labels it counts (m',) (the boxes' where a view gives none); and the overlaps (n, m) of
    its detections and labels that replace their box IoU (None: the box IoU)."""

    correct: dict[str, np.ndarray] = field(default_factory=dict)
    json: list[dict] | None = None
    ignored: dict[str, np.ndarray] = field(default_factory=dict)
    target_cls: dict[str, np.ndarray] = field(default_factory=dict)
    overlaps: np.ndarray | None = None


class TaskMetric:
    """The base task's: nothing beyond the boxes (see the module docstring)."""

    views: Mapping[str, str] = {}

    def match(self, image: ImageContext) -> TaskMatch:
        return TaskMatch()


NO_VIEWS = TaskMetric()


def joined(records: Sequence[Any], name: str, columns: int | None = None) -> np.ndarray:
    """Field ``name`` of every image's record (a view's true positives, confidences), concatenated; an empty (0,) or
    (0, ``columns``) array when there are no records."""
    arrays = [getattr(r, name) for r in records]
    return np.concatenate(arrays, 0) if arrays else np.zeros((0, columns) if columns else 0)


def weighted_fitness(weights: Mapping[str, float], names: Sequence[str], values: Sequence[float]) -> float:
    """The fitness that picks best.pt: each named column's value times its weight (a task's ``fitness``; 0 for a
    column it does not weigh)."""
    return float(sum(weights.get(name, 0.0) * value for name, value in zip(names, values)))
