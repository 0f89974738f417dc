"""utils/data/keypoints.py: a pose data YAML's keypoint shape, flip index and sigmas; YOLO pose rows and COCO
keypoints read and checked (one-line reasons); label lines that read back as written."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.data.errors import DataError
from utils.tasks.pose.labels import (
    COCO_FLIP_INDEX,
    COCO_KEYPOINT_NAMES,
    COCO_SIGMAS,
    COCO_SKELETON,
    check_pose_sample,
    coco_keypoints,
    coco_skeleton,
    keypoint_sigmas,
    keypoint_spec,
    normalise_keypoints,
    parse_pose_rows,
    pose_label_line,
)


def test_coco_facts_hang_together() -> None:
    assert len(COCO_KEYPOINT_NAMES) == len(COCO_SIGMAS) == len(COCO_FLIP_INDEX) == 17
    for i, j in enumerate(COCO_FLIP_INDEX):  # a left keypoint flips to its right twin
        assert COCO_KEYPOINT_NAMES[j] == COCO_KEYPOINT_NAMES[i].replace("left", "RIGHT").replace(
            "right", "left").replace("RIGHT", "right")
        assert COCO_SIGMAS[i] == COCO_SIGMAS[j]
    assert COCO_SIGMAS[0] == pytest.approx(0.026) and COCO_SIGMAS[11] == pytest.approx(0.107)
    assert (0, 1) in COCO_SKELETON and all(0 <= a < 17 and 0 <= b < 17 for a, b in COCO_SKELETON)


def test_keypoint_spec_reads_shape_flip_index_and_sigmas() -> None:
    assert keypoint_spec({"nc": 1}) is None  # not a pose set
    coco = keypoint_spec({"kpt_shape": [17, 3], "flip_idx": list(COCO_FLIP_INDEX)})
    assert coco.shape == (17, 3) and coco.flip_index == COCO_FLIP_INDEX and coco.sigmas == pytest.approx(COCO_SIGMAS)
    plain = keypoint_spec({"kpt_shape": [4, 2]})
    assert (plain.count, plain.dims, plain.flip_index, plain.sigmas) == (4, 2, None, (0.25,) * 4)
    own = keypoint_spec({"kpt_shape": [2, 3], "flip_idx": [1, 0], "kpt_sigmas": [0.05, 0.1]})
    assert own.sigmas == (0.05, 0.1) and own.flip_index == (1, 0)
    assert keypoint_sigmas(3).tolist() == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize("data, expected", [
    ({"kpt_shape": [17, 4]}, "kpt_shape must be [keypoints, 2 or 3]"),
    ({"kpt_shape": "17,3"}, "kpt_shape must be"),
    ({"kpt_shape": [0, 3]}, "kpt_shape must be"),
    ({"kpt_shape": [True, 3]}, "kpt_shape must be"),
    ({"kpt_shape": [100000, 3]}, "with 1..341 keypoints"),
    ({"kpt_shape": [3, 3], "flip_idx": [0, 1]}, "flip_idx must list 3 keypoint indices in 0..2"),
    ({"kpt_shape": [3, 3], "flip_idx": [0, 1, 5]}, "flip_idx must list 3"),
    ({"kpt_shape": [3, 3], "flip_idx": [1, 1, 0]}, "flip_idx must pair keypoints"),
    ({"kpt_shape": [3, 3], "flip_idx": [1, 2, 0]}, "flip_idx must pair keypoints"),  # a cycle, not a mirror
    ({"kpt_shape": [2, 3], "kpt_sigmas": [0.1]}, "kpt_sigmas must list 2 positive numbers"),
    ({"kpt_shape": [2, 3], "kpt_sigmas": [0.1, -1]}, "kpt_sigmas must list 2"),
    ({"kpt_shape": [2, 3], "kpt_sigmas": [0.1, float("nan")]}, "kpt_sigmas must list 2"),
])
def test_a_bad_keypoint_declaration_is_refused_in_one_line(data: dict, expected: str) -> None:
    with pytest.raises(DataError) as info:
        keypoint_spec(data, "pose.yaml")
    message = str(info.value)
    assert message.startswith("pose.yaml: ") and expected in message and "\n" not in message


def test_pose_rows_by_hand() -> None:
    rows = [["0", "0.5", "0.5", "0.4", "0.6", "0.3", "0.25", "2", "0", "0", "0"],
            ["1", "0.2", "0.3", "0.1", "0.2", "0.2", "0.3", "1", "1.0005", "0.5", "2"]]
    parsed = parse_pose_rows(rows, (2, 3), nc=2)
    assert np.allclose(parsed.labels, [[0, 0.5, 0.5, 0.4, 0.6], [1, 0.2, 0.3, 0.1, 0.2]])
    assert np.allclose(parsed.keypoints, [[[0.3, 0.25, 2], [0, 0, 0]], [[0.2, 0.3, 1], [1.0, 0.5, 2]]])  # clipped
    xy_only = parse_pose_rows([["0", "0.5", "0.5", "0.2", "0.2", "0.4", "0.5", "0.6", "0.5"]] * 2, (2, 2), None)
    assert np.allclose(xy_only.keypoints, [[[0.4, 0.5, 2.0], [0.6, 0.5, 2.0]]]) and xy_only.duplicates == 1
    assert parse_pose_rows([], (5, 3), None).keypoints.shape == (0, 5, 3)


def test_objects_with_one_box_but_other_keypoints_are_two_objects() -> None:
    rows = [["0", "0.5", "0.5", "0.2", "0.2", "0.4", "0.5", "2"], ["0", "0.5", "0.5", "0.2", "0.2", "0.6", "0.5", "2"]]
    assert len(parse_pose_rows(rows, (1, 3), None).labels) == 2


@pytest.mark.parametrize("rows, expected", [
    ([["0", "0.5", "0.5", "0.2", "0.2", "0.4", "0.5"]], "row 1: a pose row needs 5 + 1 x 3 = 8 columns, got 7"),
    ([["0", "0.5", "0.5", "0.2", "0.2", "x", "0.5", "2"]], "non-numeric label values"),
    ([["0", "0.5", "0.5", "0.2", "0.2", "1.2", "0.5", "2"]], "keypoint coordinate 1.2 outside the image"),
    ([["0", "0.5", "0.5", "0.2", "0.2", "0.4", "0.5", "3"]], "keypoint visibility 3"),
    ([["0", "0.5", "0.5", "0.2", "0.2", "0.4", "nan", "2"]], "non-finite keypoint values"),
    ([["2", "0.5", "0.5", "0.2", "0.2", "0.4", "0.5", "2"]], "class label 2 >= nc 2"),
    ([["0", "0.5", "0.5", "0", "0.2", "0.4", "0.5", "2"]], "box with zero width or height"),
])
def test_bad_pose_rows_give_the_reason(rows: list, expected: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_pose_rows(rows, (1, 3), nc=2)
    assert str(info.value).startswith(expected)


def test_label_lines_read_back_as_written() -> None:
    points = np.array([[0.25, 0.5, 2.0], [0.0, 0.0, 0.0], [0.125, 0.75, 1.0]])
    line = pose_label_line(3, [0.5, 0.5, 0.25, 0.5], points)
    assert line == "3 0.5 0.5 0.25 0.5 0.25 0.5 2 0 0 0 0.125 0.75 1"
    parsed = parse_pose_rows([line.split()], (3, 3), None)
    assert parsed.keypoints[0].tolist() == points.tolist() and parsed.labels[0].tolist() == [3, 0.5, 0.5, 0.25, 0.5]
    assert pose_label_line(0, [0.5] * 4, points, dims=2, conf=0.875) == \
        "0 0.5 0.5 0.5 0.5 0.25 0.5 0 0 0.125 0.75 0.875"


def test_coco_keypoints_are_read_in_pixels_then_normalised_and_checked() -> None:
    annotation = {"keypoints": [10, 20, 2, 7, 9, 0, 40, 0, 1], "num_keypoints": 2}
    pixels = coco_keypoints(annotation, 3)
    assert pixels.tolist() == [[10, 20, 2], [0, 0, 0], [40, 0, 1]]  # an unlabelled keypoint is 0 0 0
    assert np.allclose(normalise_keypoints(pixels, (40, 80)), [[0.25, 0.25, 2], [0, 0, 0], [1.0, 0.0, 1]])
    assert coco_keypoints({}, 2).tolist() == [[0, 0, 0], [0, 0, 0]]
    for bad, expected in (({"keypoints": [1, 2]}, "must list 3 x (x, y, v) = 9 numbers, got 2"),
                          ({"keypoints": "1 2 3"}, "got str"),
                          ({"keypoints": [1, 2, 2, 3, 4, True, 0, 0, 0]}, "not a number"),
                          ({"keypoints": [1e400, 2, 2, 0, 0, 0, 0, 0, 0]}, "not finite"),
                          ({"keypoints": [10, 20, 7, 0, 0, 0, 0, 0, 0]}, "visibility 7")):
        with pytest.raises(ValueError) as info:
            coco_keypoints(bad, 3)
        assert expected in str(info.value)
    with pytest.raises(ValueError, match="a keypoint lies outside the image"):
        normalise_keypoints(np.array([[42.0, 20, 2]]), (40, 80))
    assert np.allclose(normalise_keypoints(np.array([[40.5, 20, 2], [99, -9, 0]]), (40, 80)),
                       [[1.0, 0.25, 2], [0, 0, 0]])  # within a pixel of the edge; unlabelled anywhere


def test_the_label_scan_check_of_a_pose_pair(tmp_path: Path) -> None:
    image = tmp_path / "a.jpg"
    cv2.imwrite(str(image), np.full((40, 60, 3), 90, np.uint8))
    label = tmp_path / "a.txt"
    label.write_text("0 0.5 0.5 0.5 0.5 0.25 0.5 2 0 0 0\n0 0.5 0.5 0.5 0.5 0.25 0.5 2 0 0 0\n")
    labels, shape, state, duplicates, note, _, keypoints = check_pose_sample((str(image), str(label), 1, None),
                                                                             (2, 3))
    assert (shape, state, duplicates, len(labels)) == ((60, 40), "found", 1, 1) and "duplicate" in note
    assert np.allclose(keypoints[0], [[0.25, 0.5, 2], [0, 0, 0], [0.53, 0, 0]])  # and the area-share row
    label.write_text("0 0.5 0.5 0.5 0.5 0.25 0.5\n")
    corrupt = check_pose_sample((str(image), str(label), 1, None), (2, 3))
    assert corrupt[2] == "corrupt" and "a pose row needs 5 + 2 x 3 = 11 columns" in corrupt[4]
    missing = check_pose_sample((str(image), str(tmp_path / "none.txt"), 1, None), (2, 3))
    assert missing[2] == "missing" and missing[6] == []


def test_coco_skeleton_is_made_zero_based() -> None:
    assert coco_skeleton({"skeleton": [[1, 2], [2, 3]]}, 3) == ((0, 1), (1, 2))
    assert coco_skeleton({}, 3) == ()
    with pytest.raises(ValueError, match=r"does not name two of the 3 keypoints"):
        coco_skeleton({"skeleton": [[1, 4]]}, 3)
    with pytest.raises(ValueError, match="list of keypoint pairs"):
        coco_skeleton({"skeleton": "1-2"}, 3)
