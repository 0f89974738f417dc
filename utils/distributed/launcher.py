"""What the launcher told this process: torchrun (or the legacy ``--local_rank`` launcher), Slurm's srun, or none.

Every launcher variable (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_*, GROUP_RANK, MASTER_*, SLURM_*) is read here
and only here, into one frozen ``DistEnv``; utils.distributed.comm holds the one taken at start-up and answers
every question about rank state from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from utils.errors import UserError

SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 20000  # srun without MASTER_PORT: port 20000 + job id mod 20000
# Set to 1 in the environment of torchrun's agent (not the workers'): each rendezvous round then gives the workers a
# store of their own. torch 2.14's default, the agent's store shared across rounds, keeps the first round's address
# when a node joins, and both agents then time out in the next rendezvous (docs/cluster.md).
SEPARATE_STORES = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class DistError(UserError, RuntimeError):
    """A distributed set-up problem the user can fix (bad device, backend, world size, Slurm host list)."""


@dataclass(frozen=True)
class SchedulerJob:
    """The batch scheduler's job this process belongs to (Slurm): its id and how often it was requeued."""

    job_id: str
    restarts: int


@dataclass(frozen=True)
class DistEnv:
    """Rank state as the launcher set it. ``restart_count`` counts torchrun's elastic restarts of the worker group
    (0 elsewhere); a Slurm requeue is ``job.restarts``."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0  # this machine's index in the job: torchrun's GROUP_RANK, Slurm's SLURM_NODEID
    restart_count: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    agent_store: bool = False
    run_id: str = ""  # torchrun's --rdzv-id (TORCHELASTIC_RUN_ID); "" outside torchrun
    launcher: str = "none"  # 'torchrun' | 'slurm' | 'engine' (a group made before us: Ray Train) | 'none'
    job: SchedulerJob | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def read_env(local_rank_flag: int = -1, env: Mapping[str, str] | None = None) -> DistEnv:
    """Rank state from the environment (``env``, default os.environ); ``local_rank_flag`` is the legacy
    ``--local_rank`` value.

    torchrun's variables (RANK, WORLD_SIZE, ...) win; without them, an srun task (SLURM_STEP_ID set) takes its
    rank from Slurm; otherwise the process is alone."""
    env = os.environ if env is None else env
    job = scheduler_job(env)
    if "WORLD_SIZE" not in env and "RANK" not in env and local_rank_flag < 0 and _is_srun_task(env):
        return _slurm_env(env, job)
    world_size = int(env.get("WORLD_SIZE", 1))
    local_rank = int(env.get("LOCAL_RANK", local_rank_flag if local_rank_flag >= 0 else 0))
    rank = int(env.get("RANK", local_rank if world_size > 1 else 0))
    # RANK and WORLD_SIZE with no local rank (a Kubernetes operator's pods without torchrun): one process a machine
    alone = "LOCAL_RANK" not in env and local_rank_flag < 0 and "RANK" in env
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1 if alone else world_size)),
        node_rank=int(env.get("GROUP_RANK") or env.get("NODE_RANK") or (rank if alone else 0)) if world_size > 1 else 0,
        restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT") or 0),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", 29500)),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        run_id=env.get("TORCHELASTIC_RUN_ID", ""),
        launcher="torchrun" if world_size > 1 else "none",
        job=job,
    )


LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")  # torchrun and its kin set them


def launched(local_rank_flag: int = -1, env: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher started this process as one of a job's (torchrun, torch.distributed.launch, an srun
    task, an operator that sets torchrun's variables), even a job of one; then the launcher owns the process count."""
    env = os.environ if env is None else env
    return local_rank_flag >= 0 or any(name in env for name in LAUNCHER_VARIABLES) or _is_srun_task(env)


def record_error_line(line: str, env: Mapping[str, str] | None = None) -> bool:
    """Under torchrun, write ``line`` as this process's error record (the JSON file TORCHELASTIC_ERROR_FILE names,
    in torch elastic's format), so torchrun's failure summary shows it as the root cause instead of "To enable
    traceback see ...". Returns whether a file was written (False outside torchrun or when it cannot be)."""
    import json
    import time

    path = (os.environ if env is None else env).get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    record = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(record, f)
    except OSError:
        return False
    return True


def scheduler_job(env: Mapping[str, str]) -> SchedulerJob | None:
    """The Slurm job in ``env`` (SLURM_JOB_ID, SLURM_RESTART_COUNT), or None outside Slurm."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    return SchedulerJob(job_id, int(env.get("SLURM_RESTART_COUNT", 0) or 0))


def _is_srun_task(env: Mapping[str, str]) -> bool:
    """A task started by srun (a job step), not the batch script itself, which has the job's task count too."""
    return bool(env.get("SLURM_PROCID")) and bool(env.get("SLURM_NTASKS")) and \
        bool(env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID"))


def _slurm_env(env: Mapping[str, str], job: SchedulerJob | None) -> DistEnv:
    """Rank state of an srun task: rank SLURM_PROCID of SLURM_NTASKS, local rank SLURM_LOCALID, this node's
    task count, the first host of the node list as MASTER_ADDR and a port derived from the job id (both
    unless MASTER_ADDR / MASTER_PORT are set)."""
    nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                            or env.get("SLURM_NODELIST") or "127.0.0.1")
    per_node = expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
                                     or env.get("SLURM_NTASKS_PER_NODE") or env["SLURM_NTASKS"])
    node = int(env.get("SLURM_NODEID", 0))
    job_number = int("".join(c for c in job.job_id if c.isdigit()) or 0) if job else 0
    return DistEnv(
        rank=int(env["SLURM_PROCID"]), local_rank=int(env.get("SLURM_LOCALID", 0)),
        world_size=int(env["SLURM_NTASKS"]), local_world_size=per_node[min(node, len(per_node) - 1)],
        node_rank=node, master_addr=env.get("MASTER_ADDR") or nodes[0],
        master_port=int(env.get("MASTER_PORT") or SLURM_PORT_BASE + job_number % SLURM_PORT_SPAN),
        launcher="slurm", job=job)


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compact host list -> host names: ``node[01-03,07],gpu-a[1-2]-ib`` -> node01, node02, node03,
    node07, gpu-a1-ib, gpu-a2-ib (zero padding kept; several bracket groups multiply), without scontrol."""
    hosts, depth, start = [], 0, 0
    for i, char in enumerate(nodelist + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            if nodelist[start:i].strip():
                hosts += _expand_host(nodelist[start:i].strip())
            start = i + 1
    if depth != 0 or not hosts:
        raise DistError(f"SLURM_NODELIST {nodelist!r} is not a host list Slurm writes (e.g. node[01-04,07])")
    return hosts


def _expand_host(pattern: str) -> list[str]:
    """One host pattern with zero or more ``[ranges]`` groups -> its host names."""
    head, sep, rest = pattern.partition("[")
    if not sep:
        return [pattern]
    ranges, _, tail = rest.partition("]")
    values = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise DistError(f"SLURM_NODELIST range {part!r} in {pattern!r} is not numeric")
        width = len(low)
        values += [str(v).zfill(width) for v in range(int(low), int(high or low) + 1)]
    return [head + value + host for value in values for host in _expand_host(tail)]


def expand_tasks_per_node(spec: str) -> list[int]:
    """``2(x3),1`` (SLURM_TASKS_PER_NODE) -> [2, 2, 2, 1]; a plain ``8`` -> [8]."""
    counts = []
    for part in str(spec).split(","):
        value, _, repeat = part.strip().partition("(x")
        counts += [int(value)] * int(repeat.rstrip(")") or 1)
    return counts
