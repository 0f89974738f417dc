"""Devices and the machine: ``--device`` parsing, the cores this process may use, mixed-precision contexts, and
the objects Python's garbage collector may leave alone (long-lived ones).

Nothing here touches torch.distributed: detect.py and export.py use it without a process group, and
``utils.distributed.comm`` builds on it.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable

import torch

from utils.errors import UserError


class DeviceError(UserError, RuntimeError):
    """A ``--device`` that does not exist here or cannot be parsed."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


def mps_available() -> bool:
    """Whether this torch can run on an Apple GPU (Metal Performance Shaders)."""
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def measured_threads(max_threads: int | None = None, rounds: int = 5, min_gain: float = 1.2,
                     apply: bool = True, settle: int = 12) -> int:
    """torch CPU threads for this process, measured: ``max_threads`` (default: the usable cores) when a small
    convolution runs at least ``min_gain`` times faster in wall time with them than with 1, else 1.

    The two settings take turns ``rounds`` times (~0.1 s on an idle machine), after ``settle`` untimed runs with
    all the threads (a thread just woken from its OpenMP sleep can share its waker's core for a while). On cores
    that other jobs keep busy, a parallel region waits for its slowest thread: a yolov5n training step measured 6x
    slower in wall time with 2 threads than with 1 on a loaded 2-core machine (docs/performance.md). Leaves torch
    set to the result (``apply``), or as it found it.
    """
    import time

    most = max_threads if max_threads is not None else available_cores()
    found = torch.get_num_threads()
    if most <= 1:
        torch.set_num_threads(1 if apply else found)
        return 1
    weight = torch.randn(64, 64, 3, 3, generator=torch.Generator().manual_seed(0))
    image = torch.randn(1, 64, 56, 56, generator=torch.Generator().manual_seed(1))
    seconds: dict[int, list[float]] = {1: [], most: []}
    with torch.no_grad():
        torch.set_num_threads(most)
        for _ in range(settle):
            torch.nn.functional.conv2d(image, weight, padding=1)
        for _ in range(rounds + 1):  # the first round warms oneDNN up and is not counted
            for threads, samples in seconds.items():
                torch.set_num_threads(threads)
                start = time.perf_counter()
                torch.nn.functional.conv2d(image, weight, padding=1)
                samples.append(time.perf_counter() - start)
    one, many = (sorted(seconds[t][1:])[rounds // 2] for t in (1, most))
    chosen = most if one >= min_gain * many else 1
    torch.set_num_threads(chosen if apply else found)
    return chosen


class ThreadVote:
    """The measured thread count measured again with hysteresis (the load on the cores changes during a run, and one
    busy moment at start-up must not hold it to one thread): it changes only when two probes in a row find the same
    other count, so a single busy or idle moment never flips it."""

    def __init__(self) -> None:
        self.pending: int | None = None  # the other count the last probe found

    def remeasure(self, probe: Callable[[], int]) -> tuple[int, int] | None:
        """Run ``probe`` (a measured_threads that leaves torch as it is); (before, after) when the count changed."""
        current, found = torch.get_num_threads(), probe()
        if found == current or found != self.pending:
            self.pending = None if found == current else found
            return None
        self.pending = None
        torch.set_num_threads(found)
        return current, found


def select_device(device: str = "", local_rank: int = 0) -> torch.device:
    """Resolve ``--device`` ('' | 'cpu' | 'mps' | '0' | '0,1' | 'cuda:1') to this process's device.

    '' means GPU ``local_rank`` when CUDA is available, else the CPU. With a list, process ``local_rank``
    takes the ``local_rank``-th listed GPU. 'mps' is the Apple GPU. Raises DeviceError with a one-line reason
    when the device does not exist here.
    """
    spec = str(device).strip().lower().replace("cuda:", "").replace(" ", "")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "mps":
        if not mps_available():
            raise DeviceError("--device mps asks for an Apple GPU but this torch has no MPS device here "
                              "(it needs macOS on Apple silicon or an AMD GPU); use --device cpu")
        return torch.device("mps")
    if spec in ("", "cuda"):
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    ids = listed_gpus(device)
    if not torch.cuda.is_available():
        raise DeviceError(f"--device {device} asks for CUDA but CUDA is not available here; use --device cpu")
    count = torch.cuda.device_count()
    missing = [i for i in ids if i >= count or i < 0]
    if missing:
        raise DeviceError(f"--device {device}: GPU {missing[0]} does not exist (this machine has {count} GPUs)")
    return torch.device("cuda", ids[local_rank % len(ids)])


def listed_gpus(device: str) -> list[int]:
    """The GPU indices a --device lists ('0,1', 'cuda:0,1', '[0, 1]' -> [0, 1]); [] for '', 'cpu', 'mps'."""
    spec = str(device).strip().lower().replace("cuda:", "").replace(" ", "").strip("[]")
    if spec in ("", "cpu", "mps", "cuda"):
        return []
    try:
        return [int(x) for x in spec.split(",") if x != ""]
    except ValueError:
        raise DeviceError(f"--device {device!r} is not valid: use 'cpu', 'mps', a GPU index such as '0', "
                          "or a list '0,1'") from None


def processes_to_start(device: str, nproc_per_node: int | None, launched: bool, cuda_count: int) -> int:
    """How many processes a script starts on this machine itself (1: it runs in this process).

    Under a launcher (``launched``: torchrun, srun) the launcher started them: 1. Otherwise one per GPU that
    ``device`` lists (``--device 0,1``: 2), or ``nproc_per_node`` (``--device cpu --nproc-per-node 2``; with
    ``--device ''`` one per GPU from GPU 0 where CUDA has ``cuda_count`` GPUs). A count that cannot work is a
    DeviceError naming the flags: never fewer processes than the GPUs asked for, never two on one GPU."""
    if launched:
        return 1
    try:
        gpus = listed_gpus(device)
    except DeviceError:  # the process that runs refuses it (select_device), with the same line
        gpus = []
    if len(gpus) > 1 and not cuda_count:
        raise DeviceError(f"--device {device} asks for CUDA but CUDA is not available here; use --device cpu "
                          f"--nproc-per-node {len(gpus)} for {len(gpus)} processes on the CPU")
    if len(gpus) > 1 and max(gpus) >= cuda_count:
        raise DeviceError(f"--device {device}: GPU {max(gpus)} does not exist (this machine has {cuda_count} GPUs)")
    if nproc_per_node is None:
        return max(len(gpus), 1)
    if nproc_per_node < 1:
        raise DeviceError(f"--nproc-per-node {nproc_per_node}: give the number of processes, 1 or more")
    spec = str(device).strip().lower()
    if gpus and len(gpus) != nproc_per_node:
        hint = "list one GPU per process" if len(gpus) == 1 else "drop --nproc-per-node"
        raise DeviceError(f"--device {device} lists {len(gpus)} GPU(s) but --nproc-per-node is {nproc_per_node}: "
                          f"each process takes one listed GPU; {hint}")
    if spec == "mps" and nproc_per_node > 1:
        raise DeviceError("--device mps is one Apple GPU; --nproc-per-node above 1 needs --device cpu")
    if spec in ("", "cuda") and cuda_count and nproc_per_node > cuda_count:
        raise DeviceError(f"--nproc-per-node {nproc_per_node} asks for one GPU per process but this machine has "
                          f"{cuda_count}; pass --device cpu to run the processes on the CPU")
    return nproc_per_node


def idle_gpus_warning(device: str, local_world_size: int, local_rank: int) -> str | None:
    """The line to print when a launcher started fewer processes on this machine than --device lists GPUs
    (``torchrun --nproc_per_node 1 train.py --device 0,1``): the others would stay idle in silence."""
    gpus = listed_gpus(device)
    if len(gpus) <= local_world_size:
        return None
    return (f"WARNING: --device {device} lists {len(gpus)} GPUs but the launcher started {local_world_size} "
            f"process(es) on this machine, one per GPU: GPU {gpus[local_rank % len(gpus)]} trains, the others stay "
            f"idle; start {len(gpus)} (torchrun --nproc_per_node {len(gpus)}), or run python without torchrun")


def one_device_warning(device: str, script: str) -> str | None:
    """The line for a script that runs on one device (detect.py, export.py) given several GPUs: which it uses."""
    try:
        gpus = listed_gpus(device)
    except DeviceError:
        return None
    if len(gpus) <= 1:
        return None
    return f"WARNING: --device {device}: {script} runs on one device, GPU {gpus[0]}; pass one GPU to choose another"


def check_half(half: bool, device: torch.device) -> None:
    """``--half`` (FP16 inference) is for CUDA devices: one behaviour for detect.py and test.py, a DeviceError
    elsewhere rather than a silent change of precision."""
    if half and device.type != "cuda":
        raise DeviceError(f"--half needs a CUDA device (this run uses {device}); drop --half or pass --device 0")


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """Mixed precision for ``device`` when ``enabled``: float16 on CUDA, bfloat16 on the CPU; else a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (avx2, avx512_bf16, amx_bf16...); empty where it is unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86, arm
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def freeze_long_lived() -> None:
    """Take the objects that exist now out of Python's garbage collector's passes (gc.freeze), because they live
    as long as the process: a script's modules once it starts (train.py's: about 210,000 objects), what a
    DataLoader worker inherited from its parent, everything when a script ends (utils.cli.run_script). The
    collector's full passes walk every object it tracks whenever enough new ones have survived; after this they
    scan only what the process creates later, the interpreter's shutdown makes no last pass over the whole heap,
    and a worker's passes no longer write to the objects it shares with its parent through fork (each write copies
    a page). Reference counting frees objects as before: only a reference cycle among them waits for the process
    to end. Exit handlers (atexit) and thread joins run as before; the scripts close their files and loggers
    themselves.
    """
    gc.freeze()
