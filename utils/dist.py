"""The one door to torch.distributed: rank state, start-up, barriers, reductions, teardown.

This is the only module that reads RANK / LOCAL_RANK / WORLD_SIZE or calls
``init_process_group``. Everything else asks it. When the process is not part of a group,
the answers are rank 0, world size 1, main process True, and collectives are no-ops.

Every function here that runs a collective says so: all ranks must call it, in the same
order, or the job deadlocks (until the group's timeout ends it).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as tdist

from utils.device import available_cores, select_device
from utils.errors import UserError

T = TypeVar("T")


class DistError(UserError, RuntimeError):
    """A distributed set-up problem the user can fix (bad device, backend, world size)."""


@dataclass(frozen=True)
class DistEnv:
    """Rank state as the launcher (torchrun or the legacy launcher) set it."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    restart_count: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    agent_store: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def read_env(local_rank_flag: int = -1) -> DistEnv:
    """Rank state from the environment; ``local_rank_flag`` is the legacy ``--local_rank`` value."""
    env = os.environ
    world_size = int(env.get("WORLD_SIZE", 1))
    local_rank = int(env.get("LOCAL_RANK", local_rank_flag if local_rank_flag >= 0 else 0))
    return DistEnv(
        rank=int(env.get("RANK", local_rank if world_size > 1 else 0)),
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", world_size)),
        restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", 29500)),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
    )


# Set once by init_distributed(); read through the accessors below.
_ENV = DistEnv()
_LONG_GROUP: Any = None  # gloo group with a long timeout, for "rank 0 is busy" waits
_DEVICE: torch.device | None = None


def is_initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def get_rank() -> int:
    return tdist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return tdist.get_world_size() if is_initialized() else 1


def get_local_rank() -> int:
    return _ENV.local_rank if is_initialized() else 0


def get_local_world_size() -> int:
    return _ENV.local_world_size if is_initialized() else 1


@dataclass(frozen=True)
class SchedulerJob:
    """The batch scheduler's job this process belongs to (Slurm): its id and how often it was requeued."""

    job_id: str
    restarts: int


def scheduler_job() -> SchedulerJob | None:
    """The Slurm job of this process (SLURM_JOB_ID, SLURM_RESTART_COUNT), or None outside Slurm."""
    job_id = os.environ.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    return SchedulerJob(job_id, int(os.environ.get("SLURM_RESTART_COUNT", 0) or 0))


