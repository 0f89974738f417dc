"""utils/tasks/obb/labels.py: YOLO-OBB rows read and checked like box rows (one-line reasons), each object's
enclosing box and corners as the label scan keeps them, and corners made rotated boxes in pixels for a batch."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.data.dota import obb_label_text
from utils.tasks.obb.labels import check_obb_sample, parse_obb_rows, read_obb_label_file
from utils.tasks.obb.sample import rotated_boxes

ROW = "1 0.1 0.2 0.5 0.2 0.5 0.4 0.1 0.4"


def test_rows_are_read_checked_and_clipped(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text(f"{ROW}\n\n{ROW}\n0 -0.0005 0 0.3 0 0.3 1.0004 0 1\n")
    rows, state, repeats, note = read_obb_label_file(path, nc=2)
    assert state == "found" and repeats == 1 and note == "1 duplicate labels removed"
    assert rows.shape == (2, 9) and rows.dtype == np.float32
    assert rows[1, 1] == 0.0 and rows[1, 6] == 1.0  # clipped within the tolerance
    assert read_obb_label_file(tmp_path / "none.txt", 2)[1] == "missing"
    (tmp_path / "empty.txt").write_text("\n")
    assert read_obb_label_file(tmp_path / "empty.txt", 2)[1] == "empty"


@pytest.mark.parametrize("text, reason", [
    ("1 0.5 0.5 0.2 0.2", r"require 9 columns \(class and 4 corners\), 5 columns detected"),
    ("2 0.1 0.2 0.5 0.2 0.5 0.4 0.1 0.4", "class label 2 >= nc 2"),
    ("-1 0.1 0.2 0.5 0.2 0.5 0.4 0.1 0.4", "class label -1 is not a class index"),
    ("1 0.1 0.2 1.5 0.2 0.5 0.4 0.1 0.4", "out of bounds corner 1.5"),
    ("1 0.1 0.2 0.3 0.2 0.5 0.2 0.7 0.2", "oriented box with zero area"),
    ("1 0.1 0.2 x 0.2 0.5 0.4 0.1 0.4", "non-numeric"),
    ("1 0.1 0.2 nan 0.2 0.5 0.4 0.1 0.4", "non-finite"),
])
def test_bad_rows_name_their_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_obb_rows([text.split()], nc=2)


def test_corners_become_rotated_boxes_in_pixels() -> None:
    # a 40 x 10 px rectangle turned by 30 degrees about (60, 30) in a 120 x 60 image
    angle = math.radians(30)
    half_w = np.array([math.cos(angle), math.sin(angle)]) * 20
    half_h = np.array([-math.sin(angle), math.cos(angle)]) * 5
    centre = np.array([60.0, 30.0])
    corners = np.stack([centre + half_w + half_h, centre - half_w + half_h, centre - half_w - half_h,
                        centre + half_w - half_h]) / [120.0, 60.0]
    box = rotated_boxes(corners[None] * [120.0, 60.0], 120, 60)[0]  # found in pixels, then normalised
    np.testing.assert_allclose(box.numpy(), [0.5, 0.5, 40 / 120, 10 / 60, angle], atol=1e-5)
    text = obb_label_text([3], corners)
    again = parse_obb_rows([text.split()], 4)[0]
    assert np.array_equal(again[0, 1:], corners.reshape(-1).astype(np.float32))  # float32 round trip exact


def test_a_sample_gives_enclosing_boxes_and_corners(tmp_path: Path) -> None:
    image, label = tmp_path / "a.jpg", tmp_path / "a.txt"
    cv2.imwrite(str(image), np.zeros((20, 40, 3), np.uint8))
    label.write_text(f"{ROW}\n0 0.6 0.1 0.9 0.3 0.8 0.6 0.5 0.4\n")
    labels, shape, state, duplicates, note, _, corners = check_obb_sample((str(image), str(label), 2, None))
    assert (shape, state, duplicates, note) == ((40, 20), "found", 0, "")
    np.testing.assert_allclose(labels, [[1, 0.3, 0.3, 0.4, 0.2], [0, 0.7, 0.35, 0.4, 0.5]], atol=1e-6)
    assert len(corners) == 2
    np.testing.assert_allclose(corners[1], [[0.6, 0.1], [0.9, 0.3], [0.8, 0.6], [0.5, 0.4]], atol=1e-7)
    label.write_text("1 0.5 0.5 0.2 0.2\n")
    assert check_obb_sample((str(image), str(label), 2, None))[2] == "corrupt"  # counted, never raised
