"""The Trainer: one training run's state and the methods that step it (detectron2's TrainerBase is the model): the
epoch loop (``fit``), an epoch (``train_epoch``) and a step (``run_step``), validation, the checkpoints it writes,
resumes and reloads. Hooks (utils/hooks.py) extend it at its events and see a TrainerView of it, never the Trainer.
Built by utils/training/builder.py; train.py only calls ``fit()``.

Every rank runs the same loop; what the ranks must decide alike (multi-scale sizes, early stopping, a non-finite
loss, a stop signal) is decided on rank 0 or voted and shared, so the loop never branches on the rank.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils.data.batch_memory import hand_back
from utils.data.colour import take_colour
from utils.data.loader import close_mosaic, image_weights, set_epoch, set_start, set_weights
from utils.device import autocast
from utils.distributed import comm as dist
from utils.distributed.signals import GracefulStop
from utils.evaluation.evaluate import EvalOptions, batch_tensors, evaluate, metric_names, model_contract
from utils.hooks import Hooks, StepInfo, TrainerView
from utils.log import LOGGER, colorstr
from utils.loggers.background import BackgroundTasks
from utils.loggers.progress import progress_bar, progress_header, progress_text
from utils.loggers.results_csv import results_columns
from utils.plots.figures import plot_results
from utils.training.checkpointer import SaveInterval, write_run_checkpoints
from utils.training.config import RunConfig
from utils.training.early_stop import EarlyStopping
from utils.training.engine import StepVote, prepare_images
from utils.training.families import Family
from utils.training.fitness import fitness
from utils.training.optim import ModelEMA, WeightUpdater, unwrap
from utils.training.resume import (
    LAST,
    PREVIOUS,
    ResumeError,
    adapt_to_world_size,
    pack_train_state,
    restore_rng_state,
    shared_checkpoint,
    unpack_train_state,
)
from utils.training.train_state import TrainState
from utils.weights.checkpoint import CheckpointError, new_checkpoint, to_plain


@dataclass
class Trainer:
    """One training run: what it is asked (``config``, ``hyp``), what it trains with (model, its ``family``'s loss,
    updater, data, hooks), and what changes as it goes (``state``). Built once by utils.training.builder."""

    config: RunConfig
    hyp: dict
    device: torch.device
    save_dir: Path
    model: nn.Module  # DDP-wrapped under DDP (and compiled with --compile)
    updater: WeightUpdater
    ema: ModelEMA
    family: Family
    compute_loss: Any  # the family's LossFn: (preds, targets) -> (total, items); hooks may wrap it
    loss_names: tuple[str, ...]  # the loss's terms, in the order of its items
    train_loader: Any
    val_loader: Any
    names: list[str]
    hooks: Hooks
    state: TrainState
    amp: bool = False
    loss: Any = None  # the family's LossFn itself (compute_loss unwrapped by hooks), asked for set_epoch
    stopper: EarlyStopping = field(default_factory=EarlyStopping)
    stop: GracefulStop = field(default_factory=GracefulStop)
    save_interval: SaveInterval = field(default_factory=SaveInterval)
    background: BackgroundTasks = field(default_factory=lambda: BackgroundTasks(enabled=False))  # plots
    grid: int = 32
    is_coco: bool = False
    show_progress: bool = True  # the main process shows the progress bar
    plots: bool = False  # the main process draws plots (not with --noplots)
    saves: bool = True  # the main process writes the checkpoints
    last_is_whole: bool = False  # the run folder's last.pt may become the previous generation (last.prev.pt)
    view: TrainerView = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.view = TrainerView(self)  # what the hooks see

    @property
    def model_without_ddp(self) -> nn.Module:
        return unwrap(self.model)

    # ------------------------------------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """The epoch loop from the run's position to ``config.epochs``; returns the last validation's metrics
        (precision, recall, mAP_0.5, mAP_0.5:0.95; the same on every rank). All ranks call it."""
        config, start, t0 = self.config, self.state.epoch, time.time()
        LOGGER.info(f"Image sizes {config.img_size} train, {config.img_size} val\nLogging results to {self.save_dir}\n"
                    f"Starting training for {config.epochs} epochs...")
        metrics, epoch = dict.fromkeys(metric_names(model_contract(self.model_without_ddp)), 0.0), start - 1
        self.last_is_whole = self.state.resumed and Path(config.weights).name == LAST
        self.hooks.before_train(self.view)
        for epoch in range(start, config.epochs):
            LOGGER.info(progress_header(self.loss_names))
            mean_loss = self.train_epoch(epoch, self.begin_epoch(epoch))
            losses = dist.all_reduce_mean(mean_loss.detach().clone()).tolist()
            with self.stop.immediate(f"while validating epoch {epoch}; {self.saved_text()}"):
                if not config.noval or epoch == config.epochs - 1:
                    metrics = self.validate(final=epoch == config.epochs - 1)
            if self.end_epoch(epoch, epoch_row(self.loss_names, losses, metrics, self.updater.lrs())):
                break
        LOGGER.info(f"\n{epoch - start + 1} epochs completed in {(time.time() - t0) / 3600:.3f} hours.")
        self.hooks.after_train(self.view)
        if self.plots:
            self.background.submit(plot_results, self.save_dir / "results.csv")
        LOGGER.info(f"Results saved to {colorstr('bold', str(self.save_dir))}")
        return metrics

    def train_epoch(self, epoch: int, step_sizes: Sequence[int] | None = None) -> torch.Tensor:
        """One pass over this rank's batches of ``epoch``; returns the mean of each loss term over its batches.

        ``step_sizes`` gives the multi-scale image size of each remaining batch (decided on rank 0, broadcast).
        After each batch the hooks run (``after_step``; the checkpointer among them), then a stop that every
        rank agreed on ends the epoch with StopRequested at the first batch where a checkpoint can be taken.
        All ranks must call it (DDP's all-reduce runs in backward, the vote in every step).
        """
        self.model.train()
        mean_loss, done, world = torch.zeros(len(self.loss_names), device=self.device), 0, dist.get_world_size()
        bar = progress_bar(self.train_loader, len(self.train_loader), enabled=self.show_progress)
        for i, (imgs, targets, paths, _, *extras) in enumerate(bar):
            batch = self.state.batch_offset + i  # the batch's index in the whole epoch
            dist.mark("train", epoch, batch)  # for the stuck-rank watch
            self.hooks.before_step(self.view, epoch, batch)
            self.updater.begin_batch(epoch)
            raw, imgs = imgs, prepare_images(imgs, self.device, step_sizes[i] if step_sizes is not None else None,
                                             self.config.channels_last, take_colour(extras))
            hand_back(raw)  # its own copy made: the worker may write that memory again (a recycling loader's)
            targets = targets.to(self.device)
            vote, loss_items, stepped = self.run_step(epoch, batch, imgs, targets, batch_tensors(extras, self.device))
            if not vote.nonfinite:
                mean_loss, done = (mean_loss * done + loss_items) / (done + 1), done + 1
            if self.show_progress:
                mem = torch.cuda.memory_reserved() / 1e9 if self.device.type == "cuda" else 0.0
                bar.set_description(progress_text(epoch, self.config.epochs, mem, mean_loss.tolist(),
                                                  targets.shape[0], imgs.shape[-1]), refresh=False)  # tqdm's pace
            self.stop.agree(vote.signum)
            # Under DDP the gradients of a partial accumulation are each rank's own: checkpoint between steps only.
            boundary = world == 1 or not self.updater.pending
            self.state.advance(epoch, (batch + 1) * self.config.batch_size)
            self.hooks.after_step(self.view, StepInfo(epoch, batch, imgs, targets, paths, stepped, vote.nonfinite,
                                                      boundary, vote.save_due))
            if self.stop.agreed and boundary:
                self.stop.raise_stop(epoch, batch)
        bar.close()
        return mean_loss

    def run_step(self, epoch: int, batch: int, imgs: torch.Tensor, targets: torch.Tensor,
                 inputs: dict[str, torch.Tensor] | None = None) -> tuple[StepVote, torch.Tensor, bool]:
        """Forward, loss, the step's vote, and backward (the optimizer steps when an accumulation completes) unless
        some rank's loss was non-finite; returns (vote, the loss's items, whether the optimizer stepped). The loss
        is multiplied by the world size, since DDP averages gradients where the loss sums over images. ``inputs``
        are the batch's tensors for a task's loss beyond the targets (``masks``), passed by name."""
        updater = self.updater
        with updater.sync_context():  # under DDP, gradients are all-reduced only on the batch that steps
            with autocast(self.device, self.amp):
                loss, loss_items = self.compute_loss(self.model(imgs), targets, **(inputs or {}))
            vote = StepVote.cast(loss, self.stop.signum or 0, self.save_interval.clock_due())
            dist.mark("train", epoch, batch)  # past the vote: a rank stuck from here on is named, not all
            stepped = not vote.nonfinite and updater.backward(loss * dist.get_world_size())
        return vote, loss_items, stepped

    def begin_epoch(self, epoch: int) -> list[int] | None:
        """Select the epoch's sample order (mosaic closed for the last ``close_mosaic`` epochs); in the first epoch
        of a mid-epoch resume, skip the batches already done and restore the RNG states saved with them. Returns the
        multi-scale sizes of the batches that remain (None without --multi-scale). All ranks must call it."""
        set_epoch(self.train_loader, epoch)
        loss_epoch = getattr(self.loss, "set_epoch", None)  # a loss whose weights follow the epoch (YOLO26's)
        if callable(loss_epoch):
            loss_epoch(epoch, self.config.epochs)
        if self.mosaic_closed(epoch) and close_mosaic(self.train_loader):
            LOGGER.info(f"Closing mosaic from epoch {epoch}: the last {int(self.hyp['close_mosaic'])} epochs train "
                        "on single images (hyp close_mosaic)")
        if self.config.image_weights:  # the same weights on every rank (from the labels and the gathered mAPs)
            set_weights(self.train_loader, image_weights(self.train_loader.dataset.labels, len(self.names),
                                                         self.state.maps))
        sizes = self.step_sizes(epoch)  # drawn for the whole epoch, so a resumed epoch gets the same sizes
        done = self.state.samples_seen if self.state.epoch == epoch else 0  # samples of a resumed epoch trained
        self.state.advance(epoch, done)
        self.state.batch_offset = done // self.config.batch_size
        self.hooks.before_epoch(self.view, epoch)
        if done:
            set_start(self.train_loader, done)
        if self.state.rng is not None:  # the last thing before the first resumed batch
            restore_rng_state(self.state.rng)
            self.state.rng = None
        return sizes[self.state.batch_offset:] if sizes is not None else None

    def mosaic_closed(self, epoch: int) -> bool:
        """Whether ``epoch`` is one of the last ``close_mosaic`` (hyp) epochs, as ultralytics counts them: a run of
        fewer epochs than close_mosaic keeps mosaic throughout."""
        last = int(self.hyp.get("close_mosaic", 0))
        return last > 0 and 0 <= self.config.epochs - last <= epoch

    def step_sizes(self, epoch: int) -> list[int] | None:
        """With --multi-scale, the image size of every step of this epoch: drawn on rank 0, broadcast once."""
        if not self.config.multi_scale:
            return None

        def draw() -> list[int]:
            rng = random.Random(self.config.seed * 1000 + epoch)
            low, high = int(self.config.img_size * 0.5), int(self.config.img_size * 1.5) + self.grid
            return [max(rng.randrange(low, high) // self.grid * self.grid, self.grid)
                    for _ in range(len(self.train_loader))]

        return dist.main_decides(draw)

    def end_epoch(self, epoch: int, row: dict[str, float]) -> bool:
        """Best fitness, the hooks' ``after_epoch`` (last.pt first), a stop voted during the epoch; True when early
        stopping ends the run (decided on rank 0). All ranks must call it."""
        fitness_value = fitness(row)
        self.state.best_fitness = max(self.state.best_fitness, fitness_value)
        self.updater.share_pending_grads(dist.all_reduce_mean)  # a checkpoint holds what every rank accumulated
        self.state.advance(epoch + 1, 0)
        with self.stop.immediate(f"while saving the checkpoints of epoch {epoch}; every file is whole (old or new), "
                                 f"continue with --resume"):
            self.hooks.after_epoch(self.view, epoch, row)  # the Checkpointer first: last.pt, best.pt
        if self.stop.agreed:  # a stop voted during the epoch, still waiting for a point to save: last.pt just was
            self.stop.raise_stop(epoch + 1, 0)
        if epoch + 1 < self.config.epochs and self.device.type == "cpu":
            self.remeasure_threads()
        return dist.main_decides(lambda: self.stopper(epoch, fitness_value))  # every rank leaves together

    def remeasure_threads(self) -> None:
        """Between epochs on the CPU, the measured thread count is measured again (dist.remeasure_threads: changed
        after two agreeing probes), in one line when it changes."""
        changed = dist.remeasure_threads()
        if changed:
            LOGGER.info(f"CPU threads {changed[0]} -> {changed[1]}: two probes in a row between epochs found "
                        f"{changed[1]} faster (utils.device.measured_threads)")

    def validate(self, final: bool) -> dict[str, float]:
        """Distributed validation of the EMA model on every rank's shard; the same numbers on every rank."""
        options = EvalOptions(single_cls=self.config.single_cls, half=self.amp, save_dir=self.save_dir,
                              plots=final and self.plots, is_coco=self.is_coco and final)
        self.ema.share_buffers(dist.broadcast)  # every shard judged by rank 0's EMA, the one last.pt holds
        result = evaluate(validation_model(self.ema.ema), self.val_loader, self.device, self.names, options)
        self.state.maps = result.maps  # per-class mAP, for --image-weights
        return result.named_results()

    def saved_text(self) -> str:
        """What --resume will continue from, for the messages of a run stopped outside the steps."""
        if self.state.saved_position is None:
            return "no last.pt was written yet, so the run starts again"
        epoch, samples = self.state.saved_position
        where = f"the start of epoch {epoch}" if not samples else \
            f"epoch {epoch}, batch {samples // self.config.batch_size}"
        return f"last.pt holds {where}; continue with --resume"

    # ------------------------------------------------------------------------------------------------ checkpoints
    def pack_state(self) -> dict[str, Any]:
        """What exact resume needs beyond the EMA weights: the run's state (position, best fitness, maps, every
        rank's RNG states), raw weights and pending gradients, optimizer/scaler/EMA/counters and early-stopping
        state. All ranks must call it (the RNG states are gathered)."""
        core = self.model_without_ddp
        return pack_train_state(self.state.state_dict(), grads_of=core, model=core, updater=self.updater,
                                stopper=self.stopper)

    def save_checkpoint(self, completed_epoch: int, *, is_best: bool = False, period_name: str | None = None) -> None:
        """last.pt (the EMA weights plus the exact-resume state at the run's position), then a stripped best.pt
        when ``is_best`` and ``period_name`` as a copy of last.pt; the main process writes them (``saves``), then
        the hooks' ``on_checkpoint`` runs. All ranks must call it."""
        epoch, samples_seen = self.state.epoch, self.state.samples_seen
        dist.mark("checkpoint", epoch, samples_seen // self.config.batch_size)
        state = self.pack_state()
        self.save_interval.saved()
        self.state.saved_position = (epoch, samples_seen)
        if self.saves:
            ckpt = new_checkpoint(self.model_without_ddp, state_dict=self.ema.ema.state_dict(),
                                  epoch=completed_epoch, best_fitness=self.state.best_fitness,
                                  opt=self.config.options(), hyp=self.hyp, train_state=state,
                                  hooks=to_plain(self.hooks.state_dict()))
            write_run_checkpoints(ckpt, self.save_dir / "weights", keep_previous=self.last_is_whole,
                                  is_best=is_best, period_name=period_name)
            self.last_is_whole = True
        self.hooks.on_checkpoint(self.view, epoch, samples_seen)

    def restore(self, ckpt: dict) -> None:
        """Continue a run from a checkpoint's train_state: weights, pending gradients, optimizer, EMA, schedule, the
        run's state (epoch and sample position, best fitness, maps, RNG restored later, before the first batch) and
        the hooks' state; adapted to this world size."""
        state = ckpt.get("train_state")
        if not state:
            raise ResumeError("--resume: the checkpoint has no training state (it is a final or stripped one)")
        core = self.model_without_ddp
        position = unpack_train_state(state, grads_of=core, model=core, updater=self.updater, stopper=self.stopper)
        position, _ = adapt_to_world_size(position, dist.get_world_size())  # logs what changed
        self.state.load_state_dict({"best_fitness": float(ckpt["best_fitness"]), **state}, position)
        self.hooks.load_state_dict(ckpt.get("hooks") or {})  # e.g. a tracker's run id: the same tracked run
        LOGGER.info(f"Resuming from epoch {position.epoch} of {self.config.epochs}, batch "
                    f"{position.step_in_epoch}, in {self.save_dir}")

    def reload_last_good(self, in_a_row: int) -> None:
        """Weights, EMA and optimizer of the last good last.pt (or its previous generation; the data position and
        schedule go on) with every group's learning rate halved. Rank 0 reads the file and shares it. All ranks
        must call it, together (the NonFiniteReload hook does, after losses every rank voted non-finite)."""
        updater = self.updater
        initial_lrs = [g["initial_lr"] for g in updater.optimizer.param_groups]
        counters = updater.iteration, updater.steps
        weights = self.save_dir / "weights"
        try:
            path, ckpt = shared_checkpoint([weights / LAST, weights / PREVIOUS])
            unpack_train_state(ckpt["train_state"], model=self.model_without_ddp, updater=updater)
            source = f"reloaded {path}"
        except (CheckpointError, ResumeError, KeyError):
            source = "no checkpoint to reload yet, weights kept"
        updater.iteration, updater.steps = counters
        updater.forget_pending()  # a fresh accumulation starts with the next batch
        for group, lr in zip(updater.optimizer.param_groups, initial_lrs):
            group["initial_lr"] = lr * 0.5
        LOGGER.warning(f"WARNING: non-finite loss in {in_a_row} steps in a row: {source}; learning rate halved to "
                       f"{initial_lrs[0] * 0.5:g}")


def epoch_row(loss_names: Sequence[str], losses: Sequence[float], metrics: dict[str, float],
              lrs: Sequence[float]) -> dict[str, float]:
    """The epoch's results.csv row by column name (without "epoch"): what ``after_epoch`` hooks get."""
    values = (*losses, *metrics.values(), *lrs)
    return dict(zip(results_columns(loss_names, len(lrs), tuple(metrics))[1:], [float(v) for v in values]))


def validation_model(ema: nn.Module) -> nn.Module:
    """A copy of the EMA model with BatchNorm folded into the convolutions (channels_last on the CPU): outputs
    equal within float rounding, validation's forward about 30% faster (docs/performance.md)."""
    fuse = getattr(ema, "fuse", None)
    return copy.deepcopy(ema).fuse() if callable(fuse) else ema
