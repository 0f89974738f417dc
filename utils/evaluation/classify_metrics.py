"""Classification metrics: top-1 and top-5 accuracy, kept as counts so that shards add up.

Every rank tallies its own images (how many there were, how many had the label first, how many had it among the
five best, the summed cross-entropy); the tallies are plain integer and float counts, so a sum over ranks (one
``all_reduce``) is exactly the tally one process makes of all the images, and the accuracies follow from the sum.
Fitness is the top-1 accuracy. results.csv's columns are ultralytics' names: ``metrics/accuracy_top1``,
``metrics/accuracy_top5``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

METRIC_NAMES = ("accuracy_top1", "accuracy_top5")
TOP_K = (1, 5)


def topk_hits(probs: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = TOP_K) -> torch.Tensor:
    """(b, nc) scores and (b,) class indices -> (len(ks),) int64: how many images have their label among their
    ``k`` highest scores, for each k (a k beyond nc counts every image). Ties rank by class index, as topk does."""
    labels = labels.to(probs.device).long().view(-1, 1)
    top = probs.topk(min(max(ks), probs.shape[1]), dim=1).indices  # (b, k)
    hits = top == labels  # (b, k): at most one True per row
    return torch.stack([hits[:, :k].any(1).sum() for k in ks]).to(torch.int64)


@dataclass
class ClassifyTally:
    """Counts over a set of images (see the module docstring); ``loss_sum`` sums each image's cross-entropy."""

    images: int = 0
    top1: int = 0
    top5: int = 0
    loss_sum: float = 0.0

    def add(self, probs: torch.Tensor, labels: torch.Tensor, logits: torch.Tensor | None = None) -> None:
        """Count a batch: probabilities (b, nc), labels (b,), and the logits when the loss is tallied too."""
        hits = topk_hits(probs, labels).tolist()
        self.images += int(probs.shape[0])
        self.top1 += hits[0]
        self.top5 += hits[1]
        if logits is not None:
            target = labels.to(logits.device).long()
            self.loss_sum += float(F.cross_entropy(logits.float(), target, reduction="sum"))

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The tally as one float64 tensor (images, top1, top5, loss_sum) for a sum over ranks."""
        return torch.tensor([self.images, self.top1, self.top5, self.loss_sum], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> ClassifyTally:
        images, top1, top5, loss_sum = values.detach().cpu().double().tolist()
        return cls(round(images), round(top1), round(top5), loss_sum)

    def __add__(self, other: ClassifyTally) -> ClassifyTally:
        return ClassifyTally(self.images + other.images, self.top1 + other.top1, self.top5 + other.top5,
                             self.loss_sum + other.loss_sum)

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
