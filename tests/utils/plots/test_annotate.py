"""Drawing boxes and labels: colours per class, names and numbers, drawn in place."""

from __future__ import annotations

import numpy as np

from utils.plots.annotate import class_color, class_name, draw_detections

NAMES = ["circle", "square", "triangle"]


def test_draw_detections_in_place() -> None:
    img = np.zeros((64, 64, 3), np.uint8)
    out = draw_detections(img, [[10, 10, 40, 40]], [1], [0.9], NAMES)
    assert out is img
    assert tuple(img[10, 25]) == class_color(1)  # top edge in the class colour
    assert class_color(0) != class_color(1) and class_color(20) == class_color(0)


def test_class_name_falls_back_to_the_number() -> None:
    assert class_name(NAMES, 2) == "triangle" and class_name(NAMES, 7) == "7" and class_name(None, 0) == "0"
    assert class_name(NAMES, np.float32(1.0)) == "square"