def restart_count() -> int:
    """How many times torchrun's elastic agent has restarted this worker group."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


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


_JOB_STORE: Any = None  # client of torchrun's agent store, opened on first use by job_store()


def job_store(timeout_s: float = 60.0) -> tdist.Store | None:
    """The key-value store that lives as long as the whole torchrun job: torchrun's agent store, shared by
    every rank and kept across elastic restarts (its keys here are not prefixed with the attempt).

    None when the launcher provides no agent store (plain ``python``, other launchers). Used for facts a
    restarted attempt must find again, such as the run folder (see utils.resume).
    """
    global _JOB_STORE
    env = read_env()
    if not env.agent_store:
        return None
    if _JOB_STORE is None:
        client = tdist.TCPStore(env.master_addr, env.master_port, is_master=False,
                                timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        _JOB_STORE = tdist.PrefixStore("yolo/job", client)
    return _JOB_STORE


def init_distributed(device: str = "", backend: str = "auto", timeout_s: float = 600.0,
                     long_timeout_s: float = 1800.0, local_rank_flag: int = -1) -> torch.device:
    """Start-up for every launch mode; returns this process's device.

    Reads the launcher's environment, picks the device and backend, sets the CUDA device
    before init (so NCCL never guesses the rank-to-GPU mapping), and joins the group with
    ``timeout_s`` for training collectives plus a gloo side group with ``long_timeout_s``
    for long waits. With WORLD_SIZE 1 (plain ``python train.py``) nothing is initialised.
    All ranks must call it.
    """
    global _ENV, _LONG_GROUP, _DEVICE
    env = read_env(local_rank_flag)
    device_obj = select_device(device, env.local_rank)
    chosen = resolve_backend(backend, device_obj)
    _ENV, _DEVICE = env, device_obj
    if device_obj.type == "cuda":
        torch.cuda.set_device(device_obj)
    if not env.distributed:
        return device_obj
    if env.world_size % max(env.local_world_size, 1) and env.local_world_size > env.world_size:
        raise DistError(f"LOCAL_WORLD_SIZE {env.local_world_size} > WORLD_SIZE {env.world_size}")
    timeout = datetime.timedelta(seconds=timeout_s)
    kwargs: dict[str, Any] = {}
    if chosen == "nccl":
        kwargs["device_id"] = device_obj  # binds the group to this GPU: barriers never guess
    tdist.init_process_group(chosen, store=_store_for(env, timeout), rank=env.rank,
                             world_size=env.world_size, timeout=timeout, **kwargs)
    _LONG_GROUP = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=long_timeout_s)) \
        if chosen != "gloo" or long_timeout_s != timeout_s else None
    return device_obj


def cpu_share_of(local_world_size: int) -> int:
    """The machine's (affinity) cores divided among ``local_world_size`` processes, at least 1."""
    return max(available_cores() // max(local_world_size, 1), 1)


def cpu_share() -> int:
    """CPU cores available to this process: the machine's cores divided among the local ranks."""
    return cpu_share_of(get_local_world_size())


def configure_threads() -> int:
    """Size torch's intra-op threads for this rank and return the number chosen.

    Rule: an OMP_NUM_THREADS the user set is respected. torchrun exports OMP_NUM_THREADS=1 to its
    workers whenever it starts more than one per machine, and that value is indistinguishable from
    a user's, so with several local ranks "1" is read as torchrun's default and replaced by this
    rank's share of the cores (cores // local world size; 1 on a 2-core machine with 2 ranks anyway).
    Without OMP_NUM_THREADS torch's own default (all cores) stands for a single process.
    Call after init_distributed (it needs the local world size).
    """
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    local_world = get_local_world_size()
    if value.isdigit() and int(value) > 0 and not (value == "1" and local_world > 1):
        threads = int(value)
    elif local_world > 1:
        threads = cpu_share()
    else:
        return torch.get_num_threads()
    torch.set_num_threads(threads)
    return threads


def backend() -> str:
    return tdist.get_backend() if is_initialized() else "none"


def barrier(long: bool = False) -> None:
    """Wait for every rank. ``long=True`` uses the long-timeout gloo group, for waits on work
    that one rank does for all (cache building). No-op when not distributed. All ranks must call it."""
    if not is_initialized():
        return
    if long and _LONG_GROUP is not None:
        tdist.barrier(group=_LONG_GROUP)
    elif backend() == "nccl" and _DEVICE is not None and _DEVICE.type == "cuda":
        tdist.barrier(device_ids=[_DEVICE.index])
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
    out: list[Any] = [None] * get_world_size()
    tdist.all_gather_object(out, obj, group=_LONG_GROUP if long else None)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (decisions made once on rank 0). All ranks must call it."""
    if not is_initialized():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


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


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any rank. All ranks must call it."""
    if not is_initialized():
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=collective_device())
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return bool(t.item() > 0)


def collective_device() -> torch.device:
    return _DEVICE if (_DEVICE is not None and backend() == "nccl") else torch.device("cpu")


def check_agreement(fingerprint: dict[str, Any]) -> None:
    """Fail fast when ranks disagree on what they run (model size, config, data hashes).

    Raises DistError naming the ranks whose fingerprint differs from rank 0's. All ranks must call it.
    """
    prints = all_gather_object(fingerprint)
    differ = [r for r, p in enumerate(prints) if p != prints[0]]
    if differ:
        keys = sorted(k for k in prints[0] if any(p.get(k) != prints[0][k] for p in prints))
        raise DistError(f"ranks {differ} differ from rank 0 in {', '.join(keys)}; every rank must run the same "
                        "code, config and data")


def cleanup(clean_exit: bool = True) -> None:
    """Tear the group down; safe to call when not initialised or after a failure.

    Called from each script's ``main()`` ``finally``, outside ``train()``, so every exit path
    releases the group and the process exits. On a clean exit the ranks meet at a barrier first
    (so no rank tears down while a peer still sends); after an error they do not wait for peers
    that may be gone. All ranks must call it.
    """
    global _LONG_GROUP
    if is_initialized():
        with contextlib.suppress(Exception):
            if clean_exit:
                barrier()
        with contextlib.suppress(Exception):
            tdist.destroy_process_group()
    _LONG_GROUP = None
