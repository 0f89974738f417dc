"""utils/tasks/obb/postprocess.py: an OBB head's rows to detections (k, 11) through the one post-processing call:
rotated NMS of an anchor-free head's rows, thresholds only for an end-to-end head's final rows; each detection's
enclosing box, its class and score, and the oriented box itself (regularised)."""

from __future__ import annotations

import math

import pytest
import torch

from utils.tasks.contract import OutputContract, postprocess
from utils.tasks.obb.postprocess import COLUMNS
from utils.tasks.obb.rotated import xywhr2corners

ANCHOR_FREE, END_TO_END = OutputContract("xywh_cls", 2, 1, "obb"), OutputContract("xyxy_score_cls", 2, 1, "obb")


def test_anchor_free_rows_through_rotated_nms() -> None:
    rows = torch.tensor([[[10.0, 10.0, 8.0, 4.0, 0.9, 0.1, 0.3], [10.5, 10.0, 8.0, 4.0, 0.8, 0.0, 0.3],
                          [30.0, 20.0, 6.0, 2.0, 0.1, 0.6, math.pi / 2 + 0.2]]])
    det = postprocess(rows, ANCHOR_FREE, conf_thres=0.25, iou_thres=0.5)[0]
    assert det.shape == (2, COLUMNS) and det[:, 4].tolist() == pytest.approx([0.9, 0.6])
    assert det[:, 5].tolist() == [0.0, 1.0]
    assert torch.allclose(det[0, 6:], torch.tensor([10.0, 10.0, 8.0, 4.0, 0.3]))
    assert torch.allclose(det[1, 6:], torch.tensor([30.0, 20.0, 2.0, 6.0, 0.2]), atol=1e-6)  # turned a quarter
    for row in det:  # the enclosing box of the oriented box's corners
        corners = xywhr2corners(row[6:11])
        assert torch.allclose(row[:4], torch.cat((corners.amin(0), corners.amax(0))), atol=1e-5)
    assert len(postprocess(rows, ANCHOR_FREE, 0.25, 0.5, classes=[1])[0]) == 1


def test_end_to_end_rows_are_thresholded_only() -> None:
    final = torch.tensor([[[1.0, 1.0, 2.0, 2.0, 0.3, 1.0, 0.1], [5.0, 5.0, 2.0, 2.0, 0.9, 0.0, 0.2],
                           [5.2, 5.0, 2.0, 2.0, 0.8, 0.0, 0.2], [9.0, 9.0, 2.0, 2.0, 0.1, 0.0, 0.0]]])
    kept = postprocess(final, END_TO_END, conf_thres=0.2)[0]
    assert kept[:, 4].tolist() == pytest.approx([0.9, 0.8, 0.3])  # no NMS: both overlapping rows stay
    assert kept[:, 5].tolist() == [0.0, 0.0, 1.0] and kept[0, 10].item() == pytest.approx(0.2)
    assert postprocess(final, END_TO_END, 0.2, classes=[1])[0][:, 5].tolist() == [1.0]
    assert len(postprocess(final, END_TO_END, 0.0, max_det=2)[0]) == 2
