"""Resuming a run: what a checkpoint's ``train_state`` holds and how it is checked, which generation of last.pt
to resume (the previous one when last.pt is damaged), the options a resumed run keeps, and the rules for resuming
with another number of processes.

Every run keeps two generations of its training state, ``weights/last.pt`` and ``weights/last.prev.pt`` (the one
before; utils/training/checkpointer.py rotates them). A resume (--resume, an elastic restart, a requeued Slurm
job) reads last.pt and, when it is damaged or has no training state, the previous generation, with one warning.
best.pt is never a fallback: it has no training state. Everything here is a tensor or a plain Python type, so
checkpoints load with ``weights_only=True``.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from utils.distributed import comm as dist
from utils.errors import UserError
from utils.log import LOGGER
from utils.loggers.results_csv import read_rows
from utils.training.config import RunConfig
from utils.training.fitness import fitness
from utils.training.train_state import TrainPosition
from utils.weights.checkpoint import CheckpointError, load_checkpoint, load_first_good
from utils.weights.downloads import attempt_download, is_release_name

TRAIN_STATE_VERSION = 2  # 2: the optimizer's state is stored under 'updater'
LAST, PREVIOUS = "last.pt", "last.prev.pt"  # the two generations of a run's training state, newest first


class ResumeError(UserError):
    """A resume request that cannot be honoured (missing or damaged checkpoint, incompatible world size)."""


# ------------------------------------------------------------------------------- the train_state of a checkpoint
def pack_train_state(run: dict[str, Any], grads_of: torch.nn.Module | None = None, **stateful: Any) -> dict:
    """The ``train_state`` entry of a checkpoint: the run's state (TrainState.state_dict(): position, RNG states,
    best fitness, maps) and ``obj.state_dict()`` of every keyword object (optimizer, EMA, scaler, scheduler, or
    utils.training.optim.WeightUpdater that holds them); None objects are skipped. ``grads_of``: also keep the
    gradients accumulated so far, for a checkpoint taken between optimizer steps of an accumulation."""
    state = {"version": TRAIN_STATE_VERSION, **run,
             "states": {name: obj.state_dict() for name, obj in stateful.items() if obj is not None}}
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
        param.grad = None if grad is None else torch.empty_like(param).copy_(grad)  # the parameter's layout


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


# ------------------------------------------------------------------------------ which checkpoint a resume reads
def generations(checkpoint: Path) -> list[Path]:
    """``.../last.pt`` -> [last.pt, last.prev.pt]: the checkpoints a resume may read, newest first (any other file:
    itself only)."""
    checkpoint = Path(checkpoint)
    return [checkpoint, checkpoint.with_name(PREVIOUS)] if checkpoint.name == LAST else [checkpoint]


def load_resumable(checkpoint: Path, trusted: bool = False) -> tuple[Path, dict]:
    """The newest generation of ``checkpoint`` that loads and holds training state, with one warning when that is
    not ``checkpoint`` itself. Raises ResumeError naming every reason when none does. Rank 0 only."""
    reasons = []
    for path in generations(checkpoint):
        if not path.is_file():
            continue
        try:
            ckpt = load_checkpoint(path, trusted=trusted)
        except CheckpointError as e:
            reasons.append(str(e))
            continue
        state = ckpt.get("train_state")
        if not isinstance(state, dict) or state.get("version") != TRAIN_STATE_VERSION:
            reasons.append(f"{path} has no training state (it is a final or stripped checkpoint)")
            continue
        if path != checkpoint:
            LOGGER.warning(f"WARNING: {reasons[-1] if reasons else f'{checkpoint} is missing'}; resuming from the "
                           f"previous generation {path} (the last save before it is lost)")
        return path, ckpt
    raise ResumeError(f"--resume: no checkpoint to resume from: {'; '.join(reasons) or f'{checkpoint} not found'}")


def shared_resumable(checkpoint: Path, trusted: bool = False) -> tuple[Path, dict]:
    """load_resumable on rank 0, shared with every rank. All ranks must call it."""
    return dist.main_decides(lambda: load_resumable(checkpoint, trusted))


# Options a resumed run takes from its command line rather than from the checkpoint. True: always (they describe
# this machine and launch, not the run); False: when given on the command line (else the checkpoint's value).
RUNTIME_OPTIONS: dict[str, bool] = {
    "resume": True, "device": True, "backend": True, "trust_weights": True, "local_rank": True, "hook": True,
    "workers": False, "ddp_timeout": False, "ddp_long_timeout": False, "save_interval_steps": False,
    "save_interval_minutes": False, "exist_ok": False, "amp": False, "channels_last": False, "colour_on": False,
    "compile": False,
    "data": False,  # each machine may keep the data elsewhere
    "loggers": False, "tracker_timeout": False,
}


def resume_options(config: RunConfig, saved_opt: dict, defaults: RunConfig) -> RunConfig:
    """The checkpoint's options, except the runtime ones (see RUNTIME_OPTIONS) that ``config`` keeps; ``defaults``
    (the parser's) tell which were given on the command line. Options the checkpoint lacks (added since) keep
    their current values. Other options given on the command line with another value than the run's are named in
    one warning: the run goes on with its own."""
    current, default = config.options(), defaults.options()
    keep = {k for k, always in RUNTIME_OPTIONS.items() if always or current.get(k) != default.get(k)}
    taken = {k: v for k, v in saved_opt.items() if k in current and k not in keep}
    ignored = [f"--{k.replace('_', '-')} {current[k]} (the run's: {v})" for k, v in taken.items()
               if current[k] != default.get(k) and current[k] != v]
    if ignored:
        LOGGER.warning(f"WARNING: --resume continues the run with the options it started with; ignored: "
                       f"{', '.join(ignored)[:400]}")
    current.update(taken)
    return RunConfig.from_options(current)


def shared_checkpoint(paths: list[str | Path], trusted: bool = False) -> tuple[Path, dict]:
    """Rank 0 loads the first whole checkpoint of ``paths`` (a YOLOv5 release name such as yolov5s.pt is downloaded
    first when it is not on disk) and sends it to every rank, so no other node needs to see the file. A UserError on
    every rank when none loads. All ranks must call it."""
    def local(path: str | Path) -> Path:  # a release name not on disk is fetched; other paths stay as they are
        return attempt_download(path) if is_release_name(path) and not Path(path).is_file() else Path(path)

    return dist.main_decides(lambda: load_first_good([local(p) for p in paths], trusted=trusted))


class RunFinished(Exception):
    """``--resume`` of a run that trained all its epochs: nothing is left to train. ``message`` says so with its
    best epoch's metrics; ``metrics`` are its last epoch's (precision, recall, mAP_0.5, ...), as training returns."""

    def __init__(self, message: str, metrics: dict[str, float], save_dir: Path, hyp: dict) -> None:
        super().__init__(message)
        self.message, self.metrics, self.save_dir, self.hyp = message, metrics, save_dir, hyp


def check_unfinished(ckpt: dict, config: RunConfig, save_dir: Path) -> None:
    """RunFinished when the resumed checkpoint ``ckpt`` is past its run's last epoch; its metrics from the run's
    results.csv, read by rank 0 (the run folder is on its machine). All ranks must call it."""
    position = (ckpt.get("train_state") or {}).get("position") or {}
    epoch = int(position.get("epoch", 0))
    if epoch < config.epochs:
        return
    rows = dist.main_decides(lambda: read_rows(save_dir / "results.csv"))
    metrics = {k.removeprefix("metrics/"): v for k, v in (rows[-1] if rows else {}).items()
               if k.startswith("metrics/")}
    best = max(rows, key=fitness, default=None) if rows and "metrics/mAP_0.5" in rows[0] else None
    scores = f"; best epoch {int(best['epoch'])}: mAP@.5 {best['metrics/mAP_0.5']:.4g}, mAP@.5:.95 " \
        f"{best['metrics/mAP_0.5:0.95']:.4g} (weights/best.pt)" if best else ""
    raise RunFinished(f"{save_dir} is finished: it trained all {config.epochs} epochs{scores}. To train on, start a "
                      f"new run from its weights: --weights {save_dir / 'weights' / 'last.pt'} --epochs N",
                      metrics, save_dir, dict(ckpt.get("hyp") or {}))
