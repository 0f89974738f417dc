"""Naming a stuck rank: per-rank marks and liveness beats in the job's store, and a thread that ends a job whose
ranks stopped making progress with one line that says which rank is late, whether it is alive, and where it was.

Every rank marks where it is (``at(phase, epoch, batch, waiting)``): a cheap local update from the training loop.
A background thread publishes each new mark to the job's key-value store (torchrun's agent store, or rank 0's
store under srun) as it comes, beats (adds 1 to its ``beat/<rank>`` counter) every second, and checks this rank's
own progress. Every rank makes the same sequence of marks, so the mark count orders them. When this rank has not
moved for the current phase's timeout (a little less than ``--ddp-timeout``, so this fires before the collective
itself fails; ``--ddp-long-timeout`` where one rank works for all), it reads every rank's mark and the beats it
has watched during the stall. A rank whose beat stopped is frozen or cut off, wherever it was (even waiting in
the same collective); a rank still beating but behind, or at the same mark without waiting, is stuck in its work.
The lowest live rank prints one line (``rank 1 is not responding: its process is frozen or its host is gone;
last seen waiting in checkpoint, epoch 2 ...``) and every watching rank exits, so the launcher ends the job.
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
BEAT_WINDOW = 3  # a peer whose beat has not moved for this many watch intervals of a stall is not responding


@dataclass
class Mark:
    """Where a rank is: how many marks it has made, the phase, epoch and batch, whether it waits for others."""

    seq: int = 0
    phase: str = "start-up"
    epoch: int = -1
    batch: int = -1
    waiting: bool = False
    long: bool = False  # a wait bounded by --ddp-long-timeout (one rank works for all)

    def seen(self) -> str:
        """``waiting in <where>`` or ``in <where>``."""
        return ("waiting in " if self.waiting else "in ") + self.where()

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


def stuck_message(rank: int, mine: Mark, marks: dict[int, Mark], stalled_s: float,
                  silent: list[int] | tuple[int, ...] = ()) -> str:
    """The one line a live rank prints: about the ``silent`` ranks (their beat stopped), else the late ranks, else
    about a wait every rank is in (every beat alive)."""
    waited = f"rank {rank} waited {stalled_s:.0f} s in {mine.where()}; ending the job"
    if silent:
        one = len(silent) == 1
        who = f"rank {silent[0]} is" if one else f"ranks {', '.join(map(str, silent))} are"
        why = "its process is frozen or its host is gone" if one else \
            "their processes are frozen or their hosts are gone"
        seen = "; ".join(("" if one else f"rank {r} ") + f"last seen {marks.get(r, Mark()).seen()}" for r in silent)
        return f"{who} not responding: {why}; {seen}; {waited}"
    late = late_ranks(mine, marks)
    if not late:
        return (f"every rank has waited {stalled_s:.0f} s in the same collective ({mine.where()}) and every rank "
                "is alive: the ranks lost each other (a network problem or a rank that left); ending the job")
    seen = "; ".join(f"rank {r} last seen in {marks[r].where()}" for r in late)
    who = "rank" if len(late) == 1 else "ranks"
    return f"{who} {', '.join(map(str, late))} stopped making progress ({seen}); {waited}"


class Beats:
    """Peers' liveness counters as this rank observed them during a stall: a rank whose counter has not moved for
    ``window_s`` of observation is silent (frozen, or its host gone)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.seen: dict[int, tuple[bytes, float, float]] = {}  # rank -> (value, first observed, last changed)

    def observe(self, values: dict[int, bytes], now: float) -> None:
        for r, value in values.items():
            old = self.seen.get(r)
            if old is None:
                self.seen[r] = (value, now, now)
            elif old[0] != value:
                self.seen[r] = (value, old[1], now)

    def silent(self, now: float) -> list[int]:
        return sorted(r for r, (_, first, changed) in self.seen.items()
                      if now - first >= self.window_s and now - changed >= self.window_s)

    def clear(self) -> None:
        self.seen.clear()


