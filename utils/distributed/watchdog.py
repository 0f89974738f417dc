"""Naming a stuck rank: per-rank progress records in the job's store, and a thread that ends a job whose ranks
stopped making progress with one line that says which rank is late and where it was last seen.

Every rank marks where it is (``at(phase, epoch, batch, waiting)``): a cheap local update from the training loop.
A background thread publishes each new mark to the job's key-value store (torchrun's agent store, or rank 0's
store under srun) as it comes, and every second checks this rank's own progress. Every rank makes the same
sequence of marks, so the mark count orders them. When this rank has not moved for the current phase's timeout
(a little less than ``--ddp-timeout``, so this fires before the collective itself fails; ``--ddp-long-timeout``
where one rank works for all), it reads every rank's mark: the late ranks are those behind it, or at its mark
but not waiting. The lowest live rank prints ``rank 1 stopped making progress (rank 1 last seen in train,
epoch 0, batch 7) ...`` and every watching rank exits, so the launcher ends the job instead of letting it hang.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch.distributed as tdist

EXIT_STUCK = 3
EARLY = 0.9  # fire at this share of the timeout, before the collective's own timeout raises


@dataclass
class Mark:
    """Where a rank is: how many marks it has made, the phase, epoch and batch, whether it waits for others."""

    seq: int = 0
    phase: str = "start-up"
    epoch: int = -1
    batch: int = -1
    waiting: bool = False
    long: bool = False  # a wait bounded by --ddp-long-timeout (one rank works for all)

    def where(self) -> str:
        parts = [self.phase] + ([f"epoch {self.epoch}"] if self.epoch >= 0 else []) + \
            ([f"batch {self.batch}"] if self.batch >= 0 else [])
        return ", ".join(parts)


def late_ranks(mine: Mark, marks: dict[int, Mark]) -> list[int]:
    """The ranks holding the others up: behind ``mine``, or at it without waiting (stuck inside the work)."""
    return sorted(r for r, m in marks.items() if m.seq < mine.seq or (m.seq == mine.seq and not m.waiting))


def is_peer_failure(error: BaseException) -> bool:
    """A collective failed because another rank is gone or unreachable (not a bug of this rank's own)."""
    text = str(error)
    return isinstance(error, tdist.DistError) or (isinstance(error, RuntimeError) and any(
        marker in text for marker in ("gloo/transport", "Connection closed by peer", "Connection reset by peer",
                                      "ProcessGroupNCCL", "NCCL error")))


def stuck_message(rank: int, mine: Mark, marks: dict[int, Mark], stalled_s: float) -> str:
    """The one line a live rank prints about the late ranks (or about a wait every rank is in)."""
    late = late_ranks(mine, marks)
    if not late:
        return (f"every rank has waited {stalled_s:.0f} s in the same collective ({mine.where()}): the ranks "
                "lost each other (a network problem or a rank that left); ending the job")
    seen = "; ".join(f"rank {r} last seen in {marks[r].where()}" for r in late)
    who = "rank" if len(late) == 1 else "ranks"
    return (f"{who} {', '.join(map(str, late))} stopped making progress ({seen}); rank {rank} waited "
            f"{stalled_s:.0f} s in {mine.where()}; ending the job")


class ProgressWatch:
    """This rank's progress mark, published by a thread that also ends the job when progress stops.

    ``store`` is the job's store (keys ``progress/<rank>``); ``exit`` ends the process (os._exit by default;
    the main thread may be blocked in a collective that only times out later).
    """

    def __init__(self, store: tdist.Store, rank: int, world_size: int, timeout_s: float, long_timeout_s: float,
                 interval_s: float = 1.0, exit: Callable[[int], Any] = os._exit, script: str = "train") -> None:
        self.store, self.rank, self.world_size, self.script = store, rank, world_size, script
        self.timeout_s, self.long_timeout_s, self.interval_s = timeout_s, long_timeout_s, interval_s
        self.exit = exit
        self.mark, self.changed_at = Mark(), time.monotonic()
        self._published = -1
        self._stop, self._changed = threading.Event(), threading.Event()
        self._lock = threading.Lock()  # one store connection, used by the thread and (rarely) the main thread
        self._thread = threading.Thread(target=self._run, name="progress-watch", daemon=True)

    def start(self) -> ProgressWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._changed.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s)

    def at(self, phase: str, epoch: int = -1, batch: int = -1, waiting: bool = False, long: bool = False) -> None:
        """Mark where this rank is (cheap: the thread publishes it)."""
        self.mark = Mark(self.mark.seq + 1, phase, epoch, batch, waiting, long)
        self.changed_at = time.monotonic()
        self._changed.set()  # the thread publishes it now (a frozen rank's last mark is then its true place)

    def waits(self, long: bool = False) -> None:
        """Mark that this rank now waits for the others where it is (a collective)."""
        m = self.mark
        self.at(m.phase, m.epoch, m.batch, waiting=True, long=long)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._changed.wait(self.interval_s)
            self._changed.clear()
            if self._stop.is_set():
                return
            mark = self.mark
            try:
                self._publish(mark)
                stalled = time.monotonic() - self.changed_at
                if stalled > EARLY * (self.long_timeout_s if mark.long else self.timeout_s):
                    self._end(mark, stalled)
            except Exception as e:  # the store's host is gone or stuck: say so, then end like a stuck peer
                if not self._stop.is_set():
                    self._report(f"cannot reach the job's store ({str(e).splitlines()[0][:120]}); its host "
                                 "(torchrun's agent, or rank 0 without torchrun) may be stuck; ending the job")
                    self.exit(EXIT_STUCK)
                return

    def _publish(self, mark: Mark) -> None:
        with self._lock:
            if mark.seq != self._published:
                self.store.set(f"progress/{self.rank}", json.dumps(asdict(mark)))
                self._published = mark.seq

    def flush(self) -> None:
        """Publish the current mark now (a rank on its way out after an error: its peers then see where it was)."""
        try:
            self._publish(self.mark)
        except Exception:  # noqa: S110 - the store may be gone; the mark is a courtesy
            pass

    def read_marks(self) -> dict[int, Mark]:
        """Every other rank's last published mark (ranks that never published are left out)."""
        keys = [f"progress/{r}" for r in range(self.world_size) if r != self.rank]
        with self._lock:
            present = [k for k in keys if self.store.check([k])]
            values = self.store.multi_get(present) if present else []
        return {int(k.split("/")[1]): Mark(**json.loads(v.decode())) for k, v in zip(present, values)}

    def _end(self, mine: Mark, stalled: float) -> None:
        marks = self.read_marks()
        late = late_ranks(mine, marks)
        lowest_live = min([r for r in range(self.world_size) if r not in late] or [self.rank])
        if self.rank == lowest_live:  # one line from one live rank, not one from each
            self._report(stuck_message(self.rank, mine, marks, stalled))
        self.exit(EXIT_STUCK)

    def peer_failure(self, error: BaseException) -> str | None:
        """The line to print when a collective failed because a peer is gone: which ranks were behind this one
        (so likely gone) and where they were last seen; None on the ranks that should stay quiet (all but the
        lowest rank that was not behind)."""
        try:
            marks = self.read_marks()
        except Exception:  # the store may be gone with the peer
            marks = {}
        late = late_ranks(self.mark, marks)
        if self.rank != min([r for r in range(self.world_size) if r not in late] or [self.rank]):
            return None
        seen = "; ".join(f"rank {r} last seen in {marks[r].where()}" for r in late) or "no rank was behind it"
        return (f"rank {self.rank} lost its peers during a collective in {self.mark.where()} ({seen}): "
                f"{str(error).splitlines()[0][:160]}")

    def _report(self, text: str) -> None:
        print(f"{self.script}: error: {text}", file=sys.stderr, flush=True)


def store_timeout(timeout_s: float) -> datetime.timedelta:
    """How long a store operation of the watch may block: short, so an unreachable store is noticed."""
    return datetime.timedelta(seconds=max(5.0, min(30.0, timeout_s / 2)))
