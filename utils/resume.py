"""Exact resume: RNG states, the training position, the run folder across elastic restarts, world-size changes.

How a run folder survives a torchrun restart: the first attempt's rank 0 picks the folder
(``runs/train/exp{N}``) and records it in torchrun's agent store (``utils.dist.job_store()``),
which lives as long as the torchrun job and is shared by all ranks and nodes. When the agent
restarts the group (``TORCHELASTIC_RESTART_COUNT`` > 0), rank 0 reads the folder back from the
store and the run continues from its ``weights/last.pt``, with no ``--resume`` flag. A new
torchrun job has a new store, so it never picks up another job's folder. Without an agent store
(not launched by torchrun) a restart cannot be recognised and the run starts a new folder.

Everything a checkpoint holds here is a tensor or a plain Python type (``weights_only=True``).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from utils import dist
from utils.errors import UserError
from utils.logging import LOGGER
from utils.paths import increment_path

TRAIN_STATE_VERSION = 1
RUN_DIR_KEY = "run_dir"  # key in the job store (utils.dist.job_store) naming this job's run folder


class ResumeError(UserError):
    """A resume request that cannot be honoured (missing checkpoint, incompatible world size)."""


# ---------------------------------------------------------------------------------------------- RNG states
def capture_rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA RNG states as tensors and plain types."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {
        "python": {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": [s.cpu() for s in cuda],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back RNG states captured by capture_rng_state (CUDA states only for the GPUs both runs have)."""
    try:
        py, nps = state["python"], state["numpy"]
        random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
        np.random.set_state((nps["kind"], nps["keys"].numpy().astype(np.uint32), nps["pos"], nps["has_gauss"],
                             nps["cached_gaussian"]))
        torch.set_rng_state(state["torch"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ResumeError(f"the checkpoint's RNG state is incomplete or malformed ({e}); it cannot resume exactly") \
            from None
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        count = min(len(cuda), torch.cuda.device_count())
        if count != len(cuda) or count != torch.cuda.device_count():
            LOGGER.warning(f"WARNING: checkpoint holds CUDA RNG states for {len(cuda)} GPUs, this process sees "
                           f"{torch.cuda.device_count()}; restoring the first {count}")
        for index in range(count):
            torch.cuda.set_rng_state(cuda[index], index)


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order (one entry when not distributed). All ranks must call it."""
    return dist.all_gather_object(capture_rng_state())


def rng_state_for(train_state: dict, rank: int, world_size: int) -> dict[str, Any] | None:
    """The RNG state rank ``rank`` should restore: its own when the world size is unchanged, rank 0's state
    for rank 0 otherwise, and None (keep the fresh per-rank seed) for the other ranks of a resized job."""
    states = train_state.get("rng") or []
    if len(states) == world_size:
        return states[rank]
    return states[0] if rank == 0 and states else None


# ------------------------------------------------------------------------------------- training position
@dataclass(frozen=True)
class TrainPosition:
    """Where training stands: the epoch in progress and the samples (all ranks together) consumed in it,
    plus the batch geometry that produced it. ``samples_seen == 0`` means the epoch has not started."""

    epoch: int = 0
    samples_seen: int = 0
    batch_size: int = 64  # total over all ranks
    world_size: int = 1
    accumulate: int = 1
    nominal_batch: int = 64

    @property
    def step_in_epoch(self) -> int:
        """Batches of the epoch already done (the sampler's ``set_start(samples_seen)`` skips them)."""
        return self.samples_seen // max(self.batch_size, 1)


def pack_train_state(position: TrainPosition, rng_states: list[dict] | None = None,
                     grads_of: torch.nn.Module | None = None, **stateful: Any) -> dict:
    """The ``train_state`` entry of a checkpoint: the position, RNG states (this process's when
    ``rng_states`` is None) and ``obj.state_dict()`` of every keyword object (optimizer, EMA, scaler,
    scheduler, or utils.optim.Stepper that holds them); None objects are skipped. ``grads_of``: also keep
    the gradients accumulated so far, for a checkpoint taken between optimizer steps of an accumulation."""
    state = {
        "version": TRAIN_STATE_VERSION,
        "position": asdict(position),
        "rng": rng_states if rng_states is not None else [capture_rng_state()],
        "states": {name: obj.state_dict() for name, obj in stateful.items() if obj is not None},
    }
    if grads_of is not None:
        state["grads"] = [p.grad.detach().cpu().clone() if p.grad is not None else None
                          for p in grads_of.parameters()]
    return state


def unpack_train_state(train_state: dict, grads_of: torch.nn.Module | None = None, **stateful: Any) \
        -> TrainPosition:
    """Load each keyword object's state (and the pending gradients into ``grads_of``) from a ``train_state``
    and return the saved position.

    RNG states are not restored here: call ``restore_rng_state(rng_state_for(...))`` just before the
    first resumed step, after everything that draws random numbers at set-up.
    """
    if not isinstance(train_state, dict) or train_state.get("version") != TRAIN_STATE_VERSION:
        found = train_state.get("version") if isinstance(train_state, dict) else type(train_state).__name__
        raise ResumeError(f"checkpoint train_state has version {found}, expected {TRAIN_STATE_VERSION}; "
                          "it cannot resume training (use it as --weights to start a new run)")
    saved = train_state.get("states", {})
    for name, obj in stateful.items():
        if obj is None:
            continue
        if name not in saved:
            raise ResumeError(f"checkpoint train_state has no '{name}' state (it holds {sorted(saved)}); "
                              "it cannot resume training (use it as --weights to start a new run)")
        obj.load_state_dict(saved[name])
    if grads_of is not None and train_state.get("grads") is not None:
        _restore_grads(grads_of, train_state["grads"])
    return TrainPosition(**train_state["position"])


def _restore_grads(module: torch.nn.Module, grads: list[torch.Tensor | None]) -> None:
    params = list(module.parameters())
    if len(params) != len(grads):
        raise ResumeError(f"checkpoint holds gradients for {len(grads)} parameters, the model has {len(params)}")
    for param, grad in zip(params, grads, strict=True):
        param.grad = None if grad is None else grad.to(param.device, param.dtype).clone()


def adapt_to_world_size(position: TrainPosition, world_size: int, requested_batch: int | None = None) \
        -> tuple[TrainPosition, list[str]]:
    """Rules for resuming with a different number of processes, and the log of what changed.

    Kept: the total batch, the accumulation to the nominal batch, the LR-schedule position and the
    global sample position (the sampler's order depends only on (seed, epoch)). Changed: the batch
    per process. Raises ResumeError when the total batch does not divide by the new world size.
    """
    total = position.batch_size
    if total % world_size:
        raise ResumeError(f"the checkpoint's total batch {total} cannot be split over {world_size} processes; "
                          f"resume with a process count that divides {total}")
    changes = []
    if requested_batch is not None and requested_batch != total:
        changes.append(f"--batch-size {requested_batch} ignored: a resumed run keeps its total batch {total}")
    if world_size != position.world_size:
        changes.append(f"processes {position.world_size} -> {world_size}, batch per process "
                       f"{total // position.world_size} -> {total // world_size}")
    if changes:
        LOGGER.info(f"Resume: {'; '.join(changes)}; kept total batch {total}, accumulation {position.accumulate} "
                    f"to nominal batch {position.nominal_batch}, LR schedule at epoch {position.epoch} "
                    f"step {position.step_in_epoch}")
    return replace(position, world_size=world_size), changes


class SaveInterval:
    """When to write a mid-epoch ``last.pt``: every ``steps`` training steps (batches) and/or every
    ``minutes`` (measured on rank 0 and shared, so all ranks agree). Both 0: never mid-epoch.
    Any batch boundary will do: ``pack_train_state(grads_of=...)`` keeps gradients still accumulating."""

    def __init__(self, steps: int = 0, minutes: float = 0.0, clock: Any = time.monotonic) -> None:
        self.steps, self.seconds, self.clock = int(steps), float(minutes) * 60.0, clock
        self.last_time = clock()

    def due(self, steps_done: int) -> bool:
        """True when a checkpoint is due after ``steps_done`` batches in total; all ranks must call it
        after the same batches (it is a collective when ``minutes`` is set)."""
        by_steps = self.steps > 0 and steps_done > 0 and steps_done % self.steps == 0
        by_time = False
        if self.seconds > 0:
            by_time = dist.any_rank(dist.is_main_process() and self.clock() - self.last_time >= self.seconds)
        if by_steps or by_time:
            self.last_time = self.clock()
        return by_steps or by_time


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


def recorded_run_dir() -> Path | None:
    """The run folder an earlier attempt of this torchrun job recorded, if any."""
    store = dist.job_store()
    if store is None or not store.check([RUN_DIR_KEY]):
        return None
    return Path(store.get(RUN_DIR_KEY).decode())


def record_run_dir(save_dir: Path) -> None:
    """Remember the run folder for later attempts of this torchrun job (no-op outside torchrun)."""
    store = dist.job_store()
    if store is not None:
        store.set(RUN_DIR_KEY, str(Path(save_dir).resolve()))


def latest_checkpoint(search_dir: str | Path) -> Path | None:
    """The most recently written ``last.pt`` under ``search_dir`` (for a bare ``--resume``)."""
    found = list(Path(search_dir).glob("**/last.pt"))
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def find_resume_checkpoint(opt: argparse.Namespace) -> Path | None:
    """The checkpoint to resume from: after an elastic restart, this job's ``last.pt`` (best.pt when only
    that exists; None when the first attempt saved nothing, so the run starts again in its folder);
    otherwise ``--resume PATH`` (a file or run folder), a bare ``--resume`` (the latest last.pt under
    ``--project``), or None. Raises ResumeError when an asked-for checkpoint is missing."""
    if dist.restart_count() > 0:
        run_dir = recorded_run_dir()
        if run_dir is not None:
            weights = run_dir / "weights"
            return next((p for p in (weights / "last.pt", weights / "best.pt") if p.is_file()), None)
        LOGGER.warning("WARNING: elastic restart without an agent store: the earlier attempt's run folder is "
                       "unknown, so this attempt starts a new run")
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

    Precedence: the folder recorded by an earlier attempt of this torchrun job, then the folder of the
    ``--resume`` checkpoint, then a new ``--project/--name`` folder (incremented unless ``--exist-ok``).
    Rank 0 creates the folder and records it for later attempts. All ranks must call it.
    """
    plan: tuple = ("error", "rank 0 did not decide the run folder")
    if dist.is_main_process():
        try:
            plan = _decide_run(opt)
        except UserError as e:  # shared, so every rank stops with the same message instead of waiting
            plan = ("error", str(e))
    plan = dist.broadcast_object(plan)
    if plan[0] == "error":
        raise ResumeError(plan[1])
    _, save_dir, resume_from, reason = plan
    return RunPlan(Path(save_dir), Path(resume_from) if resume_from else None, reason)


def _decide_run(opt: argparse.Namespace) -> tuple[str, str, str | None, str]:
    """Rank 0's half of plan_run: ('ok', save_dir, resume_from or None, reason)."""
    resume_from = find_resume_checkpoint(opt)
    recorded = recorded_run_dir() if dist.restart_count() > 0 else None
    if recorded is not None:
        save_dir, reason = recorded, f"elastic restart {dist.restart_count()}"
    elif resume_from is not None:
        save_dir, reason = run_dir_of(resume_from), "--resume"
    else:
        save_dir = increment_path(Path(opt.project) / opt.name, exist_ok=bool(getattr(opt, "exist_ok", False)))
        reason = "new run"
    save_dir.mkdir(parents=True, exist_ok=True)
    record_run_dir(save_dir)
    return "ok", str(save_dir), str(resume_from) if resume_from else None, reason


# Options a resumed run takes from the command line rather than from the checkpoint.
RUNTIME_OPTIONS = ("resume", "device", "workers", "backend", "ddp_timeout", "trust_weights", "local_rank",
                   "save_interval_steps", "save_interval_minutes", "exist_ok")


def resume_options(opt: argparse.Namespace, saved_opt: dict, keep: tuple[str, ...] = RUNTIME_OPTIONS) \
        -> argparse.Namespace:
    """The checkpoint's options, with the runtime ones (device, workers, ...) kept from ``opt``; options
    the checkpoint lacks (added since) keep their current values."""
    merged = dict(vars(opt))
    merged.update({k: v for k, v in saved_opt.items() if k in merged and k not in keep})
    return argparse.Namespace(**merged)
