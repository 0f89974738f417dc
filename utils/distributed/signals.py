"""Stopping on a signal without losing work: SIGTERM / SIGINT (a scheduler's pre-emption, Ctrl-C) and SIGUSR1
(Slurm's warning before a time limit, ``sbatch --signal=USR1@90``).

A signal only records its number. The training loop shares it with every rank in its per-step vote
(``utils.training.engine.StepVote``), so every rank stops at the same step even when one alone was signalled; rank 0
saves ``last.pt`` there and ``raise_stop()`` ends every rank with StopRequested. Outside the steps (validation,
plots, the epoch's checkpoint) a signal stops at once: ``last.pt`` is whatever was last written whole.
The same signal a second time (more than REPEAT_WINDOW_S later) aborts at once, and so does a stop request after
which no step ends for STUCK_S seconds (a data reader or a peer stuck: the rank ends within a scheduler's grace
period instead of waiting for its SIGKILL). SIGUSR1 ends with exit code 0,
so Slurm can requeue the job and the new attempt resumes by itself; SIGTERM and SIGINT end with 128 + the signal
number. DataLoader workers ignore all three (``protect_worker``): their rank decides.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

from utils.log import LOGGER

# SIGUSR1 (Slurm's warning) where the platform has it: Windows has none, and there SIGTERM and SIGINT remain.
REQUEUE_SIGNALS = (signal.SIGUSR1,) if hasattr(signal, "SIGUSR1") else ()  # stop, save and exit 0: requeue
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, *REQUEUE_SIGNALS)
# The same signal again within this many seconds is the same request delivered twice (Slurm signals every process
# of a job and torchrun forwards what it got to the ranks), not a user insisting.
REPEAT_WINDOW_S = 3.0
# After a stop request, this long without a step ending (a data reader or a peer stuck) stops at once: within the
# grace period a scheduler gives before its SIGKILL (Kubernetes' and Slurm's default: 30 s).
STUCK_S = 20.0


class StopRequested(KeyboardInterrupt):
    """Training stopped on a signal. ``exit_code`` is 0 for a requeue signal, else 128 + the signal number."""

    def __init__(self, signum: int, message: str) -> None:
        self.signum, self.message = signum, message
        self.exit_code = 0 if signum in REQUEUE_SIGNALS else 128 + signum
        super().__init__(message)

    def __reduce__(self) -> tuple:  # pickled with both arguments (train.run's processes send it back)
        return type(self), (self.signum, self.message)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def protect_worker() -> None:
    """For DataLoader workers (call first in the worker): leave SIGTERM, SIGINT and SIGUSR1 to the rank that owns
    the worker, so that a scheduler signalling every process of the job (Slurm's scancel, Ctrl-C in a terminal,
    torchrun signalling the rank's process group) never kills the workers under a rank that is saving.

    SIGINT and SIGUSR1 are ignored. SIGTERM is blocked and read by a thread that exits the worker only when the
    rank itself sends it (Python's multiprocessing terminates daemonic workers so at exit); from anyone else it
    is ignored. Where the platform cannot block signals per thread (Windows), SIGTERM keeps its default.
    """
    for sig in (signal.SIGINT, *REQUEUE_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)
    if not hasattr(signal, "pthread_sigmask") or not hasattr(signal, "sigwaitinfo"):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    owner = os.getppid()

    def watch() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == owner:
                os._exit(0)

    threading.Thread(target=watch, name="sigterm-watch", daemon=True).start()


def ignore_launcher_stop() -> None:
    """For a rank that is leaving because its peers are gone: ignore the launcher's SIGTERM from here on. torchrun
    sends it to the ranks still alive as soon as one fails, and its default action would end this rank during its
    teardown, before it says which rank left; the launcher's SIGKILL after its grace period still ends a rank that
    does not exit. Main thread only (elsewhere a no-op)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


class GracefulStop:
    """Context manager turning ``signals`` into a stop request; see the module docstring.

    Handlers are installed only in the main thread (Python allows no other); elsewhere it is inert.
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS, elastic: bool = False,
                 stuck_s: float = STUCK_S) -> None:
        self.signals, self.stuck_s = signals, stuck_s
        self.elastic = elastic  # under torchrun's elastic agent, whose SIGTERM may be a restart (a node joined)
        self._timer: threading.Timer | None = None  # while a stop is pending: fires when no step ends in stuck_s
        self._stuck = False
        self.signum: int | None = None  # the first signal received here
        self.agreed_signum: int | None = None  # the signal every rank agreed to stop on
        self.where = ""  # what was running when it stopped, for the exit message
        self._immediate = False
        self._received_at = 0.0
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._stuck:  # our own timer: no step ended for stuck_s seconds after the stop request
            self._stuck, self.agreed_signum = False, self.signum or signum
            self.restore()
            raise StopRequested(self.agreed_signum, f"stopped by {signal_name(self.agreed_signum)}: no step ended "
                                                    f"within {self.stuck_s:g} s of it (a data reader or a peer is "
                                                    "stuck); last.pt is the one last written whole")
        repeat = self.signum == signum and time.monotonic() - self._received_at > REPEAT_WINDOW_S
        if repeat:  # the same signal again, later: the user insists, stop now without saving
            self.restore()
            raise KeyboardInterrupt(f"second {signal_name(signum)}: stopping at once")
        if self.signum is not None:  # e.g. Ctrl-C's SIGINT, then torchrun's SIGTERM: one stop request
            return
        self.signum, self._received_at = signum, time.monotonic()
        if self._immediate:
            self.agreed_signum = signum
            raise StopRequested(signum, f"stopped by {signal_name(signum)} {self.where}")
        LOGGER.warning(f"{signal_name(signum)} received: stopping after this step and saving last.pt "
                       "(send it again to stop at once)")
        self._arm()

    def _arm(self) -> None:
        """(Re)start the watch of a pending stop: when no step ends within ``stuck_s``, the main thread gets the
        signal again and stops at once (a blocked read or wait is interrupted by it)."""
        if self._timer is not None:
            self._timer.cancel()
        if not self._previous:  # handlers not installed here (not the main thread): nothing would act on it
            return
        self._timer = threading.Timer(self.stuck_s, self._overdue)
        self._timer.daemon = True
        self._timer.start()

    def _overdue(self) -> None:
        if self._previous and self.signum is not None:
            self._stuck = True
            signal.pthread_kill(threading.main_thread().ident, self.signum)

    @property
    def requested(self) -> bool:
        """True once this process received one of the signals (local, no communication)."""
        return self.signum is not None

    @property
    def agreed(self) -> bool:
        """True once the ranks agreed to stop (after a vote that carried a signal)."""
        return self.agreed_signum is not None

    def agree(self, voted_signum: int) -> None:
        """Record the outcome of a vote: ``voted_signum`` is a signal some rank received (0: none)."""
        if voted_signum and self.agreed_signum is None:
            self.agreed_signum = voted_signum
            self.signum = self.signum or voted_signum
        if self._timer is not None:  # a step ended: the stop is on its way (to the next checkpoint boundary)
            self._arm()

    @contextlib.contextmanager
    def immediate(self, where: str) -> Iterator[None]:
        """Inside: a signal stops at once with StopRequested (``where`` says what was interrupted)."""
        self._immediate, self.where = True, where
        try:
            if self.signum is not None and self.agreed_signum is None:  # it came just before: act on it now
                self.agreed_signum = self.signum
                raise StopRequested(self.signum, f"stopped by {signal_name(self.signum)} {where}")
            yield
        finally:
            self._immediate = False

    def raise_stop(self, epoch: int, batch: int) -> None:
        """End training on this rank with StopRequested after rank 0 saved the step."""
        if self._timer is not None:  # stopping now: nothing is stuck
            self._timer.cancel()
            self._timer = None
        signum = self.agreed_signum or signal.SIGTERM
        then = "the job can be requeued" if signum in REQUEUE_SIGNALS else "continue with --resume"
        if self.elastic and signum == signal.SIGTERM:
            then = "torchrun's next round (a node joined or left) continues from it, or " + then
        raise StopRequested(signum, f"stopped by {signal_name(signum)} at epoch {epoch}, batch {batch}; "
                                    f"last.pt saved; {then}")
