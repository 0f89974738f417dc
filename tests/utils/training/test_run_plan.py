"""The run folder and the checkpoint to resume from: flags, elastic restarts, requeued Slurm jobs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch.distributed as tdist

from utils.distributed import comm as dist
from utils.training import run_plan
from utils.training.config import RunConfig
from utils.training.resume import ResumeError
from utils.training.run_plan import find_resume_checkpoint, plan_run
from utils.weights.checkpoint import FORMAT, save_checkpoint


def opts(tmp_path: Path, resume: object = False, name: str = "exp") -> RunConfig:
    return RunConfig(project=str(tmp_path / "runs"), name=name, resume=resume)


def write_last(run_dir: Path, epoch: int = 0) -> Path:
    return save_checkpoint({"format": FORMAT, "model": {}, "model_yaml": {}, "epoch": epoch},
                           run_dir / "weights" / "last.pt")


@pytest.fixture
def job_store(monkeypatch: pytest.MonkeyPatch) -> tdist.Store:
    """An in-process stand-in for torchrun's agent store (the real one is exercised in test_elastic_restart)."""
    store = tdist.HashStore()
    monkeypatch.setattr(dist, "job_store", lambda timeout_s=60.0: store)
    return store


def test_find_resume_checkpoint_from_flag(tmp_path: Path) -> None:
    assert find_resume_checkpoint(opts(tmp_path)) is None
    old = write_last(tmp_path / "runs" / "exp")
    new = write_last(tmp_path / "runs" / "exp2")
    os.utime(old, (time.time() - 100, time.time() - 100))
    assert find_resume_checkpoint(opts(tmp_path, resume=True)) == new  # bare --resume: the latest
    assert find_resume_checkpoint(opts(tmp_path, resume=str(old))) == old
    assert find_resume_checkpoint(opts(tmp_path, resume=str(old.parent.parent))) == old  # a run folder
    with pytest.raises(ResumeError, match="nothere.pt not found"):
        find_resume_checkpoint(opts(tmp_path, resume=str(tmp_path / "nothere.pt")))
    with pytest.raises(ResumeError, match="no last.pt found under"):
        find_resume_checkpoint(opts(tmp_path / "empty", resume=True))


def test_plan_run_new_and_resumed(tmp_path: Path) -> None:
    first = plan_run(opts(tmp_path))
    second = plan_run(opts(tmp_path))
    assert (first.save_dir.name, second.save_dir.name) == ("exp", "exp2") and first.save_dir.is_dir()
    assert first.resume_from is None and first.reason == "new run"
    last = write_last(first.save_dir)
    resumed = plan_run(opts(tmp_path, resume=str(last)))
    assert resumed == run_plan.RunPlan(first.save_dir, last, "--resume")
    with pytest.raises(ResumeError, match="--resume .*missing.pt"):
        plan_run(opts(tmp_path, resume=str(tmp_path / "missing.pt")))


def test_plan_run_after_elastic_restart_uses_recorded_folder(tmp_path: Path, job_store: tdist.Store,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    first = plan_run(opts(tmp_path))  # attempt 0 records its folder
    assert job_store.get(run_plan.RUN_DIR_KEY).decode() == str(first.save_dir.resolve())
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    no_checkpoint_yet = plan_run(opts(tmp_path))  # died before saving: start again in the same folder
    assert no_checkpoint_yet == run_plan.RunPlan(first.save_dir.resolve(), None, "elastic restart 1")
    last = write_last(first.save_dir, epoch=1)
    again = plan_run(opts(tmp_path, resume=False))
    assert again.save_dir == first.save_dir.resolve() and again.resume_from == last.resolve()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["exp"]


def test_restart_without_agent_store_starts_new_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert plan_run(opts(tmp_path)).reason == "new run"


def test_torchrun_job_without_agent_store_continues_its_run_until_it_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers with a store of their own (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): a node joining restarts them with
    the same restart count, so the record in the project folder, not the count, says the run goes on."""
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job/1")
    first = plan_run(opts(tmp_path))
    record = tmp_path / "runs" / ".jobs" / "torchrun-job_1"
    assert record.read_text().strip() == str(first.save_dir.resolve()) and first.reason == "new run"
    last = write_last(first.save_dir, epoch=2)
    again = plan_run(opts(tmp_path))  # the next rendezvous round (a node joined): same count, same run
    assert again == run_plan.RunPlan(first.save_dir.resolve(), last.resolve(),
                                     "torchrun job 'job/1': a restart or a node joined")
    run_plan.forget_run_dir(opts(tmp_path))  # the run finished
    assert not record.exists() and plan_run(opts(tmp_path)).save_dir.name == "exp2"  # a new job, the same id
    record.unlink()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default id names every job: no record
    assert plan_run(opts(tmp_path)).save_dir.name == "exp3" and list(record.parent.iterdir()) == []


def test_a_torchrun_job_started_again_with_its_id_continues_its_run(tmp_path: Path, job_store: tdist.Store,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A Kubernetes pod restarted after a failure runs a new torchrun (a new agent store, restart count 0) with the
    job's --rdzv-id: the record in the project folder continues the run."""
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "yolo-train")
    first = plan_run(opts(tmp_path))
    last = write_last(first.save_dir, epoch=1)
    job_store.delete_key(run_plan.RUN_DIR_KEY)  # the new torchrun's store knows nothing
    again = plan_run(opts(tmp_path))
    assert (again.save_dir, again.resume_from) == (first.save_dir.resolve(), last.resolve())


def test_requeued_slurm_job_resumes_its_own_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    first = plan_run(opts(tmp_path))
    record = tmp_path / "runs" / ".jobs" / "slurm-4242"
    assert record.read_text().strip() == str(first.save_dir.resolve()) and first.reason == "new run"
    last = write_last(first.save_dir, epoch=2)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # scontrol requeue: same job id, restart count up
    again = plan_run(opts(tmp_path))
    assert again == run_plan.RunPlan(first.save_dir.resolve(), last.resolve(), "requeued Slurm job 4242 (restart 1)")
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job never adopts it
    assert plan_run(opts(tmp_path)).save_dir.name == "exp2"


def test_a_run_folder_with_only_the_previous_generation_is_resumed(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "exp"
    previous = save_checkpoint({"format": FORMAT, "model": {}, "model_yaml": {}}, run_dir / "weights" / "last.prev.pt")
    assert find_resume_checkpoint(opts(tmp_path, resume=str(run_dir))) == previous.with_name("last.pt")
