"""The one door to torch.distributed: rank state, start-up, barriers, reductions, teardown.

Rank state comes from the launcher's environment, read once at start-up by utils.distributed.launcher; this is the
only module that calls ``init_process_group``, and everything else asks it. When the process is not part of a
group, the answers are rank 0, world size 1, main process True, and collectives are no-ops.

Every function here that runs a collective says so: all ranks must call it, in the same order, or the job
deadlocks (until the group's timeout ends it).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
import torch.distributed as tdist

from utils.device import ThreadVote, available_cores, measured_threads, select_device
from utils.distributed.launcher import DistEnv, DistError, SchedulerJob, read_env
from utils.distributed.watchdog import MarkWatch, is_peer_failure, store_timeout
from utils.errors import UserError
from utils.log import LOGGER

T = TypeVar("T")


@dataclass
class _State:
    """Everything this module holds between init_distributed() and cleanup() (which puts a fresh one back)."""

    env: DistEnv | None = None  # the launcher's environment as read at start-up
    device: torch.device | None = None
    long_group: Any = None  # gloo group with a long timeout, for "rank 0 is busy" waits
    watch: MarkWatch | None = None  # this rank's mark and the stuck-rank watch (utils.distributed.watchdog)
    job_store: Any = None  # client of torchrun's agent store, opened on first use by job_store()
    threads_vote: ThreadVote | None = None  # where configure_threads measured: remeasure_threads' hysteresis
    owns_group: bool = True  # False: the engine that started this process made the group (Ray Train) and ends it


_STATE = _State()


def launch_env() -> DistEnv:
    """The launcher's environment: as read at start-up, or read now before init_distributed()."""
    return _STATE.env if _STATE.env is not None else read_env()


def is_initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def get_rank() -> int:
    return tdist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return tdist.get_world_size() if is_initialized() else 1


def get_local_rank() -> int:
    return launch_env().local_rank if is_initialized() else 0


def get_local_world_size() -> int:
    return launch_env().local_world_size if is_initialized() else 1


def node_rank() -> int:
    """This machine's index in the job: torchrun's GROUP_RANK, Slurm's SLURM_NODEID, else 0."""
    return launch_env().node_rank if is_initialized() else 0


def restart_count() -> int:
    """How many times torchrun's elastic agent has restarted this worker group (0 outside torchrun)."""
    return launch_env().restart_count


def torchrun_job_id() -> str:
    """torchrun's rendezvous id (``--rdzv-id``) of this job; "" outside torchrun or when it is torch's default
    "none" (one id would then name every job)."""
    run_id = launch_env().run_id
    return "" if run_id in ("", "none") else run_id


def scheduler_job() -> SchedulerJob | None:
    """The Slurm job of this process (its id and requeue count), or None outside Slurm."""
    return launch_env().job


def is_main_process() -> bool:
    return get_rank() == 0


def is_local_main_process() -> bool:
    return get_local_rank() == 0


def resolve_backend(backend: str, device: torch.device) -> str:
    """auto -> nccl on CUDA (when NCCL is built in), else gloo; refuse nccl without CUDA."""
    backend = backend.lower()
    if backend not in ("auto", "nccl", "gloo"):
        raise DistError(f"--backend {backend!r} is not one of auto, nccl, gloo")
    if backend == "auto":
        return "nccl" if device.type == "cuda" and tdist.is_nccl_available() else "gloo"
    if backend == "nccl" and (device.type != "cuda" or not tdist.is_nccl_available()):
        raise DistError("--backend nccl needs CUDA GPUs (and a torch built with NCCL); use --backend gloo on CPU")
    return backend


def _store_for(env: DistEnv, timeout: datetime.timedelta) -> tdist.Store:
    """A store whose keys are unique to this attempt.

    torchrun's agent hosts a TCPStore at MASTER_ADDR:MASTER_PORT. After an elastic restart it
    still holds the previous attempt's keys, and a plain init_process_group then hangs in gloo's
    rendezvous. Prefixing every key with the restart count gives each attempt a clean namespace.
    """
    store = tdist.TCPStore(
        env.master_addr, env.master_port, env.world_size,
        is_master=(not env.agent_store and env.rank == 0),
        timeout=timeout, wait_for_workers=False,
    )
    return tdist.PrefixStore(f"yolo/attempt{env.restart_count}", store)


