"""Faults the tests inject into training through its hooks (``train.py --hook 'tests.plugins.faults:...'``).

Each fault acts on one rank, on the first attempt of a torchrun job only (an elastic restart runs clean), so
it lands at a known place: ``FailAt`` before a batch, ``NanLoss`` in the losses of some batches.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch

from utils.distributed import comm as dist
from utils.hooks import HookBase, StepInfo, TrainerView


def _armed(rank: int) -> bool:
    return dist.get_rank() == rank and dist.restart_count() == 0


class FailAt(HookBase):
    """Before batch ``batch`` of ``epoch`` on ``rank``: ``raise`` an error, ``kill`` the process (SIGKILL),
    ``term``/``int``/``usr1`` send it that signal (a graceful stop), ``stop`` freeze it with SIGSTOP. With ``marker``
    (a file path) it acts once per test whatever the engine's restart count says (Ray's restarts are not torchrun's):
    only while the file does not exist, which it writes first."""

    SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT, "usr1": signal.SIGUSR1,
               "stop": signal.SIGSTOP}

    def __init__(self, rank: int = 0, epoch: int = 0, batch: int = 0, action: str = "raise", marker: str = "") -> None:
        if action != "raise" and action not in self.SIGNALS:
            raise ValueError(f"action {action!r} is not raise or one of {', '.join(self.SIGNALS)}")
        self.rank, self.epoch, self.batch, self.action, self.marker = rank, epoch, batch, action, marker

    def before_step(self, trainer: TrainerView, epoch: int, batch: int) -> None:
        if (epoch, batch) != (self.epoch, self.batch) or dist.get_rank() != self.rank:
            return
        if self.marker:
            if Path(self.marker).exists():
                return
            Path(self.marker).write_text(f"{os.getpid()}\n")
        elif not _armed(self.rank):
            return
        if self.action == "raise":
            raise RuntimeError(f"rank {self.rank}: test fault injected at epoch {epoch} batch {batch}")
        os.kill(os.getpid(), self.SIGNALS[self.action])


class NanLoss(HookBase):
    """On ``rank``, a NaN loss for ``count`` batches from ``batch`` of ``epoch``."""

    def __init__(self, rank: int = 0, epoch: int = 0, batch: int = 0, count: int = 1) -> None:
        self.rank, self.epoch, self.first, self.count = rank, epoch, batch, count
        self.current: tuple[int, int] = (-1, -1)

    def before_train(self, trainer: TrainerView) -> None:
        if not _armed(self.rank):
            return
        real = trainer.compute_loss

        def poisoned(preds: Any, targets: torch.Tensor, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            loss, items = real(preds, targets, **inputs)
            epoch, batch = self.current
            hit = epoch == self.epoch and self.first <= batch < self.first + self.count
            return (loss * float("nan"), items) if hit else (loss, items)

        trainer.compute_loss = poisoned

    def before_step(self, trainer: TrainerView, epoch: int, batch: int) -> None:
        self.current = (epoch, batch)


class ResidentMemory(HookBase):
    """Appends ``epoch rss_mb`` of this rank after every epoch to ``path`` (rank 0 only), and checks that the epoch's
    ``metrics`` are its results.csv row by column name."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        if "metrics/mAP_0.5:0.95" not in metrics or "train/box_loss" not in metrics:
            raise AssertionError(f"after_epoch metrics are not a results.csv row: {sorted(metrics)}")
        if dist.is_main_process():
            rss = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
            with open(self.path, "a") as f:
                f.write(f"{epoch} {rss / 1024:.1f}\n")


class Beacon(HookBase):
    """Appends ``rank epoch batch`` to ``path`` after every step (so a test knows where a job is), and, with
    ``seconds``, paces the steps (sleeps after each) so a signal from outside lands mid-epoch. Neither changes
    what is computed."""

    def __init__(self, path: str, seconds: float = 0.0) -> None:
        self.path, self.seconds = Path(path), seconds

    def after_step(self, trainer: TrainerView, step: StepInfo) -> None:
        with open(self.path, "a") as f:
            f.write(f"{dist.get_rank()} {step.epoch} {step.batch}\n")
        if self.seconds:
            time.sleep(self.seconds)


