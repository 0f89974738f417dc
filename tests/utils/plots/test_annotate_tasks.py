"""utils/plots/annotate_classify.py and annotate_obb.py: the top-5 drawn and written, oriented boxes drawn as their
outlines and written as normalised corners that read back as YOLO-OBB labels."""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch

from utils.data.obb_labels import corner_rows_to_targets, parse_obb_rows
from utils.plots.annotate import class_color
from utils.plots.annotate_classify import draw_topk, topk, topk_lines
from utils.plots.annotate_obb import detection_corners, draw_rotated_boxes, obb_label_lines


def test_topk_lines_and_drawing() -> None:
    probs = np.array([0.05, 0.5, 0.1, 0.2, 0.05, 0.1])
    assert topk(probs, 3) == [(1, 0.5), (3, 0.2), (2, 0.1)]  # a tie goes to the lower class
    names = ["a", "b", "c", "d", "e", "f"]
    assert topk_lines(probs, names) == ["0.50 b", "0.20 d", "0.10 c", "0.10 f", "0.05 a"]
    assert topk_lines(probs[:2], None) == ["0.50 1", "0.05 0"]  # fewer classes than five; no names
    img = np.full((120, 160, 3), 100, np.uint8)
    out = draw_topk(img.copy(), probs, names)
    changed = (out != 100).any(2)
    rows = np.nonzero(changed.any(1))[0]
    assert rows.min() < 10 and 40 < rows.max() < 110  # five lines from the top
    assert not changed[:, 120:].any()  # short labels: the right side untouched
    assert (out[2:4, 2:20] == 32).all()  # the dark band behind the text


def test_rotated_boxes_are_drawn_along_their_outline() -> None:
    det = np.array([[80.0, 60.0, 80.0, 30.0, math.radians(30), 0.9, 3]])
    img = np.zeros((120, 160, 3), np.uint8)
    draw_rotated_boxes(img, det, ["a", "b", "c", "d"], line_thickness=1, hide_labels=True)
    painted = img.any(2)
    brightest = img.reshape(-1, 3)[img.sum(2).argmax()].astype(float)
    assert np.allclose(brightest / brightest.max(), np.array(class_color(3)) / max(class_color(3)), atol=0.02)
    outline = np.zeros((120, 160), np.uint8)
    cv2.polylines(outline, [np.round(detection_corners(det)[0] - 0.5).astype(np.int32)], True, 1, 3)
    assert painted.sum() > 150 and (painted & (outline == 0)).sum() == 0  # every painted pixel on the outline
    assert not img[55:65, 75:85].any()  # the inside left as it was
    labelled = draw_rotated_boxes(np.zeros((120, 160, 3), np.uint8), torch.tensor(det), ["a", "b", "c", "d"])
    assert (labelled != 0).any(2).sum() > painted.sum()  # the tag too


def test_label_lines_read_back_as_the_same_boxes() -> None:
    det = torch.tensor([[40.0, 30.0, 30.0, 10.0, 0.25, 0.8, 1], [100.0, 20.0, 20.0, 20.0, 0.0, 0.6, 0]])
    lines = obb_label_lines(det, (60, 160))
    assert lines[1] == "0 0.6875 0.5 0.5625 0.5 0.5625 0.166667 0.6875 0.166667"
    rows = parse_obb_rows([line.split() for line in lines], 2)[0]
    targets = corner_rows_to_targets(rows, (160, 60))
    np.testing.assert_allclose(targets[0, 1:] * [160, 60, 160, 60, 1], [40, 30, 30, 10, 0.25], atol=1e-3)
    assert obb_label_lines(det, (60, 160), save_conf=True)[0].endswith(" 0.8")
