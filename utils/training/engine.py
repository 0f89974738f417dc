"""The training step loop: ``train_one_epoch`` (distributed across ranks), the vote every step takes and the guard
against non-finite losses. The Trainer and its epoch loop are in utils/training/loop.py.

Every rank runs the same steps on its shard of the epoch; per step one small all-reduce carries the
decisions every rank must share (a non-finite loss somewhere, a stop signal, a checkpoint due by the clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from utils.device import autocast
from utils.distributed import comm as dist
from utils.evaluation.evaluate import model_input
from utils.hooks import StepInfo
from utils.log import LOGGER
from utils.loggers.progress import progress_bar, progress_text

if TYPE_CHECKING:
    from utils.training.loop import Trainer

NONFINITE_LIMIT = 3  # consecutive non-finite steps before reloading the last good checkpoint with half the LR


# ------------------------------------------------------------------------------------------------ training
@dataclass(frozen=True)
class StepVote:
    """What every rank must decide alike after a batch's forward pass; one MAX all-reduce decides it all."""

    nonfinite: bool = False  # some rank's loss is NaN/Inf: every rank skips this batch
    signum: int = 0  # a stop signal arrived on some rank (its number; 0: none)
    save_due: bool = False  # rank 0's clock says a timed checkpoint is due

    @staticmethod
    def cast(loss: torch.Tensor, signum: int, save_due: bool) -> StepVote:
        """Every rank's votes combined (any rank's yes wins): a non-finite ``loss``, a signal, a timed save.
        Built on the loss's device without reading it first, so the step has one host sync. All ranks must call
        it."""
        local = torch.tensor([0.0, float(signum), float(save_due)], device=loss.device)
        local[0] = (~torch.isfinite(loss.detach())).any().float()
        votes = local.to(dist.collective_device())
        values = dist.all_reduce_max(votes).tolist()
        return StepVote(bool(values[0]), int(values[1]), bool(values[2]))


class NonFiniteGuard:
    """Counts batches skipped for a non-finite loss (the same on every rank: skipping is voted) and, after
    NONFINITE_LIMIT in a row, calls ``reload`` (the last good checkpoint, half the learning rate)."""

    def __init__(self, reload: Any) -> None:
        self.reload, self.in_epoch, self.total, self.in_a_row = reload, 0, 0, 0

    def update(self, skipped: bool) -> None:
        """After every batch, with whether it was skipped."""
        if not skipped:
            self.in_a_row = 0
            return
        self.in_epoch, self.total, self.in_a_row = self.in_epoch + 1, self.total + 1, self.in_a_row + 1
        if self.in_a_row >= NONFINITE_LIMIT:
            self.reload(self.in_a_row)
            self.in_a_row = 0

    def end_epoch(self, epoch: int) -> None:
        """One line on rank 0 for an epoch that skipped batches."""
        if self.in_epoch:
            LOGGER.info(f"Epoch {epoch}: skipped {self.in_epoch} steps with a non-finite loss ({self.total} in all)")
        self.in_epoch = 0


def train_memory_format(device: torch.device, channels_last: bool = False) -> torch.memory_format:
    """The layout the model and its batches train in: channels_last on the CPU (oneDNN's convolutions and their
    backward skip a layout reorder per layer, the 1x1 ones run as matrix products: docs/performance.md), and
    elsewhere only with --channels-last (``channels_last``)."""
    return torch.channels_last if channels_last or device.type == "cpu" else torch.preserve_format


def _prepare_images(imgs: torch.Tensor, device: torch.device, size: int | None,
                    channels_last: bool = False) -> torch.Tensor:
    """uint8 (b, 3, h, w) -> float in [0, 1] on ``device`` in the training layout (one pass: the cast writes it),
    resized to ``size`` for --multi-scale."""
    imgs = model_input(imgs, device, train_memory_format(device, channels_last) == torch.channels_last)
    if size is not None and size != imgs.shape[-1]:
        imgs = F.interpolate(imgs, size=(size, size), mode="bilinear", align_corners=False)
    return imgs


def train_one_epoch(trainer: Trainer, epoch: int, step_sizes: Sequence[int] | None = None) -> torch.Tensor:
    """One pass over this rank's batches of ``epoch``; returns the mean (box, obj, cls) loss of its batches.

    ``step_sizes`` gives the multi-scale image size of each remaining batch (decided on rank 0, broadcast).
    The loss is multiplied by the world size, since DDP averages gradients where the loss sums over images.
    After each batch the hooks run (``after_step``; the checkpointer among them), then a stop that every
    rank agreed on ends the epoch with StopRequested at the first batch where a checkpoint can be taken.
    All ranks must call it (DDP's all-reduce runs in backward, the vote in every step).
    """
    t, updater, device = trainer, trainer.updater, trainer.device
    t.model.train()
    mean_loss, done, world = torch.zeros(3, device=device), 0, dist.get_world_size()
    bar = progress_bar(t.train_loader, len(t.train_loader), enabled=t.show_progress)
    for i, (imgs, targets, paths, _) in enumerate(bar):
        batch = t.state.batch_offset + i  # the batch's index in the whole epoch
        dist.mark("train", epoch, batch)  # for the stuck-rank watch
        t.hooks.before_step(t, epoch, batch)
        updater.begin_batch(epoch)
        imgs = _prepare_images(imgs, device, step_sizes[i] if step_sizes is not None else None,
                               t.config.channels_last)
        targets = targets.to(device)
        with updater.sync_context():  # under DDP, gradients are all-reduced only on the batch that steps
            with autocast(device, t.amp):
                loss, loss_items = t.compute_loss(t.model(imgs), targets)
            vote = StepVote.cast(loss, t.stop.signum or 0,
                                 t.save_interval.clock_due())
            dist.mark("train", epoch, batch)  # past the vote: a rank stuck from here on is named, not all
            stepped = not vote.nonfinite and updater.backward(loss * world)
        if not vote.nonfinite:
            mean_loss, done = (mean_loss * done + loss_items) / (done + 1), done + 1
        t.guard.update(vote.nonfinite)
        if t.show_progress:
            mem = torch.cuda.memory_reserved() / 1e9 if device.type == "cuda" else 0.0
            bar.set_description(progress_text(epoch, t.config.epochs, mem, mean_loss.tolist(), targets.shape[0],
                                              imgs.shape[-1]), refresh=False)  # drawn at tqdm's own pace
        t.stop.agree(vote.signum)
        # Under DDP the gradients of a partial accumulation are each rank's own: checkpoint between steps only.
        boundary = world == 1 or not updater.pending
        t.state.advance(epoch, (batch + 1) * t.config.batch_size)
        t.hooks.after_step(t, StepInfo(epoch, batch, imgs, targets, paths, stepped, vote.nonfinite, boundary,
                                       vote.save_due))
        if t.stop.agreed and boundary:
            t.stop.raise_stop(epoch, batch)
    bar.close()
    return mean_loss
