"""The training progress bar and its text (the reference's columns, one per term of the family's loss), shown on the
main process only: a tqdm bar on a terminal, one line per epoch elsewhere (a log file, a pipe), so a log holds the
epoch's final figures rather than every redraw of the bar."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from tqdm import tqdm

BAR_FORMAT = "{l_bar}{bar:10}{r_bar}"


def progress_columns(loss_names: Sequence[str]) -> tuple[str, ...]:
    """Epoch, gpu_mem, each loss term by its name, total, labels, img_size."""
    return ("Epoch", "gpu_mem", *loss_names, "total", "labels", "img_size")


def progress_header(loss_names: Sequence[str]) -> str:
    columns = progress_columns(loss_names)
    return ("\n" + "%10s" * len(columns)) % columns


def progress_bar(batches: Iterable, total: int, enabled: bool = True) -> Any:
    """A tqdm bar over ``batches`` where stdout is a terminal; elsewhere a PhaseLine (the same calls, one line at
    the end); disabled (silent, same interface) where ``enabled`` is False."""
    if enabled and not sys.stdout.isatty():
        return PhaseLine(batches, total, sys.stdout)
    return tqdm(batches, total=total, bar_format=BAR_FORMAT, leave=True, ncols=120, mininterval=1.0,
                file=sys.stdout, disable=not enabled)


class PhaseLine:
    """A phase's progress for output that is not a terminal: iterating yields the batches and prints nothing;
    ``close()`` prints the last description once, with the batches done and the time taken."""

    def __init__(self, batches: Iterable, total: int, file: TextIO) -> None:
        self.batches, self.total, self.file = batches, total, file
        self.description, self.done, self.closed = "", 0, False
        self.start = time.perf_counter()

    def __iter__(self) -> Iterator:
        for batch in self.batches:
            yield batch
            self.done += 1

    def set_description(self, description: str, refresh: bool = True) -> None:
        self.description = description

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            seconds = time.perf_counter() - self.start
            self.file.write(f"{self.description}  {self.done}/{self.total} batches in {seconds:.1f}s\n")
            self.file.flush()


def progress_text(epoch: int, epochs: int, mem_gb: float, mean_loss: Sequence[float], labels: int,
                  img_size: int) -> str:
    """``   3/9     0.5G   0.0712   0.0341   0.0213    0.127      32      64``: the columns of progress_header,
    ``mean_loss`` one value per loss term."""
    total = float(sum(mean_loss))
    return ("%10s" * 2 + "%10.4g" * (len(mean_loss) + 1) + "%10d" * 2) % (
        f"{epoch}/{epochs - 1}", f"{mem_gb:.3g}G", *mean_loss, total, labels, img_size)
