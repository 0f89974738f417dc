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


def test_a_segmenter_has_one_fitness_everywhere() -> None:
    """best.pt (the epoch's results.csv row), --evolve (the run's named metrics) and an EvalResult give a segmenter
    the same fitness: the boxes' and the masks' 0.1 mAP@.5 + 0.9 mAP@.5:.95."""
    named = {"precision": 0.3, "recall": 0.4, "mAP_0.5": 0.5, "mAP_0.5:0.95": 0.2, "mask_precision": 0.1,
             "mask_recall": 0.2, "mask_mAP_0.5": 0.4, "mask_mAP_0.5:0.95": 0.3}
    row = {"train/box_loss": 1.0, **{f"metrics/{k}": v for k, v in named.items()}, "x/lr0": 0.01}

    class Result:
        def named_results(self) -> dict[str, float]:
            return named

    expected = 0.1 * 0.5 + 0.9 * 0.2 + 0.1 * 0.4 + 0.9 * 0.3
    assert fitness(named) == pytest.approx(expected) and fitness(row) == pytest.approx(expected)
    assert fitness(Result()) == pytest.approx(expected)
