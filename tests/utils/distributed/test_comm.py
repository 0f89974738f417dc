"""utils.distributed.comm outside a process group: single-process answers, device and backend errors."""

from __future__ import annotations

import pytest
import torch

from utils.distributed import comm as dist
from utils.distributed.comm import DistError
from utils.errors import UserError

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT",
                 "MASTER_ADDR", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS")


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain ``python script.py`` environment: none of torchrun's variables."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


def test_single_process_answers(no_launcher: None) -> None:
    assert not dist.is_initialized()
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_local_rank() == 0 and dist.get_local_world_size() == 1
    assert dist.is_main_process() and dist.is_local_main_process()
    assert dist.restart_count() == 0
    assert dist.backend() == "none"


def test_collectives_are_no_ops(no_launcher: None) -> None:
    dist.barrier()  # returns at once: nothing to wait for
    dist.barrier(long=True)
    payload = {"a": [1, 2]}
    assert dist.all_gather_object(payload) == [payload]
    assert dist.broadcast_object(payload) is payload
    t = torch.tensor([1.0, 2.0])
    assert dist.all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    assert dist.all_reduce_mean(t).tolist() == [1.0, 2.0]
    assert dist.all_reduce_max(torch.tensor([3.0])).item() == 3.0
    dist.check_agreement({"params": 10})
    ran = []
    with dist.zero_first():
        ran.append(1)
    assert ran == [1]
    dist.cleanup()


def test_read_env(monkeypatch: pytest.MonkeyPatch, no_launcher: None) -> None:
    assert dist.read_env().world_size == 1 and not dist.read_env().distributed
    assert dist.read_env(local_rank_flag=3).local_rank == 3  # the legacy --local_rank flag
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    env = dist.read_env()
    assert (env.rank, env.local_rank, env.world_size, env.restart_count) == (2, 0, 4, 1) and env.distributed


def test_init_without_launcher_stays_single_process(no_launcher: None) -> None:
    assert dist.init_distributed("cpu") == torch.device("cpu")
    assert not dist.is_initialized() and dist.get_world_size() == 1


def test_backend_choice() -> None:
    assert issubclass(DistError, UserError)
    cpu = torch.device("cpu")
    assert dist.resolve_backend("auto", cpu) == "gloo"
    assert dist.resolve_backend("GLOO", cpu) == "gloo"
    with pytest.raises(DistError, match="nccl needs CUDA"):
        dist.resolve_backend("nccl", cpu)
    with pytest.raises(DistError, match="not one of auto, nccl, gloo"):
        dist.resolve_backend("mpi", cpu)


@pytest.mark.parametrize("omp, local_world, expected", [
    ("3", 1, 3),  # the user's value
    ("3", 2, 3),  # the user's value under torchrun too
    ("1", 2, "share"),  # torchrun's default for several local ranks -> this rank's share of the cores
    (None, 2, "share"),
    (None, 1, "default"),  # one process, nothing set: torch's default stands
])
def test_configure_threads_rule(omp, local_world, expected, monkeypatch: pytest.MonkeyPatch) -> None:
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(dist, "get_local_world_size", lambda: local_world)
    monkeypatch.setattr(dist, "available_cores", lambda: 8)
    before = torch.get_num_threads()
    try:
        want = {"share": 8 // local_world, "default": before}.get(expected, expected)
        assert dist.configure_threads() == want and torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)


def test_batch_per_rank_and_main_decides(no_launcher: None) -> None:
    assert dist.batch_per_rank(16) == 16
    with pytest.raises(DistError, match="--batch-size 0 must be a positive multiple of the world size 1"):
        dist.batch_per_rank(0)
    assert dist.main_decides(lambda: 7) == 7
    with pytest.raises(UserError, match="bad"):
        dist.main_decides(lambda: (_ for _ in ()).throw(UserError("bad")))


def test_nodelist_forms_slurm_writes() -> None:
    assert dist.expand_nodelist("node[01-04,07]") == ["node01", "node02", "node03", "node04", "node07"]
    assert dist.expand_nodelist("gpu7") == ["gpu7"]
    assert dist.expand_nodelist("a[1-2],b,c[009-010]-ib") == ["a1", "a2", "b", "c009-ib", "c010-ib"]
    assert dist.expand_nodelist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    with pytest.raises(DistError, match="not a host list"):
        dist.expand_nodelist("node[01-")
    assert dist.expand_tasks_per_node("8(x2),4") == [8, 8, 4] and dist.expand_tasks_per_node("2") == [2]


def test_srun_task_environment(monkeypatch: pytest.MonkeyPatch, no_launcher: None) -> None:
    slurm = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
             "SLURM_NTASKS": "16", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
             "SLURM_JOB_NODELIST": "node[03-04]"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    env = dist.read_env()
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (9, 1, 16, 8)
    assert (env.master_addr, env.master_port, env.launcher) == ("node03", 20000 + 123456 % 20000, "slurm")
    monkeypatch.setenv("MASTER_PORT", "29511")
    assert dist.read_env().master_port == 29511
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun inside an sbatch allocation: torchrun's variables win
    monkeypatch.setenv("RANK", "1")
    assert (dist.read_env().world_size, dist.read_env().launcher) == (2, "torchrun")
    for key in ("WORLD_SIZE", "RANK", "SLURM_STEP_ID"):
        monkeypatch.delenv(key)
    assert not dist.read_env().distributed  # the batch script itself (no srun step): one process
