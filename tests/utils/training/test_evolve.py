"""Hyperparameter evolution: mutations stay within bounds and change something."""

from __future__ import annotations

import numpy as np

from utils.hyp import load_hyp
from utils.training.evolve import EVOLVE_BOUNDS, mutate


def test_mutate_stays_within_bounds_and_changes_something() -> None:
    base = load_hyp()
    rng = np.random.default_rng(0)
    history = [(0.1, base)]
    for _ in range(20):
        child = mutate(base, history, rng)
        assert child != base and set(child) == set(base)
        for key, (_, low, high) in EVOLVE_BOUNDS.items():
            assert low <= child[key] <= high
        history.append((float(rng.random()), child))
    assert mutate(base, [], rng) == base  # no history yet: the base itself
