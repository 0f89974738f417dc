"""The classify task's metric (its ``metric`` part): top-1 and top-5 accuracy, kept as counts so that shards add up.

A classifier's outputs are no boxes, so its metric judges the whole validation pass itself (``ClassifyMetric.run``,
which utils.evaluation.evaluate.evaluate hands it): every rank tallies its own images (how many there were, how
many had the label first, how many had it among the five best, the summed loss, and the same counts per class);
the tallies are plain counts, so one sum over the ranks (an all-reduce) is exactly the tally one process makes of
all the images, and the accuracies follow from the sum. Fitness is the top-1 accuracy; results.csv's columns are
ultralytics' names, ``metrics/accuracy_top1`` and ``metrics/accuracy_top5``; the validation loss, when asked, is
the cross-entropy of the eval model's probabilities (without label smoothing), under the loss's name (``cls``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from utils.distributed import comm as dist
from utils.evaluation.evaluate import model_input
from utils.evaluation.results import EvalOptions
from utils.evaluation.task_metric import TaskMetric
from utils.log import LOGGER
from utils.plots.annotate import class_name
from utils.tasks.classify.dataset import class_indices

METRIC_NAMES = ("accuracy_top1", "accuracy_top5")
TOP_K = (1, 5)
ROW = "%22s" + "%11s" * 3


def topk_hits(probs: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = TOP_K) -> torch.Tensor:
    """(b, nc) scores and (b,) class indices -> (len(ks),) int64: how many images have their label among their
    ``k`` highest scores, for each k (a k beyond nc counts every image). Ties rank by class index, as topk does."""
    return first_hits(probs, labels, ks).sum(0)


def first_hits(probs: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = TOP_K) -> torch.Tensor:
    """(b, len(ks)) int64: per image whether its label is among its ``k`` highest scores, for each k."""
    labels = labels.to(probs.device).long().view(-1, 1)
    top = probs.topk(min(max(ks), probs.shape[1]), dim=1).indices  # (b, k)
    hits = top == labels  # (b, k): at most one True per row
    return torch.stack([hits[:, :k].any(1) for k in ks], 1).to(torch.int64)


@dataclass
class ClassifyTally:
    """Counts over a set of images (see the module docstring); ``loss_sum`` sums each image's loss, ``per_class``
    (2, nc) the images and top-1 hits of each class."""

    images: int = 0
    top1: int = 0
    top5: int = 0
    loss_sum: float = 0.0
    per_class: np.ndarray = field(default_factory=lambda: np.zeros((2, 0), np.int64))

    def add(self, probs: torch.Tensor, labels: torch.Tensor, logits: torch.Tensor | None = None) -> None:
        """Count a batch: probabilities (b, nc), labels (b,), and the logits when the loss is tallied too."""
        hits = first_hits(probs, labels)
        self.images += int(probs.shape[0])
        self.top1 += int(hits[:, 0].sum())
        self.top5 += int(hits[:, 1].sum())
        nc, cls = probs.shape[1], labels.long().cpu().numpy()
        if self.per_class.shape[1] < nc:
            self.per_class = np.pad(self.per_class, ((0, 0), (0, nc - self.per_class.shape[1])))
        np.add.at(self.per_class, (0, cls), 1)
        np.add.at(self.per_class, (1, cls), hits[:, 0].cpu().numpy())
        if logits is not None:
            target = labels.to(logits.device).long()
            self.loss_sum += float(torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum"))

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The tally as one float64 tensor (images, top1, top5, loss_sum, per-class counts) for a sum over ranks."""
        head = torch.tensor([self.images, self.top1, self.top5, self.loss_sum], dtype=torch.float64)
        return torch.cat((head, torch.from_numpy(self.per_class.reshape(-1).astype(np.float64)))).to(device)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> ClassifyTally:
        values = values.detach().cpu().double()
        images, top1, top5, loss_sum = values[:4].tolist()
        per_class = values[4:].round().to(torch.int64).numpy().reshape(2, -1)
        return cls(round(images), round(top1), round(top5), loss_sum, per_class)

    def __add__(self, other: ClassifyTally) -> ClassifyTally:
        return ClassifyTally.from_tensor(self.as_tensor() + other.as_tensor())

    @property
    def accuracy_top1(self) -> float:
        return self.top1 / self.images if self.images else 0.0

    @property
    def accuracy_top5(self) -> float:
        return self.top5 / self.images if self.images else 0.0

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.images if self.images else 0.0

    def metrics(self) -> dict[str, float]:
        """results.csv's validation columns (without the ``metrics/`` prefix)."""
        return dict(zip(METRIC_NAMES, (self.accuracy_top1, self.accuracy_top5)))

    def fitness(self) -> float:
        """What picks best.pt for a classifier: the top-1 accuracy."""
        return self.accuracy_top1

    def class_accuracy(self, nc: int) -> np.ndarray:
        """(nc,) top-1 accuracy per class (a class without images gets the overall one)."""
        images, hits = (np.pad(row, (0, max(nc - len(row), 0)))[:nc] for row in self.per_class)
        return np.where(images > 0, hits / np.maximum(images, 1), self.accuracy_top1)


