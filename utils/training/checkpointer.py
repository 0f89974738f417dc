"""When and how a run's checkpoints are written: the Checkpointer hook decides when (last.pt mid-epoch and after
every epoch, best.pt, epoch{N}.pt) and the Trainer writes them (utils/training/loop.py ``save_checkpoint``, which
also packs, restores and reloads the training state); the files are replaced here.

Each last.pt replaces the one before only after that one became ``last.pt``'s previous generation
(``last.prev.pt``, a hard link swapped in atomically), so a damaged last.pt always has a whole predecessor that
``--resume`` falls back to (utils/training/resume.py).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from utils.atomic_files import fsync_dir
from utils.distributed import comm as dist
from utils.hooks import CHECKPOINT_PRIORITY, HookBase, StepInfo, TrainerView
from utils.training.fitness import fitness
from utils.training.resume import LAST, PREVIOUS
from utils.weights.checkpoint import save_checkpoint, save_run_checkpoints


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


def write_run_checkpoints(ckpt: dict, weights: Path, *, keep_previous: bool, is_best: bool = False,
                          period_name: str | None = None) -> None:
    """last.pt (the one it replaces kept as last.prev.pt when ``keep_previous``: it is known whole), then best.pt
    without the training state when ``is_best`` (after last.pt, so the two are never both missing) and
    ``period_name`` as a copy of last.pt. The main process only."""
    if keep_previous:
        keep_previous_generation(weights)
    save_run_checkpoints(ckpt, weights, period_name=period_name)
    if is_best:
        save_checkpoint({k: v for k, v in ckpt.items() if k != "train_state"}, weights / "best.pt")


class Checkpointer(HookBase):
    """Decides when the run's checkpoints are written and asks ``save`` (the Trainer's ``save_checkpoint``) to write
    them: ``last.pt`` mid-epoch (every --save-interval-*, and where every rank agreed to stop) and after every
    epoch, ``best.pt`` on a new best fitness, ``epoch{N}.pt`` every --save-period.

    Every rank runs it (saving gathers the RNG states); only the main process writes. It runs before every other
    hook but the non-finite reload (CHECKPOINT_PRIORITY), so the epoch's files exist when loggers and user hooks
    see the epoch.
    """

    priority = CHECKPOINT_PRIORITY

    def __init__(self, save: Callable[..., None], interval: SaveInterval | None = None) -> None:
        self.save, self.interval = save, interval or SaveInterval()
        self.wanted = False  # a mid-epoch checkpoint is due, waiting for a batch where one may be taken

    def after_step(self, trainer: TrainerView, step: StepInfo) -> None:
        self.wanted = self.wanted or step.save_due or trainer.stop.agreed or \
            self.interval.steps_due(trainer.iteration)
        if self.wanted and step.boundary:
            self.save(step.epoch - 1)
            self.wanted = False

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        """last.pt (only the final one with --nosave), best.pt on a new best fitness, epoch{N}.pt."""
        config, final = trainer.config, epoch == trainer.config.epochs - 1
        if config.nosave and not final:
            return
        period = config.save_period > 0 and (epoch + 1) % config.save_period == 0
        self.save(epoch, is_best=fitness(metrics) >= trainer.state.best_fitness,
                  period_name=f"epoch{epoch}.pt" if period else None)
