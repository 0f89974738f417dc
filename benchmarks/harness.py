"""Shared pieces of the benchmark scripts, so that their figures stay honest on a shared, loaded machine.

- ``Stats``: the median and spread (min-max, quartiles) of repeated measurements, never a single number.
- ``time_call``: time a callable ``runs`` times after a warm-up (wall or CPU clock, CUDA synchronised).
- ``Reference``: a fixed fp32 matmul timed in the same run before and after the figures; every figure is
  also given in units of it (``Reference.ratio``), which moves far less than milliseconds when other jobs
  share the cores.
- ``add_timing_flags``: ``--threads`` and ``--clock`` (a name of ``CLOCKS``), the same in every script.
- ``header``: the standard first lines, stating the load average, threads, torch version, CPU model and
  whether CUDA was used.
- ``ServeProcess``: a benchmark's ``--serve`` child for one checkout, asked for timings one JSON line at a time
  (the comparisons of two checkouts in turns).
- ``EpochClock``: the CPU seconds of a training process tree each time its results.csv gains a row.

Scripts import it as ``from benchmarks.harness import ...`` after putting the repository root on sys.path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

Clock = Callable[[], float]
CLOCKS: dict[str, Clock] = {"wall": time.perf_counter, "cpu": time.process_time}


def add_timing_flags(parser: argparse.ArgumentParser, scope: str = "") -> None:
    """``--threads`` (torch CPU threads, 0 = torch's default) and ``--clock`` (wall or this process's CPU time);
    ``scope`` starts their help texts (e.g. "variants: ")."""
    parser.add_argument("--threads", type=int, default=0, help=f"{scope}torch CPU threads (0: torch's default)")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help=f"{scope}wall time, or this process's CPU time (with --threads 1 on a busy machine)")


@dataclass(frozen=True)
class Stats:
    """Repeated measurements of one figure (seconds, ms, images/s, a ratio...): median and spread."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("Stats needs at least one sample")

    @classmethod
    def of(cls, samples: Iterable[float]) -> Stats:
        return cls(tuple(float(s) for s in samples))

    @classmethod
    def merge(cls, *parts: Stats) -> Stats:
        """One Stats over the samples of several runs or processes."""
        return cls(tuple(s for part in parts for s in part.samples))

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        """First and third quartiles (inclusive method: both equal the sample with one sample)."""
        if len(self.samples) == 1:
            return self.samples[0], self.samples[0]
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q3

    @property
    def spread(self) -> float:
        """(max - min) / median: 0.1 means the runs were within 10% of the median."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def scaled(self, factor: float) -> Stats:
        """Every sample times ``factor`` (seconds -> ms with 1e3, per batch -> per image with 1 / batch)."""
        return Stats(tuple(s * factor for s in self.samples))

    def fmt(self, digits: int = 2, width: int = 0) -> str:
        """'median [min-max]', e.g. '3.10 [2.95-3.40]'."""
        text = f"{self.median:.{digits}f} [{self.low:.{digits}f}-{self.high:.{digits}f}]"
        return f"{text:>{width}}"


def time_call(fn: Callable[[], object], runs: int = 5, warmup: int = 1, clock: Clock = time.perf_counter,
              sync: Callable[[], None] | None = None) -> Stats:
    """Seconds of each of ``runs`` calls of ``fn`` after ``warmup`` untimed calls; ``sync`` (e.g.
    torch.cuda.synchronize) runs before each reading so queued GPU work is counted."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        if sync is not None:
            sync()
        start = clock()
        fn()
        if sync is not None:
            sync()
        samples.append(clock() - start)
    return Stats.of(samples)


