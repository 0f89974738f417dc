"""benchmarks.harness: median and spread of timings on a fake clock, the reference ratio, the header, the environment
of child processes."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks.harness import Reference, Stats, cuda_device_name, header, launch_env, time_call
from utils.distributed import openmp


class FakeClock:
    """A clock that advances by the next of ``durations`` during each timed call."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.calls = 100.0, iter(durations), 0

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.calls += 1
        self.now += next(self.durations)


def test_time_call_reports_median_and_spread_of_the_timed_runs():
    clock = FakeClock([50.0, 3.0, 1.0, 2.0, 10.0, 4.0])  # the first call is the untimed warm-up
    stats = time_call(clock.work, runs=5, warmup=1, clock=clock)
    assert clock.calls == 6
    assert stats.samples == (3.0, 1.0, 2.0, 10.0, 4.0)
    assert (stats.median, stats.low, stats.high) == (3.0, 1.0, 10.0)
    assert stats.quartiles == (2.0, 4.0)
    assert stats.spread == pytest.approx(3.0)  # (10 - 1) / 3
    assert stats.scaled(1e3).fmt(1) == "3000.0 [1000.0-10000.0]"


def test_time_call_syncs_around_each_run():
    events = []
    clock = FakeClock([1.0] * 3)
    time_call(lambda: (events.append("call"), clock.work()), runs=2, warmup=1, clock=clock,
              sync=lambda: events.append("sync"))
    assert events == ["call", "sync", "call", "sync", "sync", "call", "sync"]


def test_stats_merge_even_count_and_errors():
    merged = Stats.merge(Stats.of([4, 1]), Stats.of([3, 2]))
    assert merged.median == 2.5 and (merged.low, merged.high) == (1, 4)
    assert Stats.of([7.0]).quartiles == (7.0, 7.0)
    with pytest.raises(ValueError):
        Stats.of([])
    with pytest.raises(ValueError):
        time_call(lambda: None, runs=0)


def test_reference_ratio_uses_both_measurements():
    ticks = itertools.count(step=0.5)  # every reading 0.5 s after the previous one: each matmul "takes" 0.5 s
    ref = Reference(n=8, runs=3, clock=lambda: next(ticks))
    with pytest.raises(RuntimeError):
        ref.ratio(1.0)
    ref.measure()
    ref.measure()
    assert ref.before.samples == ref.after.samples == (0.5, 0.5, 0.5)
    assert ref.ratio(2.0) == 4.0  # 2 s is the time of 4 reference matmuls
    assert ref.gflops() == pytest.approx(2 * 8**3 / 0.5 / 1e9)
    assert "0% apart" in ref.describe()


def test_header_states_the_load_and_the_machine():
    text = header("bench_x: something")
    assert text.startswith("bench_x: something\n")
    assert "load average" in text and "threads" in text and "torch " in text and "CUDA not used" in text


def test_cuda_device_name_reads_cli_and_torch_device_strings():
    assert cuda_device_name("cpu") is None and cuda_device_name(torch.device("cpu")) is None
    for device in ("0", "0,1", "cuda", "cuda:0"):
        assert cuda_device_name(device) is not None  # the GPU's name, or 'unavailable' without CUDA


def test_a_child_process_runs_without_the_defaults_our_package_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """A baseline trainer (ultralytics, YOLOv5) or another checkout must not inherit our OpenMP default."""
    monkeypatch.setattr(openmp, "PROCESS_DEFAULTS", {"GOMP_SPINCOUNT": "10000"})
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    monkeypatch.setenv("BENCH_KEPT", "yes")
    env = launch_env(YOLO_OFFLINE="true")
    assert "GOMP_SPINCOUNT" not in env and env["BENCH_KEPT"] == "yes" and env["YOLO_OFFLINE"] == "true"
    monkeypatch.setattr(openmp, "PROCESS_DEFAULTS", {})  # the user's own setting is passed on
    assert launch_env()["GOMP_SPINCOUNT"] == "10000"
