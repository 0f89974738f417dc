"""Exact resume: RNG states, the training position, the run folder across elastic restarts, world-size changes.

How a run folder survives a torchrun restart: the first attempt's rank 0 picks the folder
(``runs/train/exp{N}``) and records it in torchrun's agent store (``utils.distributed.comm.job_store()``),
which lives as long as the torchrun job and is shared by all ranks and nodes. When the agent
restarts the group (``TORCHELASTIC_RESTART_COUNT`` > 0), rank 0 reads the folder back from the
store and the run continues from its ``weights/last.pt``, with no ``--resume`` flag. A new
torchrun job has a new store, so it never picks up another job's folder. Without an agent store
(not launched by torchrun) a restart cannot be recognised and the run starts a new folder.

Everything a checkpoint holds here is a tensor or a plain Python type (``weights_only=True``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from utils.distributed import comm as dist
from utils.hooks import CHECKPOINT_PRIORITY, HookBase, StepInfo
from utils.log import LOGGER
from utils.paths import increment_path
from utils.training.fitness import fitness
from utils.training.train_state import (
    ResumeError,
    TrainPosition,
    adapt_to_world_size,
    gather_rng_states,
    pack_train_state,
    rng_state_for,
    unpack_train_state,
)
from utils.weights.checkpoint import (
    CheckpointError,
    load_first_good,
    new_checkpoint,
    save_checkpoint,
    save_run_checkpoints,
    to_plain,
)
from utils.weights.downloads import attempt_download, is_release_name

RUN_DIR_KEY = "run_dir"  # key in the job store (utils.distributed.comm.job_store) naming this job's run folder


class SaveInterval:
    """When to write a mid-epoch ``last.pt``: every ``steps`` batches and/or every ``minutes`` by rank 0's clock
    (its verdict reaches the other ranks through the step vote). Both 0: never mid-epoch."""

    def __init__(self, steps: int = 0, minutes: float = 0.0, clock: Any = time.monotonic) -> None:
        self.steps, self.seconds, self.clock = int(steps), float(minutes) * 60.0, clock
        self.last_time = clock()

    def clock_due(self) -> bool:
        """Rank 0: the minutes are up (local; False on the other ranks and without --save-interval-minutes)."""
        return self.seconds > 0 and dist.is_main_process() and self.clock() - self.last_time >= self.seconds

    def steps_due(self, steps_done: int) -> bool:
        """Every ``steps`` batches (``steps_done`` counts every batch backpropagated since the run began)."""
        return self.steps > 0 and steps_done > 0 and steps_done % self.steps == 0

    def saved(self) -> None:
        """Restart the clock after a checkpoint."""
        self.last_time = self.clock()


# ------------------------------------------------------------------------- run folder and checkpoint path
@dataclass(frozen=True)
class RunPlan:
    """Where this run writes and what it resumes from; the same on every rank."""

    save_dir: Path
    resume_from: Path | None
    reason: str  # 'new run' | '--resume' | 'elastic restart N'


def run_dir_of(checkpoint: Path) -> Path:
    """``runs/train/exp/weights/last.pt`` -> ``runs/train/exp``."""
    return checkpoint.parent.parent if checkpoint.parent.name == "weights" else checkpoint.parent


def recorded_run_dir(opt: argparse.Namespace) -> tuple[Path, str] | None:
    """The run folder an earlier attempt of this job recorded, and why it is resumed: a torchrun restart (kept in
    the agent's store) or a requeued Slurm job (kept in ``<project>/.jobs/slurm-<job id>``). None otherwise."""
    if dist.restart_count() > 0:
        store = dist.job_store()
        if store is not None and store.check([RUN_DIR_KEY]):
            return Path(store.get(RUN_DIR_KEY).decode()), f"elastic restart {dist.restart_count()}"
        LOGGER.warning("WARNING: elastic restart without an agent store: the earlier attempt's run folder is "
                       "unknown, so this attempt starts a new run")
    job = dist.scheduler_job()
    record = _job_record(opt, job)
    if job is not None and job.restarts > 0 and record is not None and record.is_file():
        return Path(record.read_text().strip()), f"requeued Slurm job {job.job_id} (restart {job.restarts})"
    return None


def _job_record(opt: argparse.Namespace, job: dist.SchedulerJob | None) -> Path | None:
    return Path(opt.project) / ".jobs" / f"slurm-{job.job_id}" if job is not None else None


def record_run_dir(opt: argparse.Namespace, save_dir: Path) -> None:
    """Remember the run folder for later attempts of this job: torchrun restarts, requeued Slurm jobs."""
    folder = str(Path(save_dir).resolve())
    store = dist.job_store()
    if store is not None:
        store.set(RUN_DIR_KEY, folder)
    record = _job_record(opt, dist.scheduler_job())
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{record.name}.tmp")
        tmp.write_text(folder + "\n")
        tmp.replace(record)


def latest_checkpoint(search_dir: str | Path) -> Path | None:
    """The most recently written ``last.pt`` under ``search_dir`` (for a bare ``--resume``)."""
    found = list(Path(search_dir).glob("**/last.pt"))
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def find_resume_checkpoint(opt: argparse.Namespace, recorded: Path | None = None) -> Path | None:
    """The checkpoint to resume from: in the run folder an earlier attempt of this job ``recorded``, its
    ``last.pt`` (best.pt when only that exists; None when it saved nothing, so the run starts again there);
    otherwise ``--resume PATH`` (a file or run folder), a bare ``--resume`` (the latest last.pt under
    ``--project``), or None. Raises ResumeError when an asked-for checkpoint is missing."""
    if recorded is not None:
        weights = recorded / "weights"
        return next((p for p in (weights / "last.pt", weights / "best.pt") if p.is_file()), None)
    resume = getattr(opt, "resume", False)
    if resume in (False, None, "", "False"):
        return None
    if resume is True or resume == "True":
        project = Path(getattr(opt, "project", "runs/train"))
        latest = latest_checkpoint(project)
        if latest is None:
            raise ResumeError(f"--resume: no last.pt found under {project}; pass the checkpoint: --resume PATH")
        return latest
    path = Path(resume)
    if path.is_dir():
        path = next((p for p in (path / "weights" / "last.pt", path / "last.pt") if p.is_file()), path / "last.pt")
    if not path.is_file():
        raise ResumeError(f"--resume {resume}: {path} not found; pass a last.pt or a run folder that has one")
    return path


def plan_run(opt: argparse.Namespace) -> RunPlan:
    """Decide once, on rank 0, the run folder and the checkpoint to resume from, and share them.

    Precedence: the folder recorded by an earlier attempt of this job (a torchrun restart, a requeued Slurm
    job), then the folder of the ``--resume`` checkpoint, then a new ``--project/--name`` folder (incremented
    unless ``--exist-ok``). Rank 0 creates the folder and records it for later attempts. All ranks must call it.
    """
    return dist.main_decides(lambda: _decide_run(opt))


def _decide_run(opt: argparse.Namespace) -> RunPlan:
    """Rank 0's half of plan_run."""
    recorded = recorded_run_dir(opt)
    resume_from = find_resume_checkpoint(opt, recorded[0] if recorded else None)
    if recorded is not None:
        save_dir, reason = recorded
    elif resume_from is not None:
        save_dir, reason = run_dir_of(resume_from), "--resume"
    else:
        save_dir = increment_path(Path(opt.project) / opt.name, exist_ok=bool(getattr(opt, "exist_ok", False)))
        reason = "new run"
    save_dir = save_dir.resolve()  # rank 0's folder: the other ranks (maybe elsewhere) never write there
    save_dir.mkdir(parents=True, exist_ok=True)
    record_run_dir(opt, save_dir)
    return RunPlan(save_dir, resume_from.resolve() if resume_from else None, reason)


# Options a resumed run takes from its command line rather than from the checkpoint. True: always (they describe
# this machine and launch, not the run); False: when given on the command line (else the checkpoint's value).
RUNTIME_OPTIONS: dict[str, bool] = {
    "resume": True, "device": True, "backend": True, "trust_weights": True, "local_rank": True, "hook": True,
    "workers": False, "ddp_timeout": False, "ddp_long_timeout": False, "save_interval_steps": False,
    "save_interval_minutes": False, "exist_ok": False, "amp": False, "channels_last": False, "compile": False,
    "data": False,  # each machine may keep the data elsewhere
}


def resume_options(opt: argparse.Namespace, saved_opt: dict, defaults: dict[str, Any]) -> argparse.Namespace:
    """The checkpoint's options, except the runtime ones (see RUNTIME_OPTIONS) that ``opt`` keeps; ``defaults``
    (the parser's) tell which were given on the command line. Options the checkpoint lacks (added since) keep
    their current values."""
    keep = {k for k, always in RUNTIME_OPTIONS.items() if always or getattr(opt, k, None) != defaults.get(k)}
    merged = dict(vars(opt))
    merged.update({k: v for k, v in saved_opt.items() if k in merged and k not in keep})
    return argparse.Namespace(**merged)


def shared_checkpoint(paths: list[str | Path], trusted: bool = False) -> tuple[Path, dict]:
    """Rank 0 loads the first whole checkpoint of ``paths`` (e.g. last.pt, then best.pt; a YOLOv5 release name
    such as yolov5s.pt is downloaded first when it is not on disk) and sends it to every rank, so no other node
    needs to see the file. A UserError on every rank when none loads. All ranks must call it."""
    def local(path: str | Path) -> Path:  # a release name not on disk is fetched; other paths stay as they are
        return attempt_download(path) if is_release_name(path) and not Path(path).is_file() else Path(path)

    return dist.main_decides(lambda: load_first_good([local(p) for p in paths], trusted=trusted))


# ----------------------------------------------------------------------------------- checkpoints of a run
def pack_trainer_state(trainer: Any, epoch: int, samples_seen: int) -> dict[str, Any]:
    """What exact resume needs beyond the EMA weights: the position (epoch in progress, samples of it done),
    raw weights and pending gradients, optimizer/scaler/EMA/counters, early-stopping state and every rank's RNG
    states. All ranks must call it (the RNG states are gathered)."""
    position = TrainPosition(epoch=epoch, samples_seen=samples_seen, batch_size=trainer.opt.batch_size,
                             world_size=dist.get_world_size(), accumulate=trainer.updater.schedule.accumulate)
    core = trainer.model_without_ddp
    state = pack_train_state(position, gather_rng_states(), grads_of=core, model=core, updater=trainer.updater,
                             stopper=trainer.stopper)
    state["maps"] = [float(v) for v in trainer.maps]  # the --image-weights of the next epoch depend on them
    return state


class Checkpointer(HookBase):
    """Writes the run's checkpoints: ``last.pt`` mid-epoch (every --save-interval-*, and where every rank agreed
    to stop) and after every epoch, ``best.pt`` on a new best fitness, ``epoch{N}.pt`` every --save-period.

    Every rank runs it (the RNG states are gathered); only the main process writes (``enabled``, decided at
    set-up). Files are written atomically; ``on_checkpoint`` hooks run after each ``last.pt``. It runs before
    every other hook (CHECKPOINT_PRIORITY), so the epoch's files exist when loggers and user hooks see the epoch.
    """

    priority = CHECKPOINT_PRIORITY

    def __init__(self, enabled: bool, interval: SaveInterval | None = None) -> None:
        self.enabled, self.interval = enabled, interval or SaveInterval()
        self.wanted = False  # a mid-epoch checkpoint is due, waiting for a batch where one may be taken

    def after_step(self, trainer: Any, step: StepInfo) -> None:
        self.wanted = self.wanted or step.save_due or trainer.stop.agreed or \
            self.interval.steps_due(trainer.updater.iteration)
        if self.wanted and step.boundary:
            self.write(trainer, step.epoch - 1, step.epoch, (step.batch + 1) * trainer.opt.batch_size)
            self.wanted = False

    def after_epoch(self, trainer: Any, epoch: int, metrics: dict[str, float]) -> None:
        """last.pt (only the final one with --nosave), best.pt on a new best fitness, epoch{N}.pt."""
        opt, final = trainer.opt, epoch == trainer.opt.epochs - 1
        if opt.nosave and not final:
            return
        period = opt.save_period > 0 and (epoch + 1) % opt.save_period == 0
        best = fitness([metrics[f"metrics/{k}"] for k in ("precision", "recall", "mAP_0.5", "mAP_0.5:0.95")])
        self.write(trainer, epoch, epoch + 1, 0, is_best=best >= trainer.best_fitness,
                   period_name=f"epoch{epoch}.pt" if period else None)

    def write(self, trainer: Any, completed_epoch: int, epoch: int, samples_seen: int, *, is_best: bool = False,
              period_name: str | None = None) -> None:
        """last.pt (the EMA weights plus the exact-resume state at ``epoch``/``samples_seen``), then a stripped
        best.pt when ``is_best`` and ``period_name`` as a copy of last.pt. All ranks must call it."""
        dist.progress("checkpoint", epoch, samples_seen // trainer.opt.batch_size)
        state = pack_trainer_state(trainer, epoch, samples_seen)
        self.interval.saved()
        trainer.saved_position = (epoch, samples_seen)
        if self.enabled:
            weights = trainer.save_dir / "weights"
            ckpt = new_checkpoint(trainer.model_without_ddp, state_dict=trainer.ema.ema.state_dict(),
                                  epoch=completed_epoch, best_fitness=trainer.best_fitness, opt=vars(trainer.opt),
                                  hyp=trainer.hyp, train_state=state, hooks=to_plain(trainer.hooks.state_dict()))
            save_run_checkpoints(ckpt, weights, period_name=period_name)
            if is_best:  # after last.pt, so the two are never both missing
                save_checkpoint({k: v for k, v in ckpt.items() if k != "train_state"}, weights / "best.pt")
        trainer.hooks.on_checkpoint(trainer, epoch, samples_seen)


def restore_training_state(trainer: Any, ckpt: dict) -> None:
    """Continue a run from a checkpoint's train_state: weights, pending gradients, optimizer, EMA, schedule,
    epoch and sample position, RNG (restored later, before the first batch); adapted to this world size."""
    state = ckpt.get("train_state")
    if not state:
        raise ResumeError("--resume: the checkpoint has no training state (it is a final or stripped one)")
    core = trainer.model_without_ddp
    position = unpack_train_state(state, grads_of=core, model=core, updater=trainer.updater,
                                  stopper=trainer.stopper)
    position, _ = adapt_to_world_size(position, dist.get_world_size())  # logs what changed
    trainer.start_epoch, trainer.start_samples = position.epoch, position.samples_seen
    trainer.saved_position = (position.epoch, position.samples_seen)
    trainer.best_fitness = float(ckpt["best_fitness"])
    trainer.hooks.load_state_dict(ckpt.get("hooks") or {})  # e.g. a tracker's run id: the same tracked run
    if state.get("maps") and len(state["maps"]) == len(trainer.maps):
        trainer.maps = np.array(state["maps"], np.float64)
    trainer.rng_state = rng_state_for(state, dist.get_rank(), dist.get_world_size())
    dropped = trainer.writers.csv.drop_from(position.epoch)  # rows written after this checkpoint, before a crash
    LOGGER.info(f"Resuming from epoch {trainer.start_epoch} of {trainer.opt.epochs}, batch "
                f"{position.step_in_epoch}, in {trainer.save_dir}" +
                (f" (dropped {dropped} later rows of results.csv)" if dropped else ""))


def reload_last_good(trainer: Any, in_a_row: int) -> None:
    """Weights, EMA and optimizer of the last good last.pt (the data position and schedule go on) with every
    group's learning rate halved. Rank 0 reads the file and shares it. All ranks must call it, together."""
    updater = trainer.updater
    initial_lrs = [g["initial_lr"] for g in updater.optimizer.param_groups]
    counters = updater.iteration, updater.steps
    try:
        path, ckpt = shared_checkpoint([trainer.save_dir / "weights" / "last.pt"])
        unpack_train_state(ckpt["train_state"], model=trainer.model_without_ddp, updater=updater)
        source = f"reloaded {path}"
    except (CheckpointError, ResumeError, KeyError):
        source = "no checkpoint to reload yet, weights kept"
    updater.iteration, updater.steps = counters
    updater.forget_pending()  # a fresh accumulation starts with the next batch
    for group, lr in zip(updater.optimizer.param_groups, initial_lrs):
        group["initial_lr"] = lr * 0.5
    LOGGER.warning(f"WARNING: non-finite loss in {in_a_row} steps in a row: {source}; learning rate halved to "
                   f"{initial_lrs[0] * 0.5:g}")
