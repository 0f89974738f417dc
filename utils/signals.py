"""Graceful stop on SIGTERM / SIGINT: a flag the training loop checks between steps.

A signal only sets a flag; the loop asks ``should_stop()`` between steps (a collective, so every
rank decides at the same step even when only one was signalled), rank 0 saves ``last.pt``, and
``raise_stop()`` ends every rank with StopRequested (a KeyboardInterrupt, so the CLI exits non-zero).
The same signal a second time aborts at once (a SIGINT followed by torchrun's SIGTERM is one
request). The previous handlers come back on exit.

    with GracefulStop() as stop:
        for batch in loader:
            ...step...
            if stop.should_stop():
                save_last()          # rank 0
                stop.raise_stop()
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from utils import dist
from utils.logging import LOGGER

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(KeyboardInterrupt):
    """Training stopped on a signal after saving; ``exit_code`` is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class GracefulStop:
    """Context manager turning ``signals`` into a stop request checked between training steps.

    Handlers are installed only in the main thread (Python allows no other); elsewhere it is inert.
    """

    def __init__(self, signals: tuple[int, ...] = DEFAULT_SIGNALS) -> None:
        self.signals = signals
        self.signum: int | None = None  # the first signal received here (or by another rank)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the handlers that were there before back (idempotent)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum == signum:  # the same signal again: the user insists, stop now without saving
            self.restore()
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping at once")
        if self.signum is not None:  # e.g. Ctrl-C's SIGINT, then torchrun's SIGTERM: one stop request
            return
        self.signum = signum
        LOGGER.warning(f"{signal.Signals(signum).name} received: stopping after this step and saving last.pt "
                       "(send it again to stop at once)")

    @property
    def requested(self) -> bool:
        """True once this process received one of the signals (local, no communication)."""
        return self.signum is not None

    def should_stop(self) -> bool:
        """True on every rank when any rank received a signal. All ranks must call it, between steps."""
        if dist.any_rank(self.requested):
            self.signum = self.signum or signal.SIGTERM
            return True
        return False

    def raise_stop(self) -> None:
        """End training on this rank with StopRequested (after rank 0 saved)."""
        raise StopRequested(self.signum or signal.SIGTERM)
