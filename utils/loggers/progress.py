"""The training progress bar and its text (the reference's columns, one per term of the family's loss), shown on the
main process only."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from tqdm import tqdm

BAR_FORMAT = "{l_bar}{bar:10}{r_bar}"


def progress_columns(loss_names: Sequence[str]) -> tuple[str, ...]:
    """Epoch, gpu_mem, each loss term by its name, total, labels, img_size."""
    return ("Epoch", "gpu_mem", *loss_names, "total", "labels", "img_size")


def progress_header(loss_names: Sequence[str]) -> str:
    columns = progress_columns(loss_names)
    return ("\n" + "%10s" * len(columns)) % columns


def progress_bar(batches: Iterable, total: int, enabled: bool = True) -> tqdm:
    """A tqdm bar over ``batches``; disabled (silent, same interface) where ``enabled`` is False."""
    return tqdm(batches, total=total, bar_format=BAR_FORMAT, leave=True, ncols=120, mininterval=1.0,
                file=sys.stdout, disable=not enabled)


def progress_text(epoch: int, epochs: int, mem_gb: float, mean_loss: Sequence[float], labels: int,
                  img_size: int) -> str:
    """``   3/9     0.5G   0.0712   0.0341   0.0213    0.127      32      64``: the columns of progress_header,
    ``mean_loss`` one value per loss term."""
    total = float(sum(mean_loss))
    return ("%10s" * 2 + "%10.4g" * (len(mean_loss) + 1) + "%10d" * 2) % (
        f"{epoch}/{epochs - 1}", f"{mem_gb:.3g}G", *mean_loss, total, labels, img_size)
