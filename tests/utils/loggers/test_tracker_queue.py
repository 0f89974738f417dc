"""The trackers' call queue: in order, never blocking, one warning for a tracker that fails, is slow or overflows."""

from __future__ import annotations

import threading
import time

from utils.loggers.tracker_queue import TrackerQueue


def warnings_of(lines: list[str], name: str) -> list[str]:
    return [line for line in lines if line.startswith(f"WARNING: {name}:")]


def test_calls_run_in_order_and_close_waits_for_them(yolo_log):
    calls: list[int] = []
    tracker = TrackerQueue("ordered")
    for i in range(50):
        tracker.submit(calls.append, i)
    assert tracker.close(timeout_s=30) is True
    assert calls == list(range(50))
    assert not warnings_of(yolo_log, "ordered")


def test_a_failing_tracker_gives_one_warning_and_is_skipped_afterwards(yolo_log):
    calls: list[str] = []

    def rejects(tag: str) -> None:
        calls.append(tag)
        raise ConnectionError("connection refused\nsecond line")

    tracker = TrackerQueue("down")
    for tag in ("a", "b", "c"):
        tracker.submit(rejects, tag)
    tracker.submit(calls.append, "end of the run", always=True)
    assert tracker.close(timeout_s=30) is False
    assert calls == ["a", "end of the run"]  # after the first failure only the run's end is still sent
    assert tracker.dropped == 3
    (warning,) = warnings_of(yolo_log, "down")
    assert "rejects failed (ConnectionError: connection refused)" in warning and "training continues" in warning


def test_a_slow_tracker_never_blocks_submit_and_close_gives_up_in_time(yolo_log):
    release = threading.Event()
    tracker = TrackerQueue("slow", size=4)
    tracker.submit(release.wait)  # the worker hangs on this call until released
    for _ in range(20):  # more than the queue holds: the extra calls are dropped, not waited for (no hang)
        tracker.submit(time.sleep, 0)
    start = time.monotonic()
    assert tracker.close(timeout_s=0.5) is False
    close_s = time.monotonic() - start
    release.set()
    assert tracker.dropped >= 20 - 4
    assert close_s < 10  # bounded by the flush timeout, not by the hung call
    (warning,) = warnings_of(yolo_log, "slow")  # the overflow warned; giving up at close adds no second line
    assert "4 calls are waiting" in warning