def job_store(timeout_s: float = 60.0) -> tdist.Store | None:
    """The key-value store that lives as long as the whole torchrun job: torchrun's agent store, shared by
    every rank and kept across elastic restarts (its keys here are not prefixed with the attempt).

    None when the launcher provides no agent store (plain ``python``, other launchers). Used for facts a
    restarted attempt must find again, such as the run folder (see utils.training.resume).
    """
    env = launch_env()
    if not env.agent_store:
        return None
    if _STATE.job_store is None:
        client = tdist.TCPStore(env.master_addr, env.master_port, is_master=False,
                                timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        _STATE.job_store = tdist.PrefixStore("yolo/job", client)
    return _STATE.job_store


def init_distributed(device: str = "", backend: str = "auto", timeout_s: float = 600.0,
                     long_timeout_s: float = 1800.0, local_rank_flag: int = -1, script: str = "train") -> torch.device:
    """Start-up for every launch mode; returns this process's device.

    Reads the launcher's environment, picks the device and backend, sets the CUDA device
    before init (so NCCL never guesses the rank-to-GPU mapping), and joins the group with
    ``timeout_s`` for training collectives plus a gloo side group with ``long_timeout_s``
    for long waits. With WORLD_SIZE 1 (plain ``python train.py``) nothing is initialised. A group that the engine
    which started this process already made (Ray Train's TorchTrainer) is joined, with its backend and timeout, and
    left for that engine to end (``cleanup``). All ranks must call it.
    """
    env = read_env(local_rank_flag)
    if is_initialized():  # the engine that started this process made the group (Ray Train): join it, make none
        env = replace(env, rank=tdist.get_rank(), world_size=tdist.get_world_size(), launcher="engine")
    device_obj = select_device(device, env.local_rank)
    chosen = resolve_backend(backend, device_obj)
    _STATE.env, _STATE.device, _STATE.owns_group = env, device_obj, not is_initialized()
    if device_obj.type == "cuda":
        torch.cuda.set_device(device_obj)
    if not env.distributed:
        return device_obj
    if env.world_size % max(env.local_world_size, 1) and env.local_world_size > env.world_size:
        raise DistError(f"LOCAL_WORLD_SIZE {env.local_world_size} > WORLD_SIZE {env.world_size}")
    timeout = datetime.timedelta(seconds=timeout_s)
    if _STATE.owns_group:
        kwargs: dict[str, Any] = {"device_id": device_obj} if chosen == "nccl" else {}  # NCCL never guesses the GPU
        tdist.init_process_group(chosen, store=_store_for(env, timeout), rank=env.rank,
                                 world_size=env.world_size, timeout=timeout, **kwargs)
    # the engine's group has the engine's backend and timeout: the long waits get a gloo group of their own anyway
    side_group = tdist.get_backend() != "gloo" or long_timeout_s != timeout_s or not _STATE.owns_group
    _start_side_group_and_watch(env, side_group, timeout_s, long_timeout_s, script)
    return device_obj


def _start_side_group_and_watch(env: DistEnv, side_group: bool, timeout_s: float, long_timeout_s: float,
                                script: str) -> None:
    """The gloo group with the long timeout (when ``side_group``) and this rank's mark in the job's store with the
    watch that names a stuck rank. All ranks must call it."""
    _STATE.long_group = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=long_timeout_s)) \
        if side_group else None
    watch_store = tdist.PrefixStore(f"yolo/attempt{env.restart_count}", tdist.TCPStore(
        env.master_addr, env.master_port, is_master=False, timeout=store_timeout(timeout_s), wait_for_workers=False))
    _STATE.watch = MarkWatch(watch_store, env.rank, env.world_size, timeout_s, long_timeout_s, script=script).start()


