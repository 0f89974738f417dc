"""utils.distributed.comm outside a process group: single-process answers, device and backend errors."""

from __future__ import annotations

import pytest
import torch

from utils.distributed import comm as dist
from utils.distributed.launcher import DistError, SchedulerJob
from utils.errors import UserError

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT",
                 "MASTER_ADDR", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS")


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain ``python script.py`` environment: none of torchrun's variables, no state from an earlier start-up."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    dist.cleanup()


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
    assert dist.broadcast(t) is t and t.tolist() == [1.0, 2.0]
    dist.check_agreement({"params": 10})
    ran = []
    with dist.zero_first():
        ran.append(1)
    assert ran == [1]
    dist.cleanup()


def test_init_without_launcher_stays_single_process(no_launcher: None) -> None:
    assert dist.init_distributed("cpu") == torch.device("cpu")
    assert not dist.is_initialized() and dist.get_world_size() == 1
    dist.cleanup()


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
    (None, 1, "measured"),  # one process, nothing set: measured (all 8 cores when faster, else 1)
])
def test_configure_threads_rule(omp, local_world, expected, monkeypatch: pytest.MonkeyPatch) -> None:
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(dist, "get_local_world_size", lambda: local_world)
    monkeypatch.setattr(dist, "available_cores", lambda: 8)
    measured = []

    def fake_measured(most: int) -> int:  # stands in for the timing; the rule under test is who is asked
        measured.append(most)
        torch.set_num_threads(5)
        return 5

    monkeypatch.setattr(dist, "measured_threads", fake_measured)
    before = torch.get_num_threads()
    try:
        want = {"share": 8 // local_world, "measured": 5}.get(expected, expected)
        assert dist.configure_threads() == want and torch.get_num_threads() == want
        assert measured == ([8, 8] if expected == "measured" else [])  # 5 of 8 cores: taken when a second agrees
    finally:
        torch.set_num_threads(before)


def test_batch_per_rank_and_main_decides(no_launcher: None) -> None:
    assert dist.batch_per_rank(16) == 16
    with pytest.raises(DistError, match="--batch-size 0 must be a positive multiple of the world size 1"):
        dist.batch_per_rank(0)
    assert dist.main_decides(lambda: 7) == 7
    with pytest.raises(UserError, match="bad"):
        dist.main_decides(lambda: (_ for _ in ()).throw(UserError("bad")))


def test_a_single_process_group_runs_real_collectives_and_cleanup_forgets_everything(no_launcher: None) -> None:
    with dist.single_process_group() as device:
        assert device == torch.device("cpu") and dist.is_initialized() and dist.backend() == "gloo"
        dist.barrier()
        assert dist.all_reduce_max(torch.tensor([3.0])).item() == 3.0
        assert dist.all_gather_object({"a": 1}, long=True) == [{"a": 1}] and dist.broadcast_object(5) == 5
        sent = torch.tensor([4.0])
        assert dist.broadcast(sent) is sent and sent.item() == 4.0
        assert dist.main_decides(lambda: "rank 0") == "rank 0"
        dist.check_agreement({"--epochs": 3})
        with pytest.raises(DistError, match="already initialised"):
            with dist.single_process_group():
                pass
    assert not dist.is_initialized()
    assert dist._STATE == dist._State()  # every field back to its start value, not only some


def test_rank_state_has_one_source(monkeypatch: pytest.MonkeyPatch, no_launcher: None) -> None:
    """restart_count, scheduler_job and node_rank all come from the environment the launcher module read."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert dist.restart_count() == 2 and dist.restart_count() == dist.launch_env().restart_count
    assert dist.scheduler_job() == SchedulerJob("77", 1) == dist.launch_env().job
    assert dist.node_rank() == 0  # outside a group


def test_remeasured_threads_change_only_after_two_agreeing_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "_STATE", dist._State())  # this test's own module state, put back after it
    monkeypatch.setattr(dist, "get_local_world_size", lambda: 1)
    monkeypatch.setattr(dist, "available_cores", lambda: 2)
    verdicts, asked = iter([1, 1, 2, 1, 2, 2, 2, 1, 1]), []

    def probe(most: int, apply: bool = True) -> int:  # the measurement's verdicts in turn
        asked.append(apply)
        chosen = next(verdicts)
        if apply:
            torch.set_num_threads(chosen)
        return chosen

    monkeypatch.setattr(dist, "measured_threads", probe)
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        dist.configure_threads()
        assert dist.remeasure_threads() is None and asked == []  # a count the user set is never measured
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert dist.configure_threads() == 1  # start-up: busy in two probes in a row
        changes = [dist.remeasure_threads() for _ in range(7)]
        # 2 then 1: a single idle moment, no change; 2, 2: changed; 2: kept; 1 then 1: changed back
        assert changes == [None, None, None, (1, 2), None, None, (2, 1)] and torch.get_num_threads() == 1
        assert asked == [True, True] + [False] * 7  # the probes between epochs leave torch as they found it
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("verdicts, expected, probes", [
    ([2], 2, 1),  # all the cores at once
    ([1, 2], 2, 2),  # one slow probe at start-up is not enough for one thread
    ([1, 1], 1, 2),  # two are
])
def test_start_up_takes_fewer_threads_only_when_two_probes_agree(verdicts, expected, probes,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "_STATE", dist._State())
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(dist, "get_local_world_size", lambda: 1)
    monkeypatch.setattr(dist, "available_cores", lambda: 2)
    given = iter(verdicts)
    asked = []

    def probe(most: int) -> int:
        asked.append(most)
        chosen = next(given)
        torch.set_num_threads(chosen)
        return chosen

    monkeypatch.setattr(dist, "measured_threads", probe)
    before = torch.get_num_threads()
    try:
        assert dist.configure_threads() == expected and torch.get_num_threads() == expected
        assert asked == [2] * probes
    finally:
        torch.set_num_threads(before)
