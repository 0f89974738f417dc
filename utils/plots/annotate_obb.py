"""Oriented boxes on images and in label files: each box drawn as its four-sided outline in its class colour with
a ``name conf`` tag at its top corner, and written as ``class x1 y1 x2 y2 x3 y3 x4 y4 [conf]`` rows with the
corners normalised to the image (the YOLO-OBB label form, so a detect.py result reads back as labels).

Detections are (k, 7) rows [x, y, w, h, r, conf, cls] in the image's pixels (utils/geometry/rotated.py's NMS).
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from utils.geometry.rotated import xywhr2corners
from utils.plots.annotate import _draw_label, _label_text, class_color


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
