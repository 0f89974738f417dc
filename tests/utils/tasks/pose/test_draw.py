"""utils/plots/keypoints.py: keypoints drawn where they are, limbs between shown keypoints only, hidden and
low-score keypoints left out."""

from __future__ import annotations

import numpy as np

from utils.plots.annotate import class_color
from utils.tasks.pose.draw import draw_keypoints, shown_keypoints


def test_dots_and_limbs_where_the_keypoints_are() -> None:
    img = np.zeros((100, 100, 3), np.uint8)
    points = np.array([[[20, 20, 2], [80, 20, 1], [50, 80, 0], [150, 50, 2]]], np.float64)  # unlabelled, outside
    out = draw_keypoints(img, points, classes=[3], skeleton=[(0, 1), (1, 2), (0, 3)], radius=3, line_thickness=3)
    assert out is img
    assert tuple(img[20, 20]) == class_color(0 + 7) and tuple(img[20, 80]) == class_color(1 + 7)
    assert tuple(img[20, 50]) == class_color(3)  # the limb 0-1 in the object's class colour
    assert img[80, 50].sum() == 0 and img[60, 40].sum() == 0  # no dot for v 0, no limb to it
    assert img[:, 95:].sum() == 0 and img[50, 85:].sum() == 0  # nothing toward the keypoint outside


def test_predicted_scores_below_the_threshold_are_not_drawn() -> None:
    points = np.array([[[10, 10, 0.9], [30, 30, 0.2]]])
    assert shown_keypoints(points, (64, 64)).tolist() == [[True, False]]
    assert shown_keypoints(points, (64, 64), threshold=0.1).tolist() == [[True, True]]
    assert shown_keypoints(points[..., :2], (20, 20)).tolist() == [[True, False]]  # x, y only: inside is enough
    img = np.zeros((64, 64, 3), np.uint8)
    draw_keypoints(img, points, skeleton=[(0, 1)], radius=2)
    assert img[10, 10].any() and not img[30, 30].any() and not img[20, 20].any()
    assert draw_keypoints(img, np.zeros((0, 17, 3))) is img
