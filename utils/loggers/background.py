"""Plots drawn on one background thread of the main process, so drawing never blocks training."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from utils.log import LOGGER


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
