"""What changes during a run, in one object (TrainState) that every checkpoint saves and a resume restores: the
position (epoch in progress, samples of it seen), the best fitness, the per-class mAPs and every rank's RNG states.

Everything here is a tensor or a plain Python type, so checkpoints load with ``weights_only=True``. How a checkpoint
is packed, checked and adapted to another number of processes is in utils/training/resume.py.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

from utils.distributed import comm as dist


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


@dataclass
class TrainState:
    """What changes during a run: where it stands (``position``: epoch in progress, samples of it seen, and the
    batch geometry), the best fitness so far, the per-class mAPs of the last validation (for --image-weights), the
    RNG state to restore before the first resumed batch, and the position of the last last.pt written.

    ``state_dict()`` is the run's part of a checkpoint's ``train_state``; ``load_state_dict()`` puts it back (with
    the position already adapted to this world size, see utils.training.resume.adapt_to_world_size)."""

    position: TrainPosition = field(default_factory=TrainPosition)
    best_fitness: float = 0.0
    maps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rng: dict[str, Any] | None = None  # this rank's saved RNG state, until the first resumed batch restores it
    saved_position: tuple[int, int] | None = None  # (epoch, samples seen) of the last last.pt written
    resumed: bool = False  # the run continues a checkpoint
    batch_offset: int = 0  # batches of the current epoch done before this process started it

    @property
    def epoch(self) -> int:
        return self.position.epoch

    @property
    def samples_seen(self) -> int:
        return self.position.samples_seen

    def advance(self, epoch: int, samples_seen: int) -> None:
        """Training reached ``samples_seen`` samples (all ranks) of ``epoch``."""
        self.position = replace(self.position, epoch=epoch, samples_seen=samples_seen)

    def state_dict(self) -> dict[str, Any]:
        """The position, best fitness, maps and every rank's RNG states (gathered: all ranks must call it)."""
        return {"position": asdict(self.position), "rng": gather_rng_states(), "best_fitness": self.best_fitness,
                "maps": [float(v) for v in self.maps]}

    def load_state_dict(self, state: dict[str, Any], position: TrainPosition | None = None) -> None:
        """Continue from a checkpoint's ``train_state`` (``position``: its position adapted to this world size)."""
        self.position = position or TrainPosition(**state["position"])
        self.best_fitness = float(state.get("best_fitness", self.best_fitness))
        if state.get("maps") and len(state["maps"]) == len(self.maps):
            self.maps = np.array(state["maps"], np.float64)
        self.rng = rng_state_for(state, dist.get_rank(), dist.get_world_size())
        self.saved_position = (self.position.epoch, self.position.samples_seen)
        self.resumed = True
