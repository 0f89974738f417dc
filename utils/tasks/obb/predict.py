"""An oriented-box detector's predictions beyond the boxes (the obb task's ``predict`` part): each detection's
oriented box in the original image's pixels, drawn as its four-sided outline in its class colour with a ``name
conf`` tag at its top corner (in place of the enclosing box), and written by --save-txt as ``class x1 y1 x2 y2 x3
y3 x4 y4 [conf]`` rows with the corners normalised to the image (the YOLO-OBB label form, so a detect.py result
reads back as labels).

Here detections are (k, 7) rows [x, y, w, h, r, conf, cls] in the image's pixels; per image the results hold
``rboxes`` (k, 5) xywhr and, per frame, ``quads`` (k, 4, 2): the corners.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from utils.evaluation.task_outputs import TaskOutputs
from utils.plots.annotate import _draw_label, _label_text, class_color
from utils.tasks.obb.postprocess import unletterbox
from utils.tasks.obb.rotated import xywhr2corners


def _rows(det: np.ndarray | torch.Tensor) -> np.ndarray:
    """Detections as a (k, 7) float64 array."""
    rows = det.detach().cpu().double().numpy() if isinstance(det, torch.Tensor) else np.asarray(det, np.float64)
    return rows.reshape(-1, 7)


def detection_corners(det: np.ndarray | torch.Tensor) -> np.ndarray:
    """(k, 7) detections -> (k, 4, 2) float64 corners in pixels."""
    return xywhr2corners(torch.from_numpy(_rows(det)[:, :5].copy())).numpy()


def draw_rotated_boxes(img_bgr: np.ndarray, det: np.ndarray | torch.Tensor, names: Sequence[str] | None = None,
                       line_thickness: int = 2, hide_labels: bool = False, hide_conf: bool = False) -> np.ndarray:
    """Draw (k, 7) detections [x, y, w, h, r, conf, cls] on a uint8 BGR image in place; returns it."""
    rows = _rows(det)
    for quad, conf, cls in zip(detection_corners(rows), rows[:, 5], rows[:, 6].astype(int)):
        color = class_color(cls)
        points = np.round((quad - 0.5) * 16).astype(np.int32)  # pixel centres at +0.5; 1/16 pixel precision
        cv2.polylines(img_bgr, [points], True, color, line_thickness, cv2.LINE_AA, shift=4)
        if not hide_labels:
            top = quad[np.argmin(quad[:, 1])]
            _draw_label(img_bgr, _label_text(int(cls), float(conf), names, hide_conf),
                        (int(round(top[0])), int(round(top[1]))), color, line_thickness)
    return img_bgr


def obb_label_lines(det: np.ndarray | torch.Tensor, shape: tuple[int, int], save_conf: bool = False) -> list[str]:
    """Label rows ``cls x1 y1 ... x4 y4 [conf]`` of (k, 7) detections, corners normalised to an image of ``shape``
    (h, w)."""
    rows = _rows(det)
    corners = detection_corners(rows) / np.array([shape[1], shape[0]], np.float64)
    lines = []
    for quad, conf, cls in zip(corners.reshape(-1, 8), rows[:, 5], rows[:, 6]):
        values = [f"{int(cls)}", *(f"{v:.6g}" for v in quad), *([f"{conf:.6g}"] if save_conf else [])]
        lines.append(" ".join(values))
    return lines


def rotated_detections(det: np.ndarray, results: Mapping[str, Any]) -> np.ndarray:
    """(k, 6+) detections in original pixels and the image's results -> (k, 7) [x, y, w, h, r, conf, cls]."""
    boxes = np.asarray(results["rboxes"], np.float64).reshape(-1, 5)
    return np.concatenate((boxes, np.asarray(det, np.float64)[:, 4:6]), 1)


class ObbOutputs(TaskOutputs):
    """``rboxes`` per image (its detections' oriented boxes in original pixels), ``quads`` per frame."""

    def image(self, rows: torch.Tensor, outputs: tuple, index: int, input_hw: tuple[int, int],
              boxes0: torch.Tensor, shape0: tuple[int, int], ratio_pad: Any, native: bool = False) -> dict[str, Any]:
        if ratio_pad is None:  # the letterbox of an image of shape0 into input_hw, as scale_boxes computes it
            gain = min(input_hw[0] / shape0[0], input_hw[1] / shape0[1])
            ratio_pad = ((gain, gain), ((input_hw[1] - shape0[1] * gain) / 2, (input_hw[0] - shape0[0] * gain) / 2))
        return {"rboxes": unletterbox(rows[:, 6:11].detach().cpu().double(), ratio_pad).float()}

    def summary(self, results: Mapping[str, Any]) -> dict[str, Any]:
        return {"quads": detection_corners(np.concatenate((np.asarray(results["rboxes"], np.float64).reshape(-1, 5),
                                                           np.zeros((len(results["rboxes"]), 2))), 1))}

    def draw_labelled(self, img_bgr: np.ndarray, det: np.ndarray, results: Mapping[str, Any],
                      names: Sequence[str] | None, line_thickness: int, hide_labels: bool,
                      hide_conf: bool) -> np.ndarray | None:
        return draw_rotated_boxes(img_bgr, rotated_detections(det, results), names, line_thickness, hide_labels,
                                  hide_conf)

    def label_rows(self, det: np.ndarray, results: Mapping[str, Any], shape: tuple[int, int],
                   save_conf: bool) -> list[str] | None:
        return obb_label_lines(rotated_detections(det, results), shape, save_conf)


OUTPUTS = ObbOutputs()