@dataclass
class ClassifyResult:
    """What a classifier's validation pass measured; identical on every rank. ``maps`` is per-class top-1 accuracy
    (what --image-weights weighs classes by), ``map`` the top-1 accuracy (what an INT8 export's check compares)."""

    MAP_LABEL: ClassVar[str] = "top-1 accuracy"  # what ``map`` is
    tally: ClassifyTally
    maps: np.ndarray
    speed: tuple[float, float, float] = (0.0, 0.0, 0.0)  # pre-process, inference, ranking ms per image
    loss: dict[str, float] | None = None

    @property
    def top1(self) -> float:
        return self.tally.accuracy_top1

    @property
    def top5(self) -> float:
        return self.tally.accuracy_top5

    @property
    def map(self) -> float:
        return self.top1

    @property
    def seen(self) -> int:
        return self.tally.images

    def results(self) -> tuple[float, float]:
        return self.top1, self.top5

    def named_results(self) -> dict[str, float]:
        return self.tally.metrics()


class ClassifyMetric(TaskMetric):
    """The whole validation pass of a classifier (see the module docstring)."""

    @torch.no_grad()
    def run(self, model: nn.Module, loader: Any, device: torch.device, names: Sequence[str], options: EvalOptions,
            compute_loss: Any = None) -> ClassifyResult:
        """Validate ``model`` on this rank's shard of ``loader`` and sum the tallies over the ranks. All ranks must
        call it."""
        nc = len(names)
        tally, seconds = ClassifyTally(per_class=np.zeros((2, nc), np.int64)), np.zeros(3)
        was_training = model.training
        model.eval()
        try:
            for index, (imgs, targets, *_) in enumerate(loader):
                dist.mark("validation", batch=index)
                start = time.perf_counter()
                x = model_input(imgs, device, False)
                labels = class_indices(targets).to(device)
                if options.single_cls:
                    labels = torch.zeros_like(labels)
                prepared = time.perf_counter()
                probs = model(x).float()
                inferred = time.perf_counter()
                tally.add(probs, labels, probs.clamp(min=1e-12).log() if compute_loss is not None else None)
                seconds += (prepared - start, inferred - prepared, time.perf_counter() - inferred)
        finally:
            model.train(was_training)
        summed = ClassifyTally.from_tensor(dist.all_reduce_sum(tally.as_tensor(dist.collective_device())))
        times = dist.all_reduce_sum(torch.tensor(seconds, dtype=torch.float64, device=dist.collective_device()))
        speed = tuple(float(t) / max(summed.images, 1) * 1e3 for t in times.cpu())
        loss = {name: summed.mean_loss for name in getattr(compute_loss, "names", ("cls",))} \
            if compute_loss is not None else None
        log_table(summed, names, options.verbose)
        LOGGER.info(f"Speed: {speed[0]:.1f}/{speed[1]:.1f}/{speed[2]:.1f} ms pre-process/inference/ranking per "
                    f"image")
        return ClassifyResult(summed, summed.class_accuracy(nc), speed, loss)


def log_table(tally: ClassifyTally, names: Sequence[str], verbose: bool) -> None:
    """The table: an ``all`` row (images, top-1, top-5 accuracy), then one row per class with ``verbose``."""
    LOGGER.info(ROW % ("Class", "Images", "top1_acc", "top5_acc"))
    LOGGER.info(ROW % ("all", tally.images, f"{tally.accuracy_top1:.3g}", f"{tally.accuracy_top5:.3g}"))
    if verbose and len(names) > 1:
        accuracy = tally.class_accuracy(len(names))
        for c, (images, _) in enumerate(zip(*tally.per_class)):
            LOGGER.info(ROW % (class_name(names, c), int(images), f"{accuracy[c]:.3g}", ""))


METRIC = ClassifyMetric()
