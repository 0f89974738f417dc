"""The classification task's loss, to the LossFn interface of utils/training/families.py: the cross-entropy of the
Classify head's logits with label smoothing (``label_smoothing``: that share of each target spread evenly over all
classes), the same for every family.

As ultralytics' classification loss, the total is the mean over the batch's images (not scaled by the batch size
as the detection losses are), so a run sees the gradient ultralytics' recipe was tuned with. Under DDP the mean is
the whole step's: each rank's part is its images' sum over every rank's images (the counts summed over the ranks
by utils.distributed.loss_share), so that the trainer's world-size factor and DDP's averaged gradient give one
process's gradient on the whole batch. ``items`` is that part times the world size, detached (one term, ``cls``):
their mean over the ranks, what results.csv logs, is the whole step's mean (utils.distributed.loss_share).

Targets are the images' class indices (b,), or rows [image, class, ...] with one row per image (what the classify
task's data set gives: utils/tasks/classify/dataset.py), read in image order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from utils.distributed import comm
from utils.distributed.loss_share import LossShare
from utils.errors import UserError


class ClassifyTargetError(UserError, ValueError):
    """Targets that do not give one class per image; one line."""


def class_targets(targets: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(b,) class indices from (b,) indices or (b, k >= 2) rows [image, class, ...] (one per image)."""
    if targets.dim() == 2 and targets.shape[1] >= 2:
        if targets.shape[0] != batch_size or not torch.equal(targets[:, 0].long().sort().values,
                                                             torch.arange(batch_size, device=targets.device)):
            raise ClassifyTargetError(f"a classifier needs one label row per image: {targets.shape[0]} rows for "
                                      f"{batch_size} images")
        return targets[targets[:, 0].argsort(stable=True), 1].long()
    if targets.dim() != 1 or targets.shape[0] != batch_size:
        raise ClassifyTargetError(f"a classifier needs one class per image: targets of shape "
                                  f"{tuple(targets.shape)} for {batch_size} images")
    return targets.long()


class ClassifyLoss:
    """See the module docstring. ``img_size`` is accepted for the loss factory's interface."""

    names: tuple[str, ...] = ("cls",)

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 224, label_smoothing: float = 0.0) -> None:
        self.nc = int(model.head.nc)
        self.label_smoothing = float(label_smoothing)

    def __call__(self, preds: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        labels = class_targets(targets.to(preds.device), preds.shape[0])
        if labels.numel() and (labels.min() < 0 or labels.max() >= self.nc):
            raise ClassifyTargetError(f"class indices must lie in 0..{self.nc - 1}, got {int(labels.min())}.."
                                      f"{int(labels.max())}")
        loss = F.cross_entropy(preds.float(), labels, label_smoothing=self.label_smoothing)
        share = LossShare([labels.numel()]).mean(loss, 0)  # this rank's part of the whole step's mean
        return share / comm.get_world_size(), share.detach().view(1)
