"""Early stopping: end a run whose fitness has not improved for --patience epochs."""

from __future__ import annotations

from typing import Any

from utils.log import LOGGER


class EarlyStopping:
    """Stop when fitness has not improved for ``patience`` epochs (0 or less: never)."""

    def __init__(self, patience: int = 100) -> None:
        self.patience = patience if patience > 0 else float("inf")
        self.best_fitness, self.best_epoch = 0.0, 0

    def __call__(self, epoch: int, fitness: float) -> bool:
        if fitness >= self.best_fitness:
            self.best_fitness, self.best_epoch = fitness, epoch
        stop = epoch - self.best_epoch >= self.patience
        if stop:
            LOGGER.info(f"Stopping early: no improvement in the last {self.patience} epochs; the best was epoch "
                        f"{self.best_epoch}. Change the limit with --patience (0 = never stop).")
        return stop

    def state_dict(self) -> dict[str, Any]:
        return {"best_fitness": self.best_fitness, "best_epoch": self.best_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_fitness = float(state.get("best_fitness", 0.0))
        self.best_epoch = int(state.get("best_epoch", 0))
