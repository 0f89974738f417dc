"""The exact-resume state of a checkpoint: RNG states, the training position, pending gradients, and the
rules for resuming with another number of processes.

Everything here is a tensor or a plain Python type, so checkpoints load with ``weights_only=True``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from utils.distributed import comm as dist
from utils.errors import UserError
from utils.log import LOGGER

TRAIN_STATE_VERSION = 2  # 2: the optimizer's state is stored under 'updater'


class ResumeError(UserError):
    """A resume request that cannot be honoured (missing checkpoint, incompatible world size)."""


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
    scheduler, or utils.training.optim.WeightUpdater that holds them); None objects are skipped. ``grads_of``: also keep
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
