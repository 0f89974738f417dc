"""A classifier's results on images and in label files: the top-5 classes with their probabilities.

``draw_topk`` writes one line a class, best first (``name 0.93``), in the image's top-left corner on a dark band;
``topk_lines`` gives the label file's lines, ``0.93 name`` (ultralytics' ``--save-txt`` form for a classifier),
best first.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from utils.plots.annotate import class_name

TOP_K = 5


def topk(probs: np.ndarray | Sequence[float], k: int = TOP_K) -> list[tuple[int, float]]:
    """(class, probability) of the ``k`` most probable classes, best first (ties: the lower class first)."""
    values = np.asarray(probs, dtype=np.float64).reshape(-1)
    order = np.argsort(-values, kind="stable")[:k]
    return [(int(c), float(values[c])) for c in order]


def topk_lines(probs: np.ndarray | Sequence[float], names: Sequence[str] | None = None, k: int = TOP_K) -> list[str]:
    """The label file's lines: ``probability name`` for the top ``k`` classes, best first."""
    return [f"{p:.2f} {class_name(names, c)}" for c, p in topk(probs, k)]


def draw_topk(img_bgr: np.ndarray, probs: np.ndarray | Sequence[float], names: Sequence[str] | None = None,
              k: int = TOP_K, line_thickness: int | None = None) -> np.ndarray:
    """Write the top ``k`` classes (``name probability``) on a uint8 BGR image in place, top-left; returns it. The
    text's size follows ``line_thickness`` (default: 0.3 % of the image's mean side, at least 1)."""
    if line_thickness is None:
        line_thickness = max(round(sum(img_bgr.shape[:2]) / 2 * 0.003), 1)
    font_scale = max(line_thickness / 3, 0.35)
    font_thickness = max(line_thickness - 1, 1)
    x, y = 4, 4
    for c, p in topk(probs, k):
        text = f"{class_name(names, c)} {p:.2f}"
        (tw, th), baseline = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font_scale, font_thickness)
        cv2.rectangle(img_bgr, (x - 2, y - 2), (x + tw + 2, y + th + baseline + 2), (32, 32, 32), -1)
        cv2.putText(img_bgr, text, (x, y + th), cv2.FONT_HERSHEY_SIMPLEX, font_scale, (255, 255, 255),
                    font_thickness, cv2.LINE_AA)
        y += th + baseline + 6
    return img_bgr