def cuda_sync(device: torch.device | str) -> Callable[[], None] | None:
    """torch.cuda.synchronize for a CUDA device, None elsewhere (the ``sync`` of time_call)."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else None


@dataclass
class Reference:
    """A fixed n x n fp32 matmul (2 n^3 FLOPs), timed with the figures' threads and clock before and after them.

    A figure divided by one matmul's time (``ratio``) says how much work it is on this machine as loaded
    now; a large gap between before and after says the load changed during the run.
    """

    n: int = 1024
    runs: int = 5
    device: str = "cpu"
    clock: Clock = time.perf_counter
    before: Stats | None = None
    after: Stats | None = None
    _operands: tuple[torch.Tensor, ...] = field(default=(), repr=False)

    def measure(self) -> Stats:
        """Time the matmul: the first call fills ``before``, later calls ``after``."""
        if not self._operands:
            gen = torch.Generator().manual_seed(0)
            a, b = (torch.randn(self.n, self.n, generator=gen).to(self.device) for _ in range(2))
            self._operands = (a, b, torch.empty_like(a))
        a, b, out = self._operands
        stats = time_call(lambda: torch.mm(a, b, out=out), self.runs, 1, self.clock, cuda_sync(self.device))
        if self.before is None:
            self.before = stats
        else:
            self.after = stats
        return stats

    @property
    def seconds(self) -> float:
        """Median seconds of one matmul over every measurement so far."""
        parts = [s for s in (self.before, self.after) if s is not None]
        if not parts:
            raise RuntimeError("Reference.measure() has not run")
        return Stats.merge(*parts).median

    def gflops(self, stats: Stats | None = None) -> float:
        """GFLOP/s of the matmul (of ``stats``, else of every measurement)."""
        seconds = stats.median if stats is not None else self.seconds
        return 2 * self.n**3 / seconds / 1e9

    def ratio(self, seconds: float) -> float:
        """``seconds`` in units of one reference matmul: comparable between runs on a busy machine."""
        return seconds / self.seconds

    def describe(self) -> str:
        """One line: the rate before and after, and how far apart they are."""
        text = f"reference: fp32 matmul {self.n}x{self.n} on {self.device}"
        if self.before is not None:
            text += f", {self.before.median * 1e3:.2f} ms = {self.gflops(self.before):.1f} GFLOP/s before"
        if self.after is not None:
            gap = abs(self.after.median - self.before.median) / self.before.median
            text += (f", {self.after.median * 1e3:.2f} ms = {self.gflops(self.after):.1f} GFLOP/s after "
                     f"({gap:.0%} apart{': the load changed' if gap > 0.15 else ''})")
        return text


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    """'1.42 0.67 0.27' (1, 5, 15 minutes), or 'unknown' where the OS has none."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def cuda_device_name(device: torch.device | str) -> str | None:
    """The GPU's name when ``device`` is a CUDA device (torch.device, 'cuda:1', or a CLI index like '0' or '0,1'),
    else None."""
    text = str(device).strip().lower()
    if text.startswith("cuda"):
        index = torch.device(text).index or 0
    elif text.replace(",", "").isdigit():
        index = int(text.split(",")[0])
    else:
        return None
    return torch.cuda.get_device_name(index) if torch.cuda.is_available() else "unavailable"


def header(title: str, device: torch.device | str = "cpu", clock: str = "wall") -> str:
    """The standard first lines of a benchmark: what runs, and the state of the machine it runs on."""
    gpu = cuda_device_name(device)
    if gpu is not None:
        cuda = f"CUDA used ({gpu})"
    else:
        cuda = f"CUDA not used ({'available' if torch.cuda.is_available() else 'not available'})"
    return (f"{title}\n"
            f"machine: {cpu_model()}, {os.cpu_count()} CPUs, load average {load_average()} (1/5/15 min)\n"
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cuda}, {clock} clock")


def launch_env(**extra: str) -> dict[str, str]:
    """The environment of a benchmark's child process: this one's without the defaults our utils package set in it
    (utils.distributed.openmp.PROCESS_DEFAULTS: a baseline trainer, or another checkout, runs with its own), plus
    ``extra``."""
    from utils.distributed.openmp import PROCESS_DEFAULTS

    return {**{k: v for k, v in os.environ.items() if k not in PROCESS_DEFAULTS}, **extra}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for a process group of the benchmark)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """A benchmark's ``--serve`` child process for one checkout (``tree``): it prints one JSON line when ready and
    one per request, with the request's ``seconds``; other output (a label scan's) is skipped."""

    def __init__(self, tree: Path, command: list[str], env: dict[str, str] | None = None) -> None:
        self.tree = tree
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree,
                                     env=env if env is not None else launch_env())
        self._read()  # ready

    def ask(self, **request: Any) -> Any:
        """Send one request and wait for its answer's ``seconds`` (one figure, or a list of them)."""
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()["seconds"]

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"the benchmark process for {self.tree} ended (exit code {self.proc.wait()})")

    def close(self) -> None:
        """End the process: it stops at the end of its input."""
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds so far of process ``pid`` and its live descendants, each with the children it has
    waited for (Linux /proc); None where /proc does not show ``pid``."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            text = Path("/proc", entry, "stat").read_text()
        except OSError:  # it ended while the table was read
            continue
        fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ... utime is field 14
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime in clock ticks
    if pid not in times:
        return None
    tree, frontier = {pid}, [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier and child not in tree]
        tree.update(frontier)
    return sum(times[p] for p in tree) / os.sysconf("SC_CLK_TCK")


class EpochClock(threading.Thread):
    """Reads the CPU seconds of a training process tree each time its results.csv gains a row (polled every
    ``interval`` seconds): ``cpu[i]`` is the tree's CPU seconds when row i appeared."""

    def __init__(self, pid: int, results_csv: Path, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.results_csv, self.interval = pid, results_csv, interval
        self.cpu: list[float] = []
        self.done = threading.Event()

    def rows(self) -> int:
        try:
            return max(len(self.results_csv.read_text().strip().splitlines()) - 1, 0)
        except OSError:
            return 0

    def run(self) -> None:
        while not self.done.wait(self.interval):
            seen = self.rows()
            if seen > len(self.cpu):
                now = tree_cpu_seconds(self.pid)
                if now is None:
                    return
                self.cpu.extend([now] * (seen - len(self.cpu)))
