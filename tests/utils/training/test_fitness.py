"""Fitness: how best.pt is picked, from an EvalResult, a results.csv row by column or a sequence."""

from __future__ import annotations

import pytest

from utils.training.fitness import fitness


def test_fitness_weights() -> None:
    assert fitness([0.3, 0.4, 0.5, 0.2]) == pytest.approx(0.1 * 0.5 + 0.9 * 0.2)

    class Result:
        map50, map = 0.6, 0.4

    assert fitness(Result()) == pytest.approx(0.42)
    row = {"train/box_loss": 9.0, "metrics/precision": 0.3, "metrics/recall": 0.4, "metrics/mAP_0.5": 0.5,
           "metrics/mAP_0.5:0.95": 0.2, "x/lr0": 0.01}
    assert fitness(row) == pytest.approx(0.1 * 0.5 + 0.9 * 0.2)
