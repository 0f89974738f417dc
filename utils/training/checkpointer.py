"""The run's checkpoints: the Checkpointer hook (last.pt and its previous generation, best.pt, epoch{N}.pt), what a
checkpoint of a run holds, restoring a run from one, and reloading the last good one after non-finite losses.

Each last.pt replaces the one before only after that one became ``last.pt``'s previous generation
(``last.prev.pt``, a hard link swapped in atomically), so a damaged last.pt always has a whole predecessor that
``--resume`` falls back to (utils/training/resume.py).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from utils.atomic_files import fsync_dir
from utils.distributed import comm as dist
from utils.hooks import CHECKPOINT_PRIORITY, HookBase, StepInfo
from utils.log import LOGGER
from utils.training.fitness import fitness
from utils.training.resume import (
    LAST,
    PREVIOUS,
    ResumeError,
    adapt_to_world_size,
    pack_train_state,
    shared_checkpoint,
    unpack_train_state,
)
from utils.weights.checkpoint import CheckpointError, new_checkpoint, save_checkpoint, save_run_checkpoints, to_plain

if TYPE_CHECKING:
    from utils.training.loop import Trainer


class SaveInterval:
    """When to write a mid-epoch ``last.pt``: every ``steps`` batches and/or every ``minutes`` by rank 0's clock
    (its verdict reaches the other ranks through the step vote). Both 0: never mid-epoch."""

    def __init__(self, steps: int = 0, minutes: float = 0.0, clock: Any = time.monotonic) -> None:
        self.steps, self.seconds, self.clock = int(steps), float(minutes) * 60.0, clock
        self.last_time = clock()

    def clock_due(self) -> bool:
        """Rank 0: the minutes are up (local; False on the other ranks and without --save-interval-minutes)."""
        return self.seconds > 0 and dist.is_main_process() and self.clock() - self.last_time >= self.seconds

    def steps_due(self, steps_done: int) -> bool:
        """Every ``steps`` batches (``steps_done`` counts every batch backpropagated since the run began)."""
        return self.steps > 0 and steps_done > 0 and steps_done % self.steps == 0

    def saved(self) -> None:
        """Restart the clock after a checkpoint."""
        self.last_time = self.clock()


def keep_previous_generation(weights: Path) -> None:
    """Make the current last.pt the previous generation (``last.prev.pt``) before a new last.pt replaces it:
    a hard link (a copy where links fail) swapped in atomically, so both names always hold a whole file."""
    last, previous = weights / LAST, weights / PREVIOUS
    if not last.is_file():
        return
    tmp = previous.with_name(f".{PREVIOUS}.tmp{os.getpid()}")
    try:
        os.link(last, tmp)
    except OSError:
        shutil.copyfile(last, tmp)
    os.replace(tmp, previous)
    fsync_dir(weights)


def pack_trainer_state(trainer: Trainer) -> dict[str, Any]:
    """What exact resume needs beyond the EMA weights: the run's state (position, best fitness, maps, every rank's
    RNG states), raw weights and pending gradients, optimizer/scaler/EMA/counters and early-stopping state.
    All ranks must call it (the RNG states are gathered)."""
    core = trainer.model_without_ddp
    return pack_train_state(trainer.state.state_dict(), grads_of=core, model=core, updater=trainer.updater,
                            stopper=trainer.stopper)


class Checkpointer(HookBase):
    """Writes the run's checkpoints: ``last.pt`` mid-epoch (every --save-interval-*, and where every rank agreed
    to stop) and after every epoch, ``best.pt`` on a new best fitness, ``epoch{N}.pt`` every --save-period.

    Every rank runs it (the RNG states are gathered); only the main process writes (``enabled``, decided at
    set-up). Files are written atomically, and the last.pt they replace stays as ``last.prev.pt`` when it is known
    whole (written by this run, or the one it resumed from); ``on_checkpoint`` hooks run after each ``last.pt``. It
    runs before every other hook (CHECKPOINT_PRIORITY), so the epoch's files exist when loggers and user hooks see
    the epoch.
    """

    priority = CHECKPOINT_PRIORITY

    def __init__(self, enabled: bool, interval: SaveInterval | None = None) -> None:
        self.enabled, self.interval = enabled, interval or SaveInterval()
        self.wanted = False  # a mid-epoch checkpoint is due, waiting for a batch where one may be taken
        self.last_is_whole = False  # the run folder's last.pt may become the previous generation

    def before_train(self, trainer: Trainer) -> None:
        self.last_is_whole = trainer.state.resumed and Path(trainer.config.weights).name == LAST

    def after_step(self, trainer: Trainer, step: StepInfo) -> None:
        self.wanted = self.wanted or step.save_due or trainer.stop.agreed or \
            self.interval.steps_due(trainer.updater.iteration)
        if self.wanted and step.boundary:
            self.write(trainer, step.epoch - 1)
            self.wanted = False

    def after_epoch(self, trainer: Trainer, epoch: int, metrics: dict[str, float]) -> None:
        """last.pt (only the final one with --nosave), best.pt on a new best fitness, epoch{N}.pt."""
        config, final = trainer.config, epoch == trainer.config.epochs - 1
        if config.nosave and not final:
            return
        period = config.save_period > 0 and (epoch + 1) % config.save_period == 0
        self.write(trainer, epoch, is_best=fitness(metrics) >= trainer.state.best_fitness,
                   period_name=f"epoch{epoch}.pt" if period else None)

    def write(self, trainer: Trainer, completed_epoch: int, *, is_best: bool = False,
              period_name: str | None = None) -> None:
        """last.pt (the EMA weights plus the exact-resume state at the run's position), then a stripped best.pt
        when ``is_best`` and ``period_name`` as a copy of last.pt. All ranks must call it."""
        position = trainer.state.position
        epoch, samples_seen = position.epoch, position.samples_seen
        dist.mark("checkpoint", epoch, samples_seen // trainer.config.batch_size)
        state = pack_trainer_state(trainer)
        self.interval.saved()
        trainer.state.saved_position = (epoch, samples_seen)
        if self.enabled:
            weights = trainer.save_dir / "weights"
            ckpt = new_checkpoint(trainer.model_without_ddp, state_dict=trainer.ema.ema.state_dict(),
                                  epoch=completed_epoch, best_fitness=trainer.state.best_fitness,
                                  opt=trainer.config.options(), hyp=trainer.hyp, train_state=state,
                                  hooks=to_plain(trainer.hooks.state_dict()))
            if self.last_is_whole:
                keep_previous_generation(weights)
            save_run_checkpoints(ckpt, weights, period_name=period_name)
            self.last_is_whole = True
            if is_best:  # after last.pt, so the two are never both missing
                save_checkpoint({k: v for k, v in ckpt.items() if k != "train_state"}, weights / "best.pt")
        trainer.hooks.on_checkpoint(trainer, epoch, samples_seen)


def restore_training_state(trainer: Trainer, ckpt: dict) -> None:
    """Continue a run from a checkpoint's train_state: weights, pending gradients, optimizer, EMA, schedule, the
    run's state (epoch and sample position, best fitness, maps, RNG restored later, before the first batch) and the
    hooks' state; adapted to this world size."""
    state = ckpt.get("train_state")
    if not state:
        raise ResumeError("--resume: the checkpoint has no training state (it is a final or stripped one)")
    core = trainer.model_without_ddp
    position = unpack_train_state(state, grads_of=core, model=core, updater=trainer.updater,
                                  stopper=trainer.stopper)
    position, _ = adapt_to_world_size(position, dist.get_world_size())  # logs what changed
    trainer.state.load_state_dict({"best_fitness": float(ckpt["best_fitness"]), **state}, position)
    trainer.hooks.load_state_dict(ckpt.get("hooks") or {})  # e.g. a tracker's run id: the same tracked run
    LOGGER.info(f"Resuming from epoch {position.epoch} of {trainer.config.epochs}, batch "
                f"{position.step_in_epoch}, in {trainer.save_dir}")


def reload_last_good(trainer: Trainer, in_a_row: int) -> None:
    """Weights, EMA and optimizer of the last good last.pt (or its previous generation; the data position and
    schedule go on) with every group's learning rate halved. Rank 0 reads the file and shares it. All ranks must
    call it, together."""
    updater = trainer.updater
    initial_lrs = [g["initial_lr"] for g in updater.optimizer.param_groups]
    counters = updater.iteration, updater.steps
    weights = trainer.save_dir / "weights"
    try:
        path, ckpt = shared_checkpoint([weights / LAST, weights / PREVIOUS])
        unpack_train_state(ckpt["train_state"], model=trainer.model_without_ddp, updater=updater)
        source = f"reloaded {path}"
    except (CheckpointError, ResumeError, KeyError):
        source = "no checkpoint to reload yet, weights kept"
    updater.iteration, updater.steps = counters
    updater.forget_pending()  # a fresh accumulation starts with the next batch
    for group, lr in zip(updater.optimizer.param_groups, initial_lrs):
        group["initial_lr"] = lr * 0.5
    LOGGER.warning(f"WARNING: non-finite loss in {in_a_row} steps in a row: {source}; learning rate halved to "
                   f"{initial_lrs[0] * 0.5:g}")
