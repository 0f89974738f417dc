"""What the Trainer's step is built from (utils/training/loop.py): the vote every step takes, the hook that reloads
the last good checkpoint after non-finite losses, and the layout the batches train in.

Every rank runs the same steps on its shard of the epoch; per step one small all-reduce carries the
decisions every rank must share (a non-finite loss somewhere, a stop signal, a checkpoint due by the clock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from utils.data.colour import recolour
from utils.distributed import comm as dist
from utils.evaluation.evaluate import model_input
from utils.hooks import CHECKPOINT_PRIORITY, HookBase, StepInfo, TrainerView
from utils.log import LOGGER

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


class NonFiniteReload(HookBase):
    """Counts batches skipped for a non-finite loss (the same on every rank: skipping is voted) and, after
    NONFINITE_LIMIT in a row, calls ``reload(in_a_row)`` (the Trainer's: the last good checkpoint, half the learning
    rate) on every rank together. Runs before the Checkpointer, so a reload comes before the step's checkpoint."""

    priority = CHECKPOINT_PRIORITY  # registered before the Checkpointer: first at every event

    def __init__(self, reload: Callable[[int], None]) -> None:
        self.reload, self.in_epoch, self.total, self.in_a_row = reload, 0, 0, 0

    def after_step(self, trainer: TrainerView, step: StepInfo) -> None:
        if not step.skipped:
            self.in_a_row = 0
            return
        self.in_epoch, self.total, self.in_a_row = self.in_epoch + 1, self.total + 1, self.in_a_row + 1
        if self.in_a_row >= NONFINITE_LIMIT:
            self.reload(self.in_a_row)
            self.in_a_row = 0

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        """One line on rank 0 for an epoch that skipped batches."""
        if self.in_epoch:
            LOGGER.info(f"Epoch {epoch}: skipped {self.in_epoch} steps with a non-finite loss ({self.total} in all)")
        self.in_epoch = 0


def train_memory_format(device: torch.device, channels_last: bool = False) -> torch.memory_format:
    """The layout the model and its batches train in: channels_last on the CPU (oneDNN's convolutions and their
    backward skip a layout reorder per layer, the 1x1 ones run as matrix products: docs/performance.md), and
    elsewhere only with --channels-last (``channels_last``)."""
    return torch.channels_last if channels_last or device.type == "cpu" else torch.preserve_format


def align_to_gradients(model: torch.nn.Module, device: torch.device, img_size: int,
                       channels_last: bool = False) -> int:
    """Give every trained parameter the strides its gradient comes back with, so DDP's buckets (views with the
    parameters' strides) take each gradient as it is, without torch's "Grad strides do not match bucket view
    strides" warning and its copy. The two differ where a tensor has size-1 dimensions: a 1x1 convolution's
    weight in channels_last has strides oneDNN does not give its gradient. Found by one forward and backward
    of a grey image in the training layout; BatchNorm statistics and gradients are put back. Returns how many
    parameters changed."""
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    training = model.training
    model.train()
    image = torch.full((2, 3, img_size, img_size), 114, dtype=torch.uint8)
    outputs = model(prepare_images(image, device, None, channels_last))
    sum(o.float().sum() for o in _tensors(outputs)).backward()
    changed = 0
    with torch.no_grad():
        for p in params:
            if p.grad is not None and p.grad.stride() != p.stride():
                p.data = torch.empty_strided(p.shape, p.grad.stride(), dtype=p.dtype, device=p.device).copy_(p)
                changed += 1
            p.grad = None
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    model.train(training)
    return changed


def _tensors(value: object) -> list[torch.Tensor]:
    """The tensors in a model's output (nested lists, tuples and dicts)."""
    if torch.is_tensor(value):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
    return [t for item in items for t in _tensors(item)]


def prepare_images(imgs: torch.Tensor, device: torch.device, size: int | None,
                   channels_last: bool = False, colour: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (b, 3, h, w) -> float in [0, 1] on ``device`` in the training layout (one pass: the cast writes it),
    resized to ``size`` for --multi-scale; first, on ``device``, each image's colour change of ``colour`` (its
    gains (b, 3), when the loader left it to the step: utils.data.colour.recolour)."""
    if colour is not None:
        imgs = recolour(imgs.to(device, non_blocking=True), colour)
    imgs = model_input(imgs, device, train_memory_format(device, channels_last) == torch.channels_last)
    if size is not None and size != imgs.shape[-1]:
        imgs = F.interpolate(imgs, size=(size, size), mode="bilinear", align_corners=False)
    return imgs
