"""The run folder and the checkpoint a run resumes from, decided once on rank 0 (``plan_run``).

How a run folder survives a torchrun restart: the first attempt's rank 0 picks the folder
(``runs/train/exp{N}``) and records it in torchrun's agent store (``utils.distributed.comm.job_store()``),
which lives as long as the torchrun job and is shared by all ranks and nodes. When the agent
restarts the group (``TORCHELASTIC_RESTART_COUNT`` > 0), rank 0 reads the folder back from the
store and the run continues from its ``weights/last.pt``, with no ``--resume`` flag. A new
torchrun job has a new store, so it never picks up another job's folder.

Elastic membership (``--nnodes MIN:MAX``) needs the agent to give the workers a store of their own
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: torch 2.14's shared store breaks the rendezvous after a node joins), and
a node joining restarts the group without counting a restart; a Kubernetes pod restarted after a failure starts a
new torchrun with a new store. So a job with an id of its own (``--rdzv-id``, or ``PET_RDZV_ID``) also records its
folder in ``<project>/.jobs/torchrun-<rdzv id>`` (the project folder shared by the nodes): while that record exists,
every start of the job continues its run, and a run that finishes removes it. Without either (not launched by
torchrun, or torchrun's default id "none") a restart cannot be recognised and the run starts a new folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from utils.distributed import comm as dist
from utils.log import LOGGER
from utils.paths import increment_path
from utils.training.config import RunConfig
from utils.training.resume import LAST, ResumeError, generations

RUN_DIR_KEY = "run_dir"  # key in the job store (utils.distributed.comm.job_store) naming this job's run folder


@dataclass(frozen=True)
class RunPlan:
    """Where this run writes and what it resumes from; the same on every rank."""

    save_dir: Path
    resume_from: Path | None
    reason: str  # 'new run' | '--resume' | 'elastic restart N'


def run_dir_of(checkpoint: Path) -> Path:
    """``runs/train/exp/weights/last.pt`` -> ``runs/train/exp``."""
    return checkpoint.parent.parent if checkpoint.parent.name == "weights" else checkpoint.parent


def recorded_run_dir(config: RunConfig) -> tuple[Path, str] | None:
    """The run folder an earlier attempt of this job recorded, and why it is resumed: a torchrun restart (kept in
    the agent's store) or a requeued Slurm job (kept in ``<project>/.jobs/slurm-<job id>``). None otherwise."""
    store = dist.job_store()
    if dist.restart_count() > 0 and store is not None and store.check([RUN_DIR_KEY]):
        return Path(store.get(RUN_DIR_KEY).decode()), f"elastic restart {dist.restart_count()}"
    membership = _torchrun_record(config)
    if membership is not None and membership.is_file():
        return _read_record(membership), f"torchrun job {dist.torchrun_job_id()!r}: a restart or a node joined"
    if dist.restart_count() > 0:
        LOGGER.warning("WARNING: elastic restart without an agent store or a --rdzv-id: the earlier attempt's run "
                       "folder is unknown, so this attempt starts a new run")
    job = dist.scheduler_job()
    record = _job_record(config, job)
    if job is not None and job.restarts > 0 and record is not None and record.is_file():
        return _read_record(record), f"requeued Slurm job {job.job_id} (restart {job.restarts})"
    return None


def _job_record(config: RunConfig, job: dist.SchedulerJob | None) -> Path | None:
    return Path(config.project) / ".jobs" / f"slurm-{job.job_id}" if job is not None else None


def _torchrun_record(config: RunConfig) -> Path | None:
    """``<project>/.jobs/torchrun-<rdzv id>`` for a torchrun job with an id of its own; else None."""
    job_id = dist.torchrun_job_id()
    if not job_id:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)[:100]
    return Path(config.project) / ".jobs" / f"torchrun-{safe}"


def _read_record(record: Path) -> Path:
    return Path(record.read_text().strip())


def _write_record(record: Path, folder: str) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(f"{record.name}.tmp")
    tmp.write_text(folder + "\n")
    tmp.replace(record)


def record_run_dir(config: RunConfig, save_dir: Path) -> None:
    """Remember the run folder for later attempts of this job: torchrun restarts and membership changes, requeued
    Slurm jobs."""
    folder = str(Path(save_dir).resolve())
    store = dist.job_store()
    if store is not None:
        store.set(RUN_DIR_KEY, folder)
    for record in (_torchrun_record(config), _job_record(config, dist.scheduler_job())):
        if record is not None:
            _write_record(record, folder)


def forget_run_dir(config: RunConfig) -> None:
    """A finished run: rank 0 removes the torchrun job's record, so a later job with the same --rdzv-id starts a new
    run (the other ranks do nothing)."""
    record = _torchrun_record(config)
    if record is not None and dist.is_main_process():
        record.unlink(missing_ok=True)


def latest_checkpoint(search_dir: str | Path) -> Path | None:
    """The most recently written ``last.pt`` under ``search_dir`` (for a bare ``--resume``)."""
    found = list(Path(search_dir).glob("**/last.pt"))
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def find_resume_checkpoint(config: RunConfig, recorded: Path | None = None) -> Path | None:
    """The checkpoint to resume from: in the run folder an earlier attempt of this job ``recorded``, its
    ``last.pt`` (or the previous generation when only that exists; None when it saved nothing, so the run starts
    again there); otherwise ``--resume PATH`` (a file or run folder), a bare ``--resume`` (the latest last.pt under
    ``--project``), or None. Raises ResumeError when an asked-for checkpoint is missing. Which generation is read
    is decided when it is loaded (utils.training.resume.load_resumable)."""
    if recorded is not None:
        last = recorded / "weights" / LAST
        return last if any(p.is_file() for p in generations(last)) else None
    resume = config.resume
    if resume in (False, None, "", "False"):
        return None
    if resume is True or resume == "True":
        project = Path(config.project)
        latest = latest_checkpoint(project)
        if latest is None:
            raise ResumeError(f"--resume: no last.pt found under {project}; pass the checkpoint: --resume PATH")
        return latest
    path = Path(resume)
    if path.is_dir():
        path = path / "weights" / LAST if (path / "weights").is_dir() else path / LAST
    if not any(p.is_file() for p in generations(path)):
        raise ResumeError(f"--resume {resume}: {path} not found; pass a last.pt or a run folder that has one")
    return path


def plan_run(config: RunConfig) -> RunPlan:
    """Decide once, on rank 0, the run folder and the checkpoint to resume from, and share them.

    Precedence: the folder recorded by an earlier attempt of this job (a torchrun restart, a requeued Slurm
    job), then the folder of the ``--resume`` checkpoint, then a new ``--project/--name`` folder (incremented
    unless ``--exist-ok``). Rank 0 creates the folder and records it for later attempts. All ranks must call it.
    """
    return dist.main_decides(lambda: _decide_run(config))


def _decide_run(config: RunConfig) -> RunPlan:
    """Rank 0's half of plan_run."""
    recorded = recorded_run_dir(config)
    resume_from = find_resume_checkpoint(config, recorded[0] if recorded else None)
    if recorded is not None:
        save_dir, reason = recorded
    elif resume_from is not None:
        save_dir, reason = run_dir_of(resume_from), "--resume"
    else:
        save_dir = increment_path(Path(config.project) / config.name, exist_ok=config.exist_ok)
        reason = "new run"
    save_dir = save_dir.resolve()  # rank 0's folder: the other ranks (maybe elsewhere) never write there
    save_dir.mkdir(parents=True, exist_ok=True)
    record_run_dir(config, save_dir)
    return RunPlan(save_dir, resume_from.resolve() if resume_from else None, reason)
