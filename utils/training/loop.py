"""The Trainer and its epoch loop: train (utils/training/engine.py), validate, announce the epoch to the hooks
(checkpoints, loggers, plots), stop early. Built by utils/training/builder.py; train.py only calls ``fit()``.

Every rank runs the same loop; what the ranks must decide alike (multi-scale sizes, early stopping) is decided on
rank 0 and shared, so the loop never branches on the rank.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils.data.loader import image_weights, set_epoch, set_start, set_weights
from utils.distributed import comm as dist
from utils.distributed.signals import GracefulStop
from utils.evaluation.evaluate import EvalOptions, evaluate
from utils.hooks import Hooks
from utils.log import LOGGER, colorstr
from utils.loggers.background import BackgroundTasks
from utils.loggers.progress import progress_header
from utils.loggers.results_csv import results_columns
from utils.plots.figures import plot_results
from utils.training.checkpointer import SaveInterval
from utils.training.config import RunConfig
from utils.training.early_stop import EarlyStopping
from utils.training.engine import NonFiniteGuard, train_one_epoch
from utils.training.fitness import fitness
from utils.training.optim import ModelEMA, WeightUpdater, unwrap
from utils.training.resume import restore_rng_state
from utils.training.train_state import TrainState


@dataclass
class Trainer:
    """One training run: what it is asked (``config``, ``hyp``), what it trains with (model, updater, data, hooks),
    and what changes as it goes (``state``). Built once by utils.training.builder.build_trainer."""

    config: RunConfig
    hyp: dict
    device: torch.device
    save_dir: Path
    model: nn.Module  # DDP-wrapped under DDP (and compiled with --compile)
    updater: WeightUpdater
    ema: ModelEMA
    compute_loss: Any  # (preds, targets) -> (loss, items); hooks may wrap it
    train_loader: Any
    val_loader: Any
    names: list[str]
    hooks: Hooks
    state: TrainState
    amp: bool = False
    stopper: EarlyStopping = field(default_factory=EarlyStopping)
    stop: GracefulStop = field(default_factory=GracefulStop)
    save_interval: SaveInterval = field(default_factory=SaveInterval)
    guard: NonFiniteGuard = field(default_factory=lambda: NonFiniteGuard(lambda in_a_row: None))
    background: BackgroundTasks = field(default_factory=lambda: BackgroundTasks(enabled=False))  # plots
    grid: int = 32
    is_coco: bool = False
    show_progress: bool = True  # the main process shows the progress bar
    plots: bool = False  # the main process draws plots (not with --noplots)

    @property
    def model_without_ddp(self) -> nn.Module:
        return unwrap(self.model)

    def fit(self) -> dict[str, float]:
        """The epoch loop from the run's position to ``config.epochs``; returns the last validation's metrics
        (precision, recall, mAP_0.5, mAP_0.5:0.95; the same on every rank). All ranks call it."""
        config, start, t0 = self.config, self.state.epoch, time.time()
        LOGGER.info(f"Image sizes {config.img_size} train, {config.img_size} val\nLogging results to {self.save_dir}\n"
                    f"Starting training for {config.epochs} epochs...")
        metrics, epoch = dict.fromkeys(("precision", "recall", "mAP_0.5", "mAP_0.5:0.95"), 0.0), start - 1
        self.hooks.before_train(self)
        for epoch in range(start, config.epochs):
            LOGGER.info(progress_header())
            mean_loss = train_one_epoch(self, epoch, begin_epoch(self, epoch))
            losses = dist.all_reduce_mean(mean_loss.detach().clone()).tolist()
            with self.stop.immediate(f"while validating epoch {epoch}; {saved_text(self)}"):
                if not config.noval or epoch == config.epochs - 1:
                    metrics = validate(self, final=epoch == config.epochs - 1)
            if end_epoch(self, epoch, epoch_row(losses, metrics, self.updater.lrs())):
                break
        LOGGER.info(f"\n{epoch - start + 1} epochs completed in {(time.time() - t0) / 3600:.3f} hours.")
        self.hooks.after_train(self)
        if self.plots:
            self.background.submit(plot_results, self.save_dir / "results.csv")
        LOGGER.info(f"Results saved to {colorstr('bold', str(self.save_dir))}")
        return metrics


def epoch_row(losses: list[float], metrics: dict[str, float], lrs: list[float]) -> dict[str, float]:
    """The epoch's results.csv row by column name (without "epoch"): what ``after_epoch`` hooks get."""
    return dict(zip(results_columns(len(lrs))[1:], [float(v) for v in (*losses, *metrics.values(), *lrs)]))