class Checksum(HookBase):
    """After training, writes this rank's parameter checksum (the sum of every parameter as float64, and a hash
    of their bytes) to ``<folder>/checksum-rank<r>.txt``: replicas that drifted apart differ."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def after_train(self, trainer: TrainerView) -> None:
        import hashlib

        params = [p.detach().cpu() for p in trainer.model_without_ddp.parameters()]
        digest = hashlib.sha1(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
        total = sum(float(p.double().sum()) for p in params)
        (self.folder / f"checksum-rank{dist.get_rank()}.txt").write_text(f"{digest} {total!r}\n")


class FreezeInCollective(HookBase):
    """At the end of ``epoch``, before its checkpoint: ``rank`` goes on into the checkpoint's collective and freezes
    itself there (SIGSTOP after ``seconds`` / 2) while the other ranks hold back ``seconds``, so the rank is frozen
    while it waits with the others, not while it works."""

    priority = -1  # before the Checkpointer (CHECKPOINT_PRIORITY 0)

    def __init__(self, rank: int = 1, epoch: int = 0, seconds: float = 3.0) -> None:
        self.rank, self.epoch, self.seconds = rank, epoch, seconds

    def after_epoch(self, trainer: Any, epoch: int, metrics: dict[str, float]) -> None:
        if epoch != self.epoch or dist.restart_count() != 0:
            return
        if dist.get_rank() == self.rank:
            freeze = threading.Timer(self.seconds / 2, os.kill, (os.getpid(), signal.SIGSTOP))
            freeze.daemon = True
            freeze.start()
        else:
            time.sleep(self.seconds)


class HoldAt(HookBase):
    """After batch 0 of ``epoch`` on ``rank`` of a group of ``world`` processes, once per test (``marker`` does not
    exist yet): write ``pid parent-pid`` to ``marker`` and wait there, up to ``limit_s``, until a SIGTERM comes (it
    then reaches the run's own handler too) or the process is killed. So a test changes the membership of a torchrun
    job while it is at a known step: a node joins (its agent SIGTERMs this worker) or a node is lost."""

    def __init__(self, marker: str, rank: int = 0, epoch: int = 1, world: int = 1, limit_s: float = 120.0) -> None:
        self.marker, self.rank, self.epoch, self.world, self.limit_s = Path(marker), rank, epoch, world, limit_s

    def after_step(self, trainer: TrainerView, step: StepInfo) -> None:
        if (step.epoch, step.batch, dist.get_rank(), dist.get_world_size()) != (self.epoch, 0, self.rank, self.world) \
                or self.marker.exists():
            return
        termed = threading.Event()
        previous = signal.getsignal(signal.SIGTERM)

        def chained(signum: int, frame: Any) -> None:
            termed.set()
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, chained)
        try:
            tmp = self.marker.with_name(self.marker.name + ".tmp")
            tmp.write_text(f"{os.getpid()} {os.getppid()}\n")
            tmp.replace(self.marker)
            deadline = time.monotonic() + self.limit_s
            while not termed.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            signal.signal(signal.SIGTERM, previous)


class LoseRunFiles(HookBase):
    """Before batch ``batch`` of ``epoch`` on ``rank``, once per test (while ``marker`` does not exist): delete the run
    folder's checkpoints and results.csv, as when an engine restarts the worker group on a machine that never had
    them (Ray Train without a shared file system)."""

    def __init__(self, marker: str, rank: int = 0, epoch: int = 1, batch: int = 0) -> None:
        self.marker, self.rank, self.epoch, self.batch = Path(marker), rank, epoch, batch

    def before_step(self, trainer: TrainerView, epoch: int, batch: int) -> None:
        if (epoch, batch, dist.get_rank()) != (self.epoch, self.batch, self.rank) or self.marker.exists():
            return
        self.marker.write_text("lost\n")
        for name in ("weights/last.pt", "weights/last.prev.pt", "weights/best.pt", "results.csv"):
            (trainer.save_dir / name).unlink(missing_ok=True)
