"""How a run judges itself: the fitness that picks best.pt (and that early stopping watches)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def fitness(result: Any) -> float:
    """0.1 mAP@.5 + 0.9 mAP@.5:.95: how training picks best.pt (a segmenter's row adds the same of its masks).

    ``result`` is an EvalResult (or anything with ``map50`` and ``map``), an epoch's results.csv row by column name
    (the ``metrics`` of ``after_epoch``) or a sequence [P, R, mAP@.5, mAP@.5:.95].
    """
    if isinstance(result, Mapping):
        value = 0.1 * float(result["metrics/mAP_0.5"]) + 0.9 * float(result["metrics/mAP_0.5:0.95"])
        if "metrics/mask_mAP_0.5:0.95" in result:
            value += 0.1 * float(result["metrics/mask_mAP_0.5"]) + 0.9 * float(result["metrics/mask_mAP_0.5:0.95"])
        return value
    if hasattr(result, "map50") and hasattr(result, "map"):
        return 0.1 * float(result.map50) + 0.9 * float(result.map)
    values = np.asarray(result, dtype=np.float64).reshape(-1)
    return 0.1 * float(values[2]) + 0.9 * float(values[3])
