"""A classifier's predictions (the classify task's ``postprocess`` and ``predict`` parts): the classes ranked by
probability, and the top-5 printed, drawn and written.

``postprocess`` (called as utils.tasks.contract.postprocess is) turns the probabilities (b, nc) into per-image rows
(k, 6) [0, 0, 0, 0, probability, class]: every class (of ``classes``, when given), most probable first, at most
``max_det``; a class has no box, so the box columns are 0, and there is nothing to suppress and no threshold (a
classifier's answer is its ranking: ``conf_thres`` and ``iou_thres`` do not apply). detect.py and the hub model read
these rows as any task's; the results per image hold ``top5``, the five most probable (class, probability) pairs.
``draw_topk`` writes one line a class, best first (``name 0.93``), in the image's top-left corner on a dark band;
``topk_lines`` gives lines ``0.93 name``, best first; detect.py's --save-txt writes ``0.93 3`` lines (the probability
and the class index, as label files name classes by index; ultralytics writes the name there) and its log line
lists them as ``name 0.93, ...``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from utils.evaluation.task_outputs import TaskOutputs
from utils.plots.annotate import class_name
from utils.tasks.classify.augment import val_transform
from utils.tasks.contract import OutputContract

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


def postprocess(pred: torch.Tensor, contract: OutputContract, conf_thres: float = 0.25, iou_thres: float = 0.45,
                classes: list[int] | None = None, agnostic: bool = False, multi_label: bool = False,
                max_det: int = 300, max_nms: int = 30000) -> list[torch.Tensor]:
    """Per image the ranked classes as rows (k, 6) (see the module docstring)."""
    order = pred.argsort(dim=1, descending=True, stable=True)  # (b, nc): ties keep the lower class first
    out = []
    for probs, ranked in zip(pred, order):
        if classes is not None:
            ranked = ranked[(ranked[:, None] == torch.tensor(classes, device=ranked.device)).any(1)]
        ranked = ranked[:max_det]
        rows = torch.zeros((len(ranked), 6), dtype=pred.dtype, device=pred.device)
        rows[:, 4], rows[:, 5] = probs[ranked], ranked.to(pred.dtype)
        out.append(rows)
    return out


class ClassifyOutputs(TaskOutputs):
    """``top5`` per image and per frame: the most probable (class, probability) pairs, best first; images fitted as
    validation fits them."""

    def fit_input(self, image: np.ndarray, size: int | tuple[int, int], stride: int = 32,
                  auto: bool = True) -> tuple[np.ndarray, tuple]:
        """Resized and centre-cropped to ``size`` as validation reads a classifier's images (no letterbox: it never
        trained on padding), whatever ``stride`` and ``auto``. Its rows hold no boxes, so the ratio_pad is the
        identity: their zero box columns stay zeros."""
        return val_transform(image, size), ((1.0, 1.0), (0.0, 0.0))

    def input_shape(self, shapes: Sequence[tuple[int, int]], size: int, stride: int = 32) -> tuple[int, int]:
        """``size`` x ``size`` whatever the images' shapes, as validation crops them (the stride does not matter
        after the head's global pooling)."""
        return size, size

    def image(self, rows: torch.Tensor, outputs: tuple, index: int, input_hw: tuple[int, int],
              boxes0: torch.Tensor, shape0: tuple[int, int], ratio_pad: Any, native: bool = False) -> dict[str, Any]:
        return {"top5": [(int(c), float(p)) for p, c in rows[:TOP_K, 4:6].tolist()]}

    def summary(self, results: Mapping[str, Any]) -> dict[str, Any]:
        return {"top5": results["top5"]}

    def describe(self, det: np.ndarray, results: Mapping[str, Any], names: Sequence[str] | None) -> str | None:
        return ", ".join(f"{class_name(names, c)} {p:.2f}" for c, p in results["top5"])

    def draw_labelled(self, img_bgr: np.ndarray, det: np.ndarray, results: Mapping[str, Any],
                      names: Sequence[str] | None, line_thickness: int, hide_labels: bool,
                      hide_conf: bool) -> np.ndarray | None:
        return img_bgr if hide_labels else draw_topk(img_bgr, ranked_probs(results["top5"]), names)

    def label_rows(self, det: np.ndarray, results: Mapping[str, Any], shape: tuple[int, int],
                   save_conf: bool) -> list[str] | None:
        return [f"{p:.2f} {c}" for c, p in results["top5"]]


def ranked_probs(pairs: Sequence[tuple[int, float]]) -> np.ndarray:
    """(class, probability) pairs as a probability vector (the classes not listed at 0)."""
    probs = np.zeros(max((c for c, _ in pairs), default=-1) + 1)
    for c, p in pairs:
        probs[c] = p
    return probs


OUTPUTS = ClassifyOutputs()
