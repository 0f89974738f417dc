"""Drawing keypoints on images: each object's skeleton (lines between keypoint pairs) and its keypoints as dots, for
detect.py, the batch mosaics and the validation plots (OpenCV, BGR, in place).

A keypoint is drawn when it is labelled (v > 0) or, for a prediction, when its visibility score reaches
``threshold``, and when it lies inside the image; a limb when both its ends are. Keypoints take colours of the
class palette by keypoint index (so a left-right pair is told apart), limbs their object's class colour. Without a
skeleton (a data set that names none), the dots alone are drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from utils.plots.annotate import class_color

DEFAULT_THRESHOLD = 0.5  # a predicted keypoint's visibility score needed to draw it


def shown_keypoints(keypoints: np.ndarray, shape: tuple[int, int], threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
    """Which keypoints (k, K, 2 or 3) pixels are drawn on an image of ``shape`` (h, w): bool (k, K)."""
    points = np.asarray(keypoints, dtype=np.float64)
    h, w = shape[:2]
    inside = (points[..., 0] >= 0) & (points[..., 0] < w) & (points[..., 1] >= 0) & (points[..., 1] < h)
    if points.shape[-1] > 2:
        inside &= (points[..., 2] >= threshold) & (points[..., 2] > 0)
    return inside


def draw_keypoints(img_bgr: np.ndarray, keypoints: np.ndarray | Sequence, classes: np.ndarray | Sequence | None = None,
                   skeleton: Sequence[Sequence[int]] = (), threshold: float = DEFAULT_THRESHOLD, radius: int = 0,
                   line_thickness: int = 0) -> np.ndarray:
    """Draw keypoints (k, K, 2 or 3) in the image's pixels, with ``skeleton`` pairs (0-based) as lines in each
    object's class colour, on a uint8 BGR image in place; returns it. ``radius`` and ``line_thickness`` default
    to the image's size (1/160 and 1/320 of its longer side, at least 1 and 2)."""
    points = np.asarray(keypoints, dtype=np.float64)
    if points.size == 0:
        return img_bgr
    points = points.reshape(-1, *points.shape[-2:])
    longer = max(img_bgr.shape[:2])
    radius = radius or max(2, round(longer / 160))
    thickness = line_thickness or max(1, round(longer / 320))
    classes = np.zeros(len(points), np.int64) if classes is None else np.asarray(classes).astype(np.int64)
    shown = shown_keypoints(points, img_bgr.shape[:2], threshold)
    for object_points, object_shown, cls in zip(points, shown, classes):
        for a, b in skeleton:
            if object_shown[a] and object_shown[b]:
                start = (int(round(object_points[a, 0])), int(round(object_points[a, 1])))
                end = (int(round(object_points[b, 0])), int(round(object_points[b, 1])))
                cv2.line(img_bgr, start, end, class_color(int(cls)), thickness, cv2.LINE_AA)
        for k in np.nonzero(object_shown)[0]:
            centre = (int(round(object_points[k, 0])), int(round(object_points[k, 1])))
            cv2.circle(img_bgr, centre, radius, class_color(int(k) + 7), -1, cv2.LINE_AA)
    return img_bgr