def lost_a_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective that lost a peer (multi-rank jobs); it reads nothing from the others."""
    return _STATE.watch is not None and is_peer_failure(error)


def peer_failure_line(error: BaseException) -> str | None:
    """For a collective that failed because a peer is gone: the one line to print (on one live rank; "" on the
    others, and None when ``error`` is something else). It reads the other ranks' marks from the store, which can
    take a while under load. See utils.distributed.watchdog."""
    if not lost_a_peer(error):
        return None
    return _STATE.watch.peer_failure(error) or ""


def mark(phase: str, epoch: int = -1, batch: int = -1, waiting: bool = False, long: bool = False) -> None:
    """Mark where this rank is, for the watch that names a stuck rank (watchdog.py); no-op for one process."""
    if _STATE.watch is not None:
        _STATE.watch.at(phase, epoch, batch, waiting, long)


def _waits(long: bool = False) -> None:
    """Mark that this rank now waits for the others (a collective follows)."""
    if _STATE.watch is not None:
        _STATE.watch.waits(long)


def cpu_share_of(local_world_size: int) -> int:
    """The machine's (affinity) cores divided among ``local_world_size`` processes, at least 1."""
    return max(available_cores() // max(local_world_size, 1), 1)


def cpu_share() -> int:
    """CPU cores available to this process: the machine's cores divided among the local ranks."""
    return cpu_share_of(get_local_world_size())


def configure_threads() -> int:
    """Size torch's intra-op threads for this rank and return the number chosen.

    Rule: an OMP_NUM_THREADS the user set is respected. torchrun exports OMP_NUM_THREADS=1 to its workers whenever
    it starts more than one per machine, and that value is indistinguishable from a user's, so with several local
    ranks "1" is read as torchrun's default and replaced by this rank's share of the cores (cores // local world).
    Without OMP_NUM_THREADS a single process measures (utils.device.measured_threads, ~0.1 s): all its cores
    where they are faster than one, else one when two probes in a row find it (busy cores make a parallel region
    wait for its slowest thread); remeasure_threads measures again later. Call after init_distributed.
    """
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    local_world = get_local_world_size()
    if value.isdigit() and int(value) > 0 and not (value == "1" and local_world > 1):
        threads = int(value)
    elif local_world > 1:
        threads = cpu_share()
    else:
        _STATE.threads_vote = ThreadVote()
        share = cpu_share()
        return share if measured_threads(share) == share else measured_threads(share)
    torch.set_num_threads(threads)
    return threads


def remeasure_threads() -> tuple[int, int] | None:
    """Where configure_threads measured the thread count, measure it again, changed after two agreeing probes
    (utils.device.ThreadVote): (before, after) when it changed. A count the user or the launcher set is kept."""
    vote = _STATE.threads_vote
    return None if vote is None else vote.remeasure(lambda: measured_threads(cpu_share(), apply=False))


def backend() -> str:
    return tdist.get_backend() if is_initialized() else "none"


def barrier(long: bool = False) -> None:
    """Wait for every rank. ``long=True`` uses the long-timeout gloo group, for waits on work
    that one rank does for all (cache building). No-op when not distributed. All ranks must call it."""
    if not is_initialized():
        return
    _waits(long)
    device = _STATE.device
    if long and _STATE.long_group is not None:
        tdist.barrier(group=_STATE.long_group)
    elif backend() == "nccl" and device is not None and device.type == "cuda":
        tdist.barrier(device_ids=[device.index])
    else:
        tdist.barrier()


@contextlib.contextmanager
def zero_first(local: bool = True) -> Iterator[None]:
    """Let the (local) rank 0 run the block first while the others wait, then the others run it.

    Used for building caches once: rank 0 writes, the others then read what it wrote. With
    ``local=True`` it is rank 0 of each machine (caches live on each machine's disk).
    All ranks must enter it.
    """
    first = is_local_main_process() if local else is_main_process()
    if not first:
        barrier(long=True)
    try:
        yield
    finally:
        if first:
            barrier(long=True)


def all_gather_object(obj: Any, long: bool = False) -> list[Any]:
    """Every rank's ``obj``, in rank order ([obj] when not distributed). All ranks must call it."""
    if not is_initialized():
        return [obj]
    _waits(long)
    out: list[Any] = [None] * get_world_size()
    tdist.all_gather_object(out, obj, group=_STATE.long_group if long else None)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (decisions made once on rank 0). All ranks must call it."""
    if not is_initialized():
        return obj
    _waits()
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s ``tensor``, in place on every rank (returned; as it is when not distributed). All ranks must
    call it."""
    if is_initialized():
        _waits()
        tdist.broadcast(tensor, src=src)
    return tensor


def batch_per_rank(total: int) -> int:
    """``--batch-size`` is the total over all ranks: this rank's share, or a DistError when it does not divide."""
    world = get_world_size()
    if total < 1 or total % world:
        raise DistError(f"--batch-size {total} must be a positive multiple of the world size {world} "
                        "(it is the total over all ranks)")
    return total // world


def main_decides(decide: Callable[[], T]) -> T:
    """``decide()`` run on rank 0 only, its result returned on every rank (decisions made once: run folders,
    checkpoints read by rank 0, early stopping). A UserError it raises is raised on every rank with the same
    message, so no rank waits for an answer that never comes. All ranks must call it."""
    outcome: tuple[str, Any] = ("error", DistError("rank 0 did not decide"))
    if is_main_process():
        try:
            outcome = ("ok", decide())
        except UserError as e:
            outcome = ("error", e)
    outcome = broadcast_object(outcome)
    if outcome[0] == "error":
        raise outcome[1]
    return outcome[1]


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place reduction over ranks, ``op`` one of sum, mean, max (returned for chaining; as it is when not
    distributed). All ranks must call it."""
    if is_initialized():
        _waits()
        tdist.all_reduce(tensor, op=tdist.ReduceOp.MAX if op == "max" else tdist.ReduceOp.SUM)
        if op == "mean":
            tensor /= get_world_size()
    return tensor


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks. All ranks must call it."""
    return all_reduce(tensor, "sum")


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """In-place mean over ranks. All ranks must call it."""
    return all_reduce(tensor, "mean")


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """In-place maximum over ranks. All ranks must call it."""
    return all_reduce(tensor, "max")


def wrap_ddp(model: torch.nn.Module, device: torch.device, sync_bn: bool = False) -> torch.nn.Module:
    """DistributedDataParallel (device_ids on CUDA only), with SyncBatchNorm layers when ``sync_bn`` (CUDA only:
    torch has no CPU path); the model as is for one process."""
    if get_world_size() == 1:
        return model
    if sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        LOGGER.info("Using SyncBatchNorm()")
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                     output_device=device_ids and device_ids[0])


