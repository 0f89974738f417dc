"""A bounded queue of calls to one tracker, run by one background thread, so tracking never costs training.

A tracker that is down, slow or rejects a call gives one warning and is then skipped: what training writes
locally (results.csv, plots, weights) is untouched. At close the queue gets a few seconds to drain, then it is
abandoned (the thread is a daemon: it never holds the process).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from utils.log import LOGGER

QUEUE_SIZE = 256  # calls waiting; a full queue drops new calls instead of blocking the training loop
FLUSH_S = 10.0  # how long close() waits for the queued calls at the end of a run
CANCELLED_FLUSH_S = 3.0  # ... of a stopped run (a SIGTERM's grace period is short)
LOCAL_COPY = "training continues; results.csv, plots and weights stay in the run folder"


class TrackerQueue:
    """Calls to one tracker, in order, on a daemon thread. ``submit`` never blocks; the first failure (an
    exception, a full queue, a flush that runs out of time) is one warning, after which calls are dropped."""

    def __init__(self, name: str, size: int = QUEUE_SIZE) -> None:
        self.name = name
        self.calls: queue.Queue = queue.Queue(maxsize=size)
        self.failed = False  # a call failed or the queue overflowed: the tracker is skipped from now on
        self.dropped = 0  # calls not made
        self._warned = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name=f"tracker-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, always: bool = False, **kwargs: Any) -> None:
        """Queue ``fn(*args, **kwargs)``; dropped (never blocking) once the tracker failed or the queue is full,
        unless ``always`` (ending the run: an offline tracker then still writes its archive)."""
        if self.failed and not always:
            self.dropped += 1
            return
        try:
            self.calls.put_nowait((fn, args, kwargs, always))
        except queue.Full:
            self.dropped += 1
            self.fail(f"{self.calls.maxsize} calls are waiting (the tracker is slow or unreachable)")

    def fail(self, reason: str) -> None:
        """Stop calling the tracker; the first reason given is the one warning."""
        with self._lock:
            self.failed = True
            if self._warned:
                return
            self._warned = True
        LOGGER.warning(f"WARNING: {self.name}: {reason}; {LOCAL_COPY}")

    def close(self, timeout_s: float = FLUSH_S) -> bool:
        """Let the queued calls run for up to ``timeout_s``, then abandon the rest; True when all ran."""
        deadline = time.monotonic() + timeout_s
        self.end()
        return self.wait(deadline, timeout_s)

    def end(self) -> None:
        """Queue the end marker behind every queued call; never blocks (a full queue belongs to a tracker that
        already failed: its thread is abandoned at the deadline)."""
        try:
            self.calls.put_nowait(None)
        except queue.Full:
            pass

    def wait(self, deadline: float, timeout_s: float) -> bool:
        """Wait for the thread to reach the end marker until ``deadline`` (``timeout_s``: the budget it was given,
        for the warning); a thread still busy then is abandoned (a daemon: it cannot hold the process)."""
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            self.fail(f"gave up after {timeout_s:g} s with {self.calls.qsize()} calls still queued")
            return False
        return not self.failed

    def _work(self) -> None:
        while True:
            item = self.calls.get()
            if item is None:
                return
            fn, args, kwargs, always = item
            if self.failed and not always:
                self.dropped += 1
                continue
            try:
                fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - any tracker error: warn once, keep training
                self.dropped += 1
                self.fail(f"{getattr(fn, '__name__', 'a call')} failed ({type(e).__name__}: {_first_line(e)})")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else "no message"
