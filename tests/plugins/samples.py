"""A hook the tests add to training (``train.py --hook 'tests.plugins.samples:TrainedSamples(folder=...)'``):
each rank appends the samples of every step it trained to ``folder/rank<r>.jsonl``, one JSON line a step."""

from __future__ import annotations

import json
from pathlib import Path

from utils.distributed import comm as dist
from utils.hooks import HookBase, StepInfo, TrainerView


class TrainedSamples(HookBase):
    """After each step: {"epoch", "batch", "world", "paths"} appended to this rank's file."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def after_step(self, trainer: TrainerView, step: StepInfo) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        line = {"epoch": step.epoch, "batch": step.batch, "world": dist.get_world_size(), "paths": list(step.paths)}
        with open(self.folder / f"rank{dist.get_rank()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
