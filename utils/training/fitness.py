"""How a run judges itself: the fitness that picks best.pt, that early stopping watches and that --evolve ranks, one
answer everywhere: the validation columns weighed as the task whose columns they are says (utils/tasks/registry.py,
``Task.fitness``: 0.1 mAP@.5 + 0.9 mAP@.5:.95 of the boxes, plus the same of a segmenter's masks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from utils.tasks.registry import BOX_METRICS, fitness_weights


def fitness(result: Any) -> float:
    """The weighted sum of the validation columns ``result`` holds, by the fitness weights of the task they are.

    ``result`` is an EvalResult (its ``named_results``; anything with ``map50`` and ``map``), columns by name (an
    epoch's results.csv row, the ``metrics`` of ``after_epoch``, whose ``metrics/<name>`` keys count; or bare
    names, as --evolve's metrics) or a sequence [P, R, mAP@.5, mAP@.5:.95].
    """
    if hasattr(result, "named_results"):
        result = result.named_results()
    elif hasattr(result, "map50") and hasattr(result, "map"):
        result = {"mAP_0.5": result.map50, "mAP_0.5:0.95": result.map}
    if not isinstance(result, Mapping):
        result = dict(zip(BOX_METRICS, np.asarray(result, dtype=np.float64).reshape(-1).tolist()))
    values = {str(k).removeprefix("metrics/"): v for k, v in result.items()
              if "/" not in str(k) or str(k).startswith("metrics/")}
    weights = fitness_weights(values)
    return float(sum(weight * float(values[name]) for name, weight in weights.items() if name in values))