def end_epoch(t: Trainer, epoch: int, row: dict[str, float]) -> bool:
    """Best fitness, the hooks' ``after_epoch`` (last.pt first), a stop voted during the epoch; True when early
    stopping ends the run (decided on rank 0). All ranks must call it."""
    fitness_value = fitness(row)
    t.state.best_fitness = max(t.state.best_fitness, fitness_value)
    t.updater.share_pending_grads(dist.all_reduce_mean)  # a checkpoint holds what every rank accumulated
    t.state.advance(epoch + 1, 0)
    with t.stop.immediate(f"while saving the checkpoints of epoch {epoch}; every file is whole (old or new), "
                          f"continue with --resume"):
        t.hooks.after_epoch(t, epoch, row)  # the Checkpointer first: last.pt, best.pt
    t.guard.end_epoch(epoch)
    if t.stop.agreed:  # a stop voted during the epoch, still waiting for a point to save: last.pt just was
        t.stop.raise_stop(epoch + 1, 0)
    return dist.main_decides(lambda: t.stopper(epoch, fitness_value))  # every rank leaves together


def saved_text(t: Trainer) -> str:
    """What --resume will continue from, for the messages of a run stopped outside the steps."""
    if t.state.saved_position is None:
        return "no last.pt was written yet, so the run starts again"
    epoch, samples = t.state.saved_position
    where = f"the start of epoch {epoch}" if not samples else f"epoch {epoch}, batch {samples // t.config.batch_size}"
    return f"last.pt holds {where}; continue with --resume"


def step_sizes(t: Trainer, epoch: int) -> list[int] | None:
    """With --multi-scale, the image size of every step of this epoch: drawn on rank 0, broadcast once."""
    if not t.config.multi_scale:
        return None

    def draw() -> list[int]:
        rng = random.Random(t.config.seed * 1000 + epoch)
        low, high = int(t.config.img_size * 0.5), int(t.config.img_size * 1.5) + t.grid
        return [max(rng.randrange(low, high) // t.grid * t.grid, t.grid) for _ in range(len(t.train_loader))]

    return dist.main_decides(draw)


def begin_epoch(t: Trainer, epoch: int) -> list[int] | None:
    """Select the epoch's sample order; in the first epoch of a mid-epoch resume, skip the batches already done
    and restore the RNG states saved with them. Returns the multi-scale sizes of the batches that remain (None
    without --multi-scale). All ranks must call it."""
    set_epoch(t.train_loader, epoch)
    if t.config.image_weights:  # the same weights on every rank (from the labels and the gathered mAPs)
        set_weights(t.train_loader, image_weights(t.train_loader.dataset.labels, len(t.names), t.state.maps))
    sizes = step_sizes(t, epoch)  # drawn for the whole epoch, so a resumed epoch gets the same sizes
    done = t.state.samples_seen if t.state.epoch == epoch else 0  # samples of a resumed epoch already trained
    t.state.advance(epoch, done)
    t.state.batch_offset = done // t.config.batch_size
    t.hooks.before_epoch(t, epoch)
    if done:
        set_start(t.train_loader, done)
    if t.state.rng is not None:  # the last thing before the first resumed batch
        restore_rng_state(t.state.rng)
        t.state.rng = None
    return sizes[t.state.batch_offset:] if sizes is not None else None


def validate(t: Trainer, final: bool) -> dict[str, float]:
    """Distributed validation of the EMA model on every rank's shard; the same numbers on every rank."""
    options = EvalOptions(single_cls=t.config.single_cls, half=t.amp, save_dir=t.save_dir,
                          plots=final and t.plots, is_coco=t.is_coco and final)
    result = evaluate(validation_model(t.ema.ema), t.val_loader, t.device, t.names, options)
    t.state.maps = result.maps  # per-class mAP, for --image-weights
    return {"precision": float(result.mp), "recall": float(result.mr), "mAP_0.5": float(result.map50),
            "mAP_0.5:0.95": float(result.map)}


def validation_model(ema: nn.Module) -> nn.Module:
    """A copy of the EMA model with BatchNorm folded into the convolutions (channels_last on the CPU): outputs
    equal within float rounding, validation's forward about 30% faster (docs/performance.md)."""
    fuse = getattr(ema, "fuse", None)
    return copy.deepcopy(ema).fuse() if callable(fuse) else ema
