"""utils.distributed.launcher: rank state from torchrun's, the legacy launcher's and Slurm's environment."""

from __future__ import annotations

import pytest

from utils.distributed.launcher import DistError, SchedulerJob, expand_nodelist, expand_tasks_per_node, read_env

SLURM_TASK = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
              "SLURM_NTASKS": "16", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
              "SLURM_JOB_NODELIST": "node[03-04]", "SLURM_RESTART_COUNT": "2"}


def test_no_launcher_and_the_legacy_flag() -> None:
    alone = read_env(env={})
    assert (alone.world_size, alone.distributed, alone.launcher, alone.job) == (1, False, "none", None)
    assert read_env(local_rank_flag=3, env={}).local_rank == 3  # the legacy --local_rank flag


def test_torchrun_environment() -> None:
    env = read_env(env={"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                        "GROUP_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_USE_AGENT_STORE": "True",
                        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (2, 0, 4, 2, 1)
    assert (env.restart_count, env.agent_store, env.launcher, env.distributed) == (1, True, "torchrun", True)
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29400)


def test_nodelist_forms_slurm_writes() -> None:
    assert expand_nodelist("node[01-04,07]") == ["node01", "node02", "node03", "node04", "node07"]
    assert expand_nodelist("gpu7") == ["gpu7"]
    assert expand_nodelist("a[1-2],b,c[009-010]-ib") == ["a1", "a2", "b", "c009-ib", "c010-ib"]
    assert expand_nodelist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    with pytest.raises(DistError, match="not a host list"):
        expand_nodelist("node[01-")
    with pytest.raises(DistError, match="not numeric"):
        expand_nodelist("node[a-b]")
    assert expand_tasks_per_node("8(x2),4") == [8, 8, 4] and expand_tasks_per_node("2") == [2]


def test_srun_task_environment() -> None:
    env = read_env(env=SLURM_TASK)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (9, 1, 16, 8, 1)
    assert (env.master_addr, env.master_port, env.launcher) == ("node03", 20000 + 123456 % 20000, "slurm")
    assert env.job == SchedulerJob("123456", 2) and env.restart_count == 0  # a requeue is the job's, not torchrun's
    assert read_env(env={**SLURM_TASK, "MASTER_PORT": "29511"}).master_port == 29511
    inside = read_env(env={**SLURM_TASK, "WORLD_SIZE": "2", "RANK": "1"})  # torchrun inside an sbatch allocation
    assert (inside.world_size, inside.launcher, inside.job) == (2, "torchrun", SchedulerJob("123456", 2))
    batch_script = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_STEP_ID"}
    assert not read_env(env=batch_script).distributed  # the batch script itself (no srun step): one process


def test_launched_by_torchrun_srun_or_the_legacy_flag() -> None:
    from utils.distributed.launcher import launched

    assert not launched(env={})
    assert not launched(env={"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"})  # the batch script
    assert launched(env={"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"})
    assert launched(env={"WORLD_SIZE": "1"}) and launched(env={"LOCAL_RANK": "0"})
    assert launched(local_rank_flag=0, env={})


def test_a_line_recorded_for_torchrun_is_its_root_cause(tmp_path) -> None:
    """The error file torchrun reads: its failure table shows the line where it would say 'To enable traceback'."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from utils.distributed.launcher import record_error_line

    path = tmp_path / "error.json"
    assert not record_error_line("train: error: bad", env={})
    assert record_error_line("train: error: bad", env={"TORCHELASTIC_ERROR_FILE": str(path)})
    assert json.loads(path.read_text())["message"]["message"] == "train: error: bad"
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(path))
    table = str(ChildFailedError("train.py", {0: failure}))
    assert "traceback : train: error: bad" in table and "To enable traceback" not in table
