"""The run folder and the checkpoint to resume from: flags, elastic restarts, requeued Slurm jobs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch.distributed as tdist

from tests.helpers import victim_folder
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
    record = run_plan.record_path(opts(tmp_path), "torchrun", "job/1")
    assert json.loads(record.read_text()) == {"job": "job/1", "run": "exp"} and first.reason == "new run"
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
    record = run_plan.record_path(opts(tmp_path), "slurm", "4242")
    assert json.loads(record.read_text()) == {"job": "4242", "run": "exp"} and first.reason == "new run"
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


# ------------------------------------------------------------------ issue 44: run folders never land on a user's
def _contents(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", ["../victim", "..", "x\x00y", "../victim/../victim"])
def test_a_name_leading_out_of_the_project_is_refused(name: str, tmp_path: Path) -> None:
    """``--name ../victim`` (the project folder not there yet) landed in ``victim``; ``..`` in the project's parent;
    a NUL byte was a traceback. Now one line, nothing made or changed."""
    from utils.paths import RunFolderError

    victim, files = victim_folder(tmp_path)
    config = RunConfig(project=str(tmp_path / "runs" / "train"), name=name)
    for exist_ok in (False, True):
        with pytest.raises(RunFolderError, match="^--name .* give one folder name") as info:
            plan_run(config.replace(exist_ok=exist_ok))
        assert "\n" not in str(info.value)
    assert _contents(victim) == files and sorted(p.name for p in tmp_path.iterdir()) == ["victim"]


def test_exist_ok_reuses_only_a_run_folder_of_ours(tmp_path: Path) -> None:
    from utils.paths import RunFolderError

    victim, files = victim_folder(tmp_path)
    with pytest.raises(RunFolderError, match="was not made by this project"):
        plan_run(RunConfig(project=str(tmp_path), name="victim", exist_ok=True))
    assert _contents(victim) == files
    first = plan_run(opts(tmp_path))
    assert plan_run(opts(tmp_path).replace(exist_ok=True)).save_dir == first.save_dir  # ours: reused


def test_a_run_folder_of_an_earlier_version_is_resumed_and_marked(tmp_path: Path) -> None:
    """Folders written before the marker existed: ``--resume`` of their ``weights/last.pt`` continues there (they
    hold the opt.yaml every run writes) and marks them, so restarts and --exist-ok find them afterwards."""
    from utils.paths import is_run_folder

    old = tmp_path / "runs" / "exp"
    last = write_last(old, epoch=3)
    (old / "opt.yaml").write_text("epochs: 5\n")
    plan = plan_run(opts(tmp_path, resume=str(last)))
    assert plan == run_plan.RunPlan(old.resolve(), last.resolve(), "--resume") and is_run_folder(old)


def test_a_checkpoint_outside_a_run_folder_of_ours_resumes_into_a_new_one(tmp_path: Path) -> None:
    """A last.pt anywhere else (in a user's weights/ folder without the opt.yaml of a run, a file beside other
    files) is resumed, but the run writes into a new run folder, never beside the checkpoint."""
    mine = tmp_path / "mine"
    checkpoints = [write_last(mine), write_last(tmp_path / "loose")]
    (mine / "results.csv").write_text("my results")
    files = _contents(mine)
    for checkpoint in checkpoints:
        plan = plan_run(opts(tmp_path, resume=str(checkpoint)))
        assert plan.resume_from == checkpoint.resolve() and plan.reason == "--resume, in a new run folder"
        assert plan.save_dir.parent == (tmp_path / "runs").resolve()
    assert _contents(mine) == files


def _torchrun_job(monkeypatch: pytest.MonkeyPatch, job_id: str) -> None:
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", job_id)


def test_a_job_record_never_points_a_job_at_a_users_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``.jobs/torchrun-<id>`` record naming any folder made a job with that --rdzv-id train there. Now a record
    holds a run name in the project, of this very job, and its folder must carry our marker; anything else is
    ignored with a warning and the job starts a new run."""
    victim, files = victim_folder(tmp_path)
    _torchrun_job(monkeypatch, "job1")
    config = opts(tmp_path)
    jobs = tmp_path / "runs" / ".jobs"
    jobs.mkdir(parents=True)
    (jobs / "torchrun-job1").write_text(f"{victim}\n")  # what the record used to hold, where it used to be
    (tmp_path / "runs" / "unmarked").mkdir()
    record = run_plan.record_path(config, "torchrun", "job1")
    hostile = [str(victim), {"job": "job1", "run": "../victim"}, {"job": "job1", "run": str(victim)},
               {"job": "job1", "run": "unmarked"}, {"job": "other", "run": "exp"}, "not json", ["job1"]]
    plan_run(opts(tmp_path / "other"))  # makes an 'exp' of ours elsewhere: not this project's
    for content in hostile:
        record.write_text(content if isinstance(content, str) else json.dumps(content))
        plan = plan_run(config)
        assert plan.reason == "new run" and plan.save_dir.parent == (tmp_path / "runs").resolve(), content
        assert json.loads(record.read_text()) == {"job": "job1", "run": plan.save_dir.name}  # replaced
        (plan.save_dir / ".yolo-run").unlink()
        plan.save_dir.rmdir()
    record.unlink()
    record.symlink_to(victim / "opt.yaml")  # a symlinked record is not read
    assert plan_run(config).reason == "new run"
    assert _contents(victim) == files


def test_every_job_id_has_a_record_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``team/a`` and ``team_a``, or two long ids sharing their first 100 characters, shared one record (and so
    one run folder)."""
    config = opts(tmp_path)
    ids = ["team/a", "team_a", "j" * 100 + "1", "j" * 100 + "2", "a b", "a_b"]
    paths = {run_plan.record_path(config, "torchrun", job_id) for job_id in ids}
    assert len(paths) == len(ids) and all(p.parent == tmp_path / "runs" / ".jobs" for p in paths)
    folders = []
    for job_id in ids[:2]:
        _torchrun_job(monkeypatch, job_id)
        folders.append(plan_run(config).save_dir)
        write_last(folders[-1])
    for job_id, folder in zip(ids[:2], folders):  # each job's next round continues its own run
        _torchrun_job(monkeypatch, job_id)
        assert plan_run(config).save_dir == folder
    assert folders[0] != folders[1]


def test_an_agent_store_naming_a_folder_not_ours_starts_a_new_run(tmp_path: Path, job_store: tdist.Store,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    victim, files = victim_folder(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    job_store.set(run_plan.RUN_DIR_KEY, str(victim))
    plan = plan_run(opts(tmp_path))
    assert plan.reason == "new run" and plan.save_dir == (tmp_path / "runs" / "exp").resolve()
    assert _contents(victim) == files


def test_a_failed_start_removes_the_run_folder_and_its_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _torchrun_job(monkeypatch, "job1")
    config = opts(tmp_path)
    plan = plan_run(config)
    with pytest.raises(ValueError, match="bad --data"), \
            run_plan.discarded_if_start_fails(config.replace(save_dir=str(plan.save_dir))):
        raise ValueError("bad --data")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == []  # no folder, no record, no empty .jobs/
