"""Resuming a run: the run folder and checkpoint to resume from (flags, elastic restarts), the options a resumed
run keeps, and when mid-epoch checkpoints are due."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest
import torch.distributed as tdist

from utils.distributed import comm as dist
from utils.training import resume
from utils.training.resume import (
    RUNTIME_OPTIONS,
    ResumeError,
    SaveInterval,
    find_resume_checkpoint,
    plan_run,
    resume_options,
)
from utils.weights.checkpoint import FORMAT, save_checkpoint


def opts(tmp_path: Path, resume: object = False, name: str = "exp") -> argparse.Namespace:
    return argparse.Namespace(project=str(tmp_path / "runs"), name=name, exist_ok=False, resume=resume)


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
    assert resumed == resume.RunPlan(first.save_dir, last, "--resume")
    with pytest.raises(ResumeError, match="--resume .*missing.pt"):
        plan_run(opts(tmp_path, resume=str(tmp_path / "missing.pt")))


def test_plan_run_after_elastic_restart_uses_recorded_folder(tmp_path: Path, job_store: tdist.Store,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    first = plan_run(opts(tmp_path))  # attempt 0 records its folder
    assert job_store.get(resume.RUN_DIR_KEY).decode() == str(first.save_dir.resolve())
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    no_checkpoint_yet = plan_run(opts(tmp_path))  # died before saving: start again in the same folder
    assert no_checkpoint_yet == resume.RunPlan(first.save_dir.resolve(), None, "elastic restart 1")
    last = write_last(first.save_dir, epoch=1)
    again = plan_run(opts(tmp_path, resume=False))
    assert again.save_dir == first.save_dir.resolve() and again.resume_from == last.resolve()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["exp"]


def test_restart_without_agent_store_starts_new_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert plan_run(opts(tmp_path)).reason == "new run"


def test_resume_options_keep_runtime_flags() -> None:
    defaults = {"epochs": 18, "batch_size": 16, "device": "", "workers": 8, "resume": False, "new_flag": 1}
    current = argparse.Namespace(epochs=10, batch_size=8, device="", workers=0, resume="x.pt", new_flag=1)
    saved = {"epochs": 3, "batch_size": 16, "device": "0", "workers": 2, "gone": 1}
    merged = resume_options(current, saved, defaults)
    # the machine's device is never taken from the checkpoint; workers only when given on the command line
    assert vars(merged) == {"epochs": 3, "batch_size": 16, "device": "", "workers": 0, "resume": "x.pt",
                            "new_flag": 1}
    current.workers = 8  # not given: the checkpoint's value
    assert resume_options(current, saved, defaults).workers == 2
    assert RUNTIME_OPTIONS["device"] and not RUNTIME_OPTIONS["workers"]


def test_save_interval_by_steps_and_minutes() -> None:
    assert [s for s in range(10) if SaveInterval(steps=3).steps_due(s)] == [3, 6, 9]
    assert not any(SaveInterval().steps_due(s) for s in range(10)) and not SaveInterval().clock_due()
    now = [0.0]
    interval = SaveInterval(minutes=1, clock=lambda: now[0])
    assert not interval.clock_due()
    now[0] = 61.0
    assert interval.clock_due()
    interval.saved()  # the clock restarts at each save
    assert not interval.clock_due()
    now[0] = 125.0
    assert interval.clock_due()


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
    assert again == resume.RunPlan(first.save_dir.resolve(), last.resolve(), "requeued Slurm job 4242 (restart 1)")
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job never adopts it
    assert plan_run(opts(tmp_path)).save_dir.name == "exp2"
