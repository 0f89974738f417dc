"""How a run judges itself: the fitness that picks best.pt, and early stopping on it."""

from __future__ import annotations

from typing import Any

import numpy as np

from utils.log import LOGGER


def fitness(result: Any) -> float:
    """0.1 mAP@.5 + 0.9 mAP@.5:.95: how training picks best.pt.

    ``result`` is an EvalResult (or anything with ``map50`` and ``map``) or a sequence [P, R, mAP@.5, mAP@.5:.95].
    """
    if hasattr(result, "map50") and hasattr(result, "map"):
        return 0.1 * float(result.map50) + 0.9 * float(result.map)
    values = np.asarray(result, dtype=np.float64).reshape(-1)
    return 0.1 * float(values[2]) + 0.9 * float(values[3])


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
