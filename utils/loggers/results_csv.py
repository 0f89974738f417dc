"""results.csv: one row per epoch (losses, validation metrics, learning rates), as a logger hook (``--loggers csv``).
The loss columns are the loss's own terms (``train/<name>_loss``: box, obj, cls for YOLOv5; box, cls, dfl for the
anchor-free families), so a family brings its columns without a change here.

A row is flushed as soon as its epoch ends, so a killed run keeps every finished epoch; a resumed run first drops
the rows of the epochs it is about to train again (written after its checkpoint, before the crash).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

from utils.hooks import LOGGER_PRIORITY, HookBase, TrainerView
from utils.log import LOGGER
from utils.loggers.registry import LoggerContext


def results_columns(loss_names: Sequence[str], num_lrs: int = 3,
                    metric_names: Sequence[str] = ("precision", "recall", "mAP_0.5", "mAP_0.5:0.95")) -> list[str]:
    """results.csv header: epoch, the train losses by term (``train/<name>_loss``), validation metrics
    (``metrics/<name>``: the boxes', then a segmenter's masks' ``mask_precision`` ...), learning rates."""
    return ["epoch", *(f"train/{n}_loss" for n in loss_names), *(f"metrics/{n}" for n in metric_names),
            *(f"x/lr{i}" for i in range(num_lrs))]


def append_row(path: Path, epoch: int, row: Mapping[str, float]) -> None:
    """One epoch's row (the header first in a new file), flushed at once."""
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["epoch", *row])
        writer.writerow([int(epoch), *(f"{float(v):.6g}" for v in row.values())])


def read_rows(path: Path) -> list[dict[str, float]]:
    """Every row of a results.csv by column name (the column names stripped); [] when there is none or it is
    unreadable."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        header = [name.strip() for name in rows[0]]
        return [{k: float(v) for k, v in zip(header, row)} for row in rows[1:] if len(row) == len(header)]
    except (OSError, IndexError, ValueError):
        return []


def drop_rows_from(path: Path, epoch: int) -> int:
    """Remove the rows of epochs >= ``epoch`` (atomic rewrite); returns how many were removed."""
    if not path.exists():
        return 0
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kept = [r for r in rows[1:] if r and int(float(r[0])) < epoch]
    if len(kept) == len(rows) - 1:
        return 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows([rows[0], *kept])
    tmp.replace(path)
    return len(rows) - 1 - len(kept)


class ResultsCsvLogger(HookBase):
    """Writes ``<run>/results.csv``: the columns are the ``metrics`` keys of ``after_epoch`` after "epoch"."""

    priority = LOGGER_PRIORITY

    def __init__(self, context: LoggerContext) -> None:
        self.path = Path(context.save_dir) / "results.csv"

    def before_train(self, trainer: TrainerView) -> None:
        """On resume: drop the rows of the epochs the run trains again, so none is repeated."""
        if trainer.state.resumed:
            dropped = drop_rows_from(self.path, trainer.state.epoch)
            if dropped:
                LOGGER.info(f"results.csv: dropped {dropped} rows of epochs from {trainer.state.epoch} on, "
                            "written after the checkpoint this run resumes")

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        append_row(self.path, epoch, metrics)
