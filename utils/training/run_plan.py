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
folder in ``<project>/.jobs/torchrun-<hash of the rdzv id>`` (the project folder shared by the nodes): while that
record exists, every start of the job continues its run, and a run that finishes removes it. Without either (not
launched by torchrun, or torchrun's default id "none") a restart cannot be recognised and the run starts a new
folder.

Every folder a run writes into follows utils.paths' one rule: a new run folder it creates (``new_run_folder``), or
one of ours (the ``.yolo-run`` marker) that a resume, a record or ``--exist-ok`` names. A record (``.jobs/``) holds
only ``{"job": id, "run": name}`` and is used only for this very job and a marked folder inside the project.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from utils.distributed import comm as dist
from utils.log import LOGGER
from utils.paths import (
    RUN_MARKER,
    check_run_name,
    discard_if_unused,
    is_run_folder,
    mark_run_folder,
    new_run_folder,
)
from utils.training.config import RunConfig
from utils.training.resume import LAST, ResumeError, generations

RUN_DIR_KEY = "run_dir"  # key in the job store (utils.distributed.comm.job_store) naming this job's run folder
MAX_RECORD = 4096


@dataclass(frozen=True)
class RunPlan:
    """Where this run writes and what it resumes from; the same on every rank."""

    save_dir: Path
    resume_from: Path | None
    reason: str  # 'new run' | '--resume' | 'elastic restart N' | ...


def run_dir_of(checkpoint: Path) -> Path:
    """``runs/train/exp/weights/last.pt`` -> ``runs/train/exp``."""
    return checkpoint.parent.parent if checkpoint.parent.name == "weights" else checkpoint.parent


def recorded_run_dir(config: RunConfig) -> tuple[Path, str] | None:
    """The run folder an earlier attempt of this job recorded, and why it is resumed: a torchrun restart (kept in
    the agent's store) or a torchrun membership change or requeued Slurm job (kept in ``<project>/.jobs/``). A
    record is used only when its folder is a run folder of ours (and, from ``.jobs/``, inside the project); None
    otherwise."""
    store = dist.job_store()
    if dist.restart_count() > 0 and store is not None and store.check([RUN_DIR_KEY]):
        folder = Path(store.get(RUN_DIR_KEY).decode())
        if is_run_folder(folder):
            return folder.resolve(), f"elastic restart {dist.restart_count()}"
        LOGGER.warning(f"WARNING: the earlier attempt's run folder {folder} is gone or not ours (no {RUN_MARKER} "
                       "file); this attempt starts a new run")
    job_id = dist.torchrun_job_id()
    if job_id:
        folder = _read_record(config, "torchrun", job_id)
        if folder is not None:
            return folder, f"torchrun job {job_id!r}: a restart or a node joined"
    if dist.restart_count() > 0:
        LOGGER.warning("WARNING: elastic restart without an agent store or a --rdzv-id: the earlier attempt's run "
                       "folder is unknown, so this attempt starts a new run")
    job = dist.scheduler_job()
    if job is not None and job.restarts > 0:
        folder = _read_record(config, "slurm", job.job_id)
        if folder is not None:
            return folder, f"requeued Slurm job {job.job_id} (restart {job.restarts})"
    return None


def record_path(config: RunConfig, kind: str, job_id: str) -> Path:
    """``<project>/.jobs/<kind>-<SHA-256 of the whole job id, 32 hex digits>``: one record per job id, whatever
    characters or length it has."""
    digest = hashlib.sha256(job_id.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return Path(config.project) / ".jobs" / f"{kind}-{digest}"


def _read_record(config: RunConfig, kind: str, job_id: str) -> Path | None:
    """The run folder a job record names, when it is a record of this very job (``{"job": id, "run": name}``) whose
    name is one folder name in the project holding our marker; None (with a warning when a record was there but
    is not usable) otherwise."""
    record = record_path(config, kind, job_id)
    if not os.path.lexists(record):
        return None
    try:
        if record.is_symlink() or not record.is_file() or record.stat().st_size > MAX_RECORD:
            raise ValueError("not a small plain file")
        found = json.loads(record.read_text("utf-8"))
        if not isinstance(found, dict) or found.get("job") != job_id:
            raise ValueError("not a record of this job")
        folder = Path(config.project).resolve() / check_run_name(found.get("run"), "the record's run name")
        if not is_run_folder(folder):
            raise ValueError(f"{folder} is not a run folder of ours")
    except (OSError, ValueError, RecursionError) as e:
        LOGGER.warning(f"WARNING: job record {record} ignored ({str(e)[:200]}); this attempt starts a new run")
        return None
    return folder


def _write_record(config: RunConfig, kind: str, job_id: str, save_dir: Path) -> None:
    """Record the run folder's name for later attempts of this job (written to a new name, then renamed); only a
    folder directly inside the project is recorded (a run resumed elsewhere finds it again through --resume)."""
    project = Path(config.project).resolve()
    if save_dir.parent != project:
        return
    record = record_path(config, kind, job_id)
    jobs = record.parent
    if jobs.is_symlink() or (jobs.exists() and not jobs.is_dir()):
        LOGGER.warning(f"WARNING: {jobs} is not a folder of ours; this job's run folder is not recorded")
        return
    jobs.mkdir(exist_ok=True)
    tmp = record.with_name(f"{record.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.write_text(json.dumps({"job": job_id, "run": save_dir.name}) + "\n")
    tmp.replace(record)


def _job_ids() -> list[tuple[str, str]]:
    """(kind, id) of the records this process keeps: a torchrun job with an id of its own, a Slurm job."""
    ids = []
    if dist.torchrun_job_id():
        ids.append(("torchrun", dist.torchrun_job_id()))
    if (job := dist.scheduler_job()) is not None:
        ids.append(("slurm", job.job_id))
    return ids


def record_run_dir(config: RunConfig, save_dir: Path) -> None:
    """Remember the run folder for later attempts of this job: torchrun restarts and membership changes, requeued
    Slurm jobs."""
    folder = Path(save_dir).resolve()
    store = dist.job_store()
    if store is not None:
        store.set(RUN_DIR_KEY, str(folder))
    for kind, job_id in _job_ids():
        _write_record(config, kind, job_id, folder)


def forget_run_dir(config: RunConfig) -> None:
    """A finished run: rank 0 removes the torchrun job's record, so a later job with the same --rdzv-id starts a new
    run (the other ranks do nothing)."""
    job_id = dist.torchrun_job_id()
    if job_id and dist.is_main_process():
        record_path(config, "torchrun", job_id).unlink(missing_ok=True)


def latest_checkpoint(search_dir: str | Path) -> Path | None:
    """The most recently written ``last.pt`` under ``search_dir`` (for a bare ``--resume``)."""
    found = list(Path(search_dir).glob("**/last.pt"))
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def find_resume_checkpoint(config: RunConfig, recorded: Path | None = None) -> Path | None:
    """The checkpoint to resume from: in the run folder an earlier attempt of this job ``recorded``, its
    ``last.pt`` (or the previous generation when only that exists); otherwise (nothing recorded, or the attempt
    saved nothing yet) ``--resume PATH`` (a file or run folder), a bare ``--resume`` (the latest last.pt under
    ``--project``), or None. Raises ResumeError when an asked-for checkpoint is missing. Which generation is read
    is decided when it is loaded (utils.training.resume.load_resumable)."""
    if recorded is not None:
        last = recorded / "weights" / LAST
        if any(p.is_file() for p in generations(last)):
            return last
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


def resumed_run_dir(checkpoint: Path) -> Path | None:
    """The run folder a resumed checkpoint continues in: the folder of ``<folder>/weights/last.pt`` when it is a run
    folder of ours, or one made before run folders were marked (it holds the ``opt.yaml`` every run writes, and is
    marked now); None for a checkpoint anywhere else (the run continues in a new run folder)."""
    if checkpoint.parent.name != "weights":
        return None
    folder = run_dir_of(checkpoint)
    if is_run_folder(folder):
        return folder.resolve()
    options = folder / "opt.yaml"
    if folder.is_symlink() or not folder.is_dir() or options.is_symlink() or not options.is_file():
        return None
    mark_run_folder(folder)
    LOGGER.info(f"{folder} is a run folder of an earlier version: marked as ours ({RUN_MARKER})")
    return folder.resolve()


def plan_run(config: RunConfig) -> RunPlan:
    """Decide once, on rank 0, the run folder and the checkpoint to resume from, and share them.

    Precedence: the folder recorded by an earlier attempt of this job (a torchrun restart, a requeued Slurm
    job), then the run folder of the ``--resume`` checkpoint (resumed_run_dir), then a new ``--project/--name``
    folder (utils.paths.new_run_folder: incremented, or an existing one of ours with ``--exist-ok``). Rank 0
    creates the folder and records it for later attempts. All ranks must call it.
    """
    return dist.main_decides(lambda: _decide_run(config))


def _decide_run(config: RunConfig) -> RunPlan:
    """Rank 0's half of plan_run."""
    recorded = recorded_run_dir(config)
    resume_from = find_resume_checkpoint(config, recorded[0] if recorded else None)
    own = resumed_run_dir(resume_from) if recorded is None and resume_from is not None else None
    if recorded is not None:
        save_dir, reason = recorded
    elif own is not None:
        save_dir, reason = own, "--resume"
    else:
        save_dir = new_run_folder(config.project, config.name, config.exist_ok)
        reason = "new run" if resume_from is None else "--resume, in a new run folder"
    record_run_dir(config, save_dir)
    return RunPlan(save_dir, resume_from.resolve() if resume_from else None, reason)


@contextlib.contextmanager
def discarded_if_start_fails(config: RunConfig) -> Iterator[None]:
    """A start that fails inside the block (a bad --data, a batch size that does not divide) leaves no run folder
    behind: rank 0 removes ``config.save_dir`` when it still holds nothing but our marker (and empty folders), and
    this job's records of it; the other ranks do nothing. A folder with anything in it is kept as it is."""
    try:
        yield
    except BaseException:
        if config.save_dir and dist.is_main_process() and discard_if_unused(config.save_dir):
            for kind, job_id in _job_ids():  # they named the folder just removed
                record_path(config, kind, job_id).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    record_path(config, kind, job_id).parent.rmdir()  # .jobs/, when nothing else is in it
        raise
