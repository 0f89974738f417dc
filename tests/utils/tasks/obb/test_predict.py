"""utils/tasks/obb/predict.py: oriented boxes drawn as their outlines (in place of the enclosing boxes) and written as
normalised corners that read back as YOLO-OBB labels; an image's oriented boxes mapped back through its letterbox."""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch

from utils.plots.annotate import class_color
from utils.tasks.obb.labels import parse_obb_rows
from utils.tasks.obb.postprocess import detection_rows
from utils.tasks.obb.predict import OUTPUTS, detection_corners, draw_rotated_boxes, obb_label_lines
from utils.tasks.obb.sample import rotated_boxes


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
    boxes = rotated_boxes(rows[:, 1:].reshape(-1, 4, 2) * [160, 60], 1, 1)
    np.testing.assert_allclose(boxes[0].numpy(), [40, 30, 30, 10, 0.25], atol=1e-3)
    assert obb_label_lines(det, (60, 160), save_conf=True)[0].endswith(" 0.8")


def test_results_in_original_pixels() -> None:
    rotated = torch.tensor([[40.0, 30.0, 30.0, 10.0, 0.25, 0.8, 1.0]])  # x, y, w, h, r, conf, cls (input pixels)
    rows = detection_rows(rotated)
    ratio_pad = ((0.5, 0.5), (4.0, 2.0))  # the input is the original at half size, padded 4 left and 2 on top
    results = OUTPUTS.image(rows, (), 0, (64, 96), rows[:, :4], (120, 180), ratio_pad)
    assert torch.allclose(results["rboxes"], torch.tensor([[72.0, 56.0, 60.0, 20.0, 0.25]]))
    quads = OUTPUTS.summary(results)["quads"]
    assert quads.shape == (1, 4, 2)
    np.testing.assert_allclose(quads.mean(1), [[72.0, 56.0]], atol=1e-6)
    det = np.array([[0.0, 0.0, 1.0, 1.0, 0.8, 1.0]])  # the enclosing box does not matter: the oriented one is drawn
    drawn = OUTPUTS.draw_labelled(np.zeros((120, 180, 3), np.uint8), det, results, ["a", "b"], 1, True, False)
    assert drawn[56, 72].sum() == 0 and drawn.any()
    line = OUTPUTS.label_rows(det, results, (120, 180), True)[0]
    assert line.startswith("1 ") and line.endswith(" 0.8") and len(line.split()) == 10