class MarkWatch:
    """This rank's mark and beat, published by a thread that also ends the job when progress stops.

    ``store`` is the job's store (keys ``mark/<rank>`` and ``beat/<rank>``); ``exit`` ends the process (os._exit by
    default; the main thread may be blocked in a collective that only times out later).
    """

    def __init__(self, store: tdist.Store, rank: int, world_size: int, timeout_s: float, long_timeout_s: float,
                 interval_s: float = 1.0, exit: Callable[[int], Any] = os._exit, script: str = "train") -> None:
        self.store, self.rank, self.world_size, self.script = store, rank, world_size, script
        self.timeout_s, self.long_timeout_s, self.interval_s = timeout_s, long_timeout_s, interval_s
        self.exit = exit
        self.mark, self.changed_at = Mark(), time.monotonic()
        self.beats = Beats(BEAT_WINDOW * interval_s)
        self._published, self._beat_at = -1, 0.0
        self._stop, self._changed = threading.Event(), threading.Event()
        self._lock = threading.Lock()  # one store connection, used by the thread and (rarely) the main thread
        self._thread = threading.Thread(target=self._run, name="mark-watch", daemon=True)

    def start(self) -> MarkWatch:
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
            try:
                self._tick(self.mark)
            except Exception as e:  # the store's host is gone or stuck: say so, then end like a stuck peer
                if not self._stop.is_set():
                    self._report(f"cannot reach the job's store ({str(e).splitlines()[0][:120]}); its host "
                                 "(torchrun's agent, or rank 0 without torchrun) may be stuck; ending the job")
                    self.exit(EXIT_STUCK)
                return

    def _tick(self, mark: Mark) -> None:
        """Publish a new mark, beat once a second, and during a stall watch the peers' beats and end the job when
        the stall outlasts the phase's timeout."""
        self._publish(mark)
        now = time.monotonic()
        if now - self._beat_at >= self.interval_s:
            with self._lock:
                self.store.add(f"beat/{self.rank}", 1)
            self._beat_at = now
        stalled = now - self.changed_at
        if stalled <= self.interval_s:
            self.beats.clear()  # moving: the next stall watches afresh
            return
        self.beats.observe(self.read_beats(), now)
        if stalled > EARLY * (self.long_timeout_s if mark.long else self.timeout_s):
            self._end(mark, stalled)

    def _publish(self, mark: Mark) -> None:
        with self._lock:
            if mark.seq != self._published:
                self.store.set(f"mark/{self.rank}", json.dumps(asdict(mark)))
                self._published = mark.seq

    def flush(self) -> None:
        """Publish the current mark now (a rank on its way out after an error: its peers then see where it was)."""
        try:
            self._publish(self.mark)
        except Exception:  # noqa: S110 - the store may be gone; the mark is a courtesy
            pass

    def _read(self, kind: str) -> dict[int, bytes]:
        """Every other rank's ``<kind>/<rank>`` value (ranks that never wrote one are left out)."""
        keys = [f"{kind}/{r}" for r in range(self.world_size) if r != self.rank]
        with self._lock:
            present = [k for k in keys if self.store.check([k])]
            values = self.store.multi_get(present) if present else []
        return {int(k.split("/")[1]): v for k, v in zip(present, values)}

    def read_marks(self) -> dict[int, Mark]:
        """Every other rank's last published mark."""
        return {r: Mark(**json.loads(v.decode())) for r, v in self._read("mark").items()}

    def read_beats(self) -> dict[int, bytes]:
        """Every other rank's beat counter (as stored)."""
        return self._read("beat")

    def _end(self, mine: Mark, stalled: float) -> None:
        marks, silent = self.read_marks(), self.beats.silent(time.monotonic())
        quiet = set(late_ranks(mine, marks)) | set(silent)
        lowest_live = min([r for r in range(self.world_size) if r not in quiet] or [self.rank])
        if self.rank == lowest_live:  # one line from one live rank, not one from each
            self._report(stuck_message(self.rank, mine, marks, stalled, silent))
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
