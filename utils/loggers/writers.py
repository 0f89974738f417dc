"""What training writes besides checkpoints: results.csv, TensorBoard events, the progress bar, batch plots.

Each writer is built once at set-up with ``enabled=is_main_process()``; disabled writers accept the
same calls and do nothing, so the training loop never branches on the rank.
"""

from __future__ import annotations

import csv
import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tqdm import tqdm

from utils.hooks import HookBase, StepInfo
from utils.log import LOGGER, colorstr
from utils.plots.figures import plot_images

LOSS_NAMES = ("box", "obj", "cls")
PROGRESS_HEADER = ("Epoch", "gpu_mem", "box", "obj", "cls", "total", "labels", "img_size")
BAR_FORMAT = "{l_bar}{bar:10}{r_bar}"


def results_columns(num_lrs: int = 3) -> list[str]:
    """results.csv header: epoch, train losses, validation metrics, learning rates."""
    return ["epoch", *(f"train/{n}_loss" for n in LOSS_NAMES), "metrics/precision", "metrics/recall",
            "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", *(f"x/lr{i}" for i in range(num_lrs))]


class ResultsCSV:
    """One row per epoch, flushed at once so a killed run keeps every finished epoch."""

    def __init__(self, path: Path, enabled: bool = True, num_lrs: int = 3) -> None:
        self.path, self.enabled, self.columns = Path(path), enabled, results_columns(num_lrs)

    def write(self, row: Sequence[float]) -> None:
        if not self.enabled:
            return
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(self.columns)
            writer.writerow([int(row[0]), *(f"{float(v):.6g}" for v in row[1:])])

    def drop_from(self, epoch: int) -> int:
        """On resume: remove rows of epochs >= ``epoch`` (written before a crash that lost their checkpoint),
        so the resumed run does not repeat them; returns how many were removed. Atomic rewrite."""
        if not self.enabled or not self.path.exists():
            return 0
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        kept = [r for r in rows[1:] if r and int(float(r[0])) < epoch]
        if len(kept) == len(rows) - 1:
            return 0
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows([rows[0], *kept])
        tmp.replace(self.path)
        return len(rows) - 1 - len(kept)


class TensorBoard:
    """SummaryWriter on the main process only; scalars are keyed like the results.csv columns."""

    def __init__(self, log_dir: Path, enabled: bool = True) -> None:
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter  # slow import, only where used

            logging.getLogger("tensorboard").setLevel(logging.WARNING)
            self.writer = SummaryWriter(str(log_dir))
            LOGGER.info(f"{colorstr('tensorboard: ')}Start with 'tensorboard --logdir {log_dir.parent}', "
                        "view at http://localhost:6006/")

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class BackgroundTasks:
    """Runs plotting on one background thread (main process only), so plots never block training.

    A failing plot is logged as a warning; it never ends the run. ``close()`` waits for what is queued.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plots") if enabled else None
        self.futures: list[Future] = []

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if self.pool is not None:
            self.futures.append(self.pool.submit(_logged, fn, *args, **kwargs))

    def close(self, cancel: bool = False) -> None:
        """Wait for the running plot and (unless ``cancel``) the queued ones."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=cancel)
            self.pool = None
        self.futures.clear()


def _logged(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception as e:  # a plot must never end training
        LOGGER.warning(f"WARNING: {getattr(fn, '__name__', 'plot')} failed: {e}")


def progress_header() -> str:
    return ("\n" + "%10s" * len(PROGRESS_HEADER)) % PROGRESS_HEADER


def progress_bar(batches: Iterable, total: int, enabled: bool = True) -> tqdm:
    """A tqdm bar over ``batches``; disabled (silent, same interface) where ``enabled`` is False."""
    return tqdm(batches, total=total, bar_format=BAR_FORMAT, leave=True, ncols=120, mininterval=1.0,
                file=sys.stdout, disable=not enabled)


def progress_text(epoch: int, epochs: int, mem_gb: float, mean_loss: Sequence[float], labels: int,
                  img_size: int) -> str:
    """``   3/9     0.5G   0.0712   0.0341   0.0213    0.127      32      64`` (the reference's columns)."""
    total = float(sum(mean_loss))
    return ("%10s" * 2 + "%10.4g" * 4 + "%10d" * 2) % (f"{epoch}/{epochs - 1}", f"{mem_gb:.3g}G", *mean_loss,
                                                      total, labels, img_size)


class TrainWriters:
    """The run's writers (results.csv, TensorBoard, background plots), enabled on the main process only."""

    def __init__(self, save_dir: Path, enabled: bool = True, num_lrs: int = 3) -> None:
        self.enabled = enabled
        self.csv = ResultsCSV(Path(save_dir) / "results.csv", enabled, num_lrs)
        self.tb = TensorBoard(Path(save_dir), enabled)
        self.background = BackgroundTasks(enabled)

    def epoch_end(self, epoch: int, losses: Sequence[float], metrics: Sequence[float], lrs: Sequence[float]) -> None:
        """Log one epoch: losses (box, obj, cls), metrics (P, R, mAP@.5, mAP@.5:.95), learning rates."""
        row = [epoch, *losses, *metrics, *lrs]
        self.csv.write(row)
        self.tb.scalars(dict(zip(self.csv.columns[1:], (float(v) for v in row[1:]))), epoch)

    def close(self, cancel: bool = False) -> None:
        """Finish the writers; ``cancel`` drops plots still queued (a stopped run must exit in its grace period)."""
        self.background.close(cancel)
        self.tb.close()


class TrainBatchPlots(HookBase):
    """train_batch0..2.jpg: the first batches of the run's first epoch with their boxes, drawn in the background
    (main process only: ``background`` is disabled elsewhere)."""

    def __init__(self, background: BackgroundTasks, save_dir: Path, names: Sequence[str], count: int = 3) -> None:
        self.background, self.save_dir, self.names, self.count = background, Path(save_dir), list(names), count
        self.first_epoch: int | None = None

    def before_train(self, trainer: Any) -> None:
        self.first_epoch = None if trainer.batch_offset or trainer.start_samples else trainer.start_epoch

    def after_step(self, trainer: Any, step: StepInfo) -> None:
        if step.epoch == self.first_epoch and step.batch < self.count:
            self.background.submit(plot_images, step.imgs.detach().cpu().clone(), step.targets.detach().cpu().clone(),
                                   step.paths, self.save_dir / f"train_batch{step.batch}.jpg", self.names)