def collective_device() -> torch.device:
    return _STATE.device if (_STATE.device is not None and backend() == "nccl") else torch.device("cpu")


def check_agreement(fingerprint: dict[str, Any]) -> None:
    """Fail fast when ranks disagree on what they run: DistError naming the first rank and field that differ
    from rank 0, with both values (``rank 1 differs from rank 0 in --epochs: 3 vs 5``). All ranks must call it."""
    prints = all_gather_object(fingerprint)
    for rank, other in enumerate(prints):
        keys = [k for k in {**prints[0], **other} if other.get(k) != prints[0].get(k)]
        if keys:
            more = f" (and {len(keys) - 1} more: {', '.join(keys[1:4])})" if len(keys) > 1 else ""
            raise DistError(f"rank {rank} differs from rank 0 in {keys[0]}: {other.get(keys[0])} vs "
                            f"{prints[0].get(keys[0])}{more}; every rank must run the same code, config and data")


def cleanup(clean_exit: bool = True) -> None:
    """Tear the group down and forget all module state; safe to call when not initialised or after a failure.

    Called from each script's ``main()`` ``finally``, outside ``train()``, so every exit path
    releases the group and the process exits. On a clean exit the ranks meet at a barrier first
    (so no rank tears down while a peer still sends); after an error they do not wait for peers
    that may be gone. A group an engine made is left to it (Ray Train destroys it when its workers end). All ranks
    must call it.
    """
    global _STATE
    watch = _STATE.watch
    if watch is not None and not clean_exit:
        watch.flush()  # where this rank was when it failed, for the peers' message (and it stays there)
    if is_initialized():
        if clean_exit:
            mark("exit")
        with contextlib.suppress(Exception):
            if clean_exit:
                barrier()
        with contextlib.suppress(Exception):
            if _STATE.owns_group:
                tdist.destroy_process_group()
            elif _STATE.long_group is not None:  # ours; the engine ends its own group (Ray Train on shutdown)
                tdist.destroy_process_group(_STATE.long_group)
    if watch is not None:
        watch.close()
    _STATE = _State()


@contextlib.contextmanager
def single_process_group(device: str = "cpu", backend: str = "auto") -> Iterator[torch.device]:
    """A real process group of one rank (an in-memory store, no network), for tests and benchmarks that run the
    collectives' code paths in one process; torn down (with all module state) on leaving. Yields the device."""
    if is_initialized():
        raise DistError("single_process_group: a process group is already initialised here")
    device_obj = select_device(device)
    chosen = resolve_backend(backend, device_obj)
    _STATE.env, _STATE.device = DistEnv(), device_obj
    kwargs: dict[str, Any] = {"device_id": device_obj} if chosen == "nccl" else {}
    if device_obj.type == "cuda":
        torch.cuda.set_device(device_obj)
    tdist.init_process_group(chosen, store=tdist.HashStore(), rank=0, world_size=1, **kwargs)
    try:
        yield device_obj
    finally:
        cleanup(clean_exit=True)
