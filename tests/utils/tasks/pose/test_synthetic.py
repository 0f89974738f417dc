"""utils/tasks/pose/synthetic.py: stick figures whose keypoints are known exactly (on the figure's painted pixels,
left limbs on the image's right), boxes that are the painted extent, occlusion as visibility, the same images for
the same seed, label files that read back through the pose label reader, and a folder that is only ever created,
or replaced when it is a set of ours (utils.data.generated)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from utils.data.label_cache import read_label_rows
from utils.data.synthetic import MANIFEST, SyntheticError, make_spec
from utils.tasks.pose.labels import keypoint_spec, parse_pose_rows
from utils.tasks.pose.synthetic import (
    FLIP_INDEX,
    KEYPOINT_NAMES,
    SKELETON,
    Figure,
    draw_pose_sample,
    ensure_synthetic_pose,
    figure_keypoints,
    figure_mask,
    is_valid_pose,
)

SPEC = make_spec(4, 2, (96, 128), 0, 3, 0.4, 0.8)


def test_the_figure_facts_hang_together() -> None:
    assert len(KEYPOINT_NAMES) == len(FLIP_INDEX) == 17 and KEYPOINT_NAMES[0] == "nose"  # COCO's layout
    for i, j in enumerate(FLIP_INDEX):
        assert FLIP_INDEX[j] == i and KEYPOINT_NAMES[j].split("_")[-1] == KEYPOINT_NAMES[i].split("_")[-1]
    assert {k for pair in SKELETON for k in pair} == set(range(17))


def test_keypoints_lie_on_the_painted_pixels_and_left_is_on_the_right() -> None:
    for seed in range(20):
        points = figure_keypoints(np.random.default_rng(seed), 64, 64, 100)
        mask = figure_mask((128, 128), Figure(points, 100.0, 3, 8.0, (255, 255, 255)))
        pixels = np.round(points).astype(int)
        assert mask[pixels[:, 1], pixels[:, 0]].all(), seed
        assert (points * 16 == np.round(points * 16)).all()  # exact in cv2's 1/16 pixel grid
        for left, right in ((1, 2), (3, 4), (5, 6), (11, 12), (13, 14)):  # eyes, ears, shoulders, hips, knees
            assert points[left, 0] > points[right, 0], (seed, left)  # the tilt is at most 20 degrees


def test_samples_are_exact_and_deterministic() -> None:
    """Every keypoint lies inside its figure's box, labelled visible (2) or occluded by a later figure (1), which
    happens in some images; the same seed gives the same sample."""
    occluded = 0
    for i in range(24, 36):  # seeds where figures overlap
        img, labels, keypoints = draw_pose_sample(np.random.default_rng([0, 0, i, 1]), SPEC)
        again = draw_pose_sample(np.random.default_rng([0, 0, i, 1]), SPEC)
        assert np.array_equal(img, again[0]) and np.array_equal(labels, again[1])
        h, w = img.shape[:2]
        assert labels.shape[1] == 5 and keypoints.shape == (len(labels), 17, 3) and (labels[:, 0] == 0).all()
        for (_, cx, cy, bw, bh), points in zip(labels, keypoints):
            x1, y1, x2, y2 = (cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h
            assert (points[:, 0] * w >= x1).all() and (points[:, 0] * w <= x2).all()
            assert (points[:, 1] * h >= y1).all() and (points[:, 1] * h <= y2).all()
            assert set(points[:, 2].tolist()) <= {1.0, 2.0}
            occluded += int((points[:, 2] == 1).sum())
    assert occluded > 0  # figures do overlap now and then


def test_the_set_is_written_once_and_reads_back(tmp_path: Path) -> None:
    root = ensure_synthetic_pose(tmp_path / "pose", n_train=3, n_val=2, img_size=64, seed=1)
    manifest = json.loads((root / MANIFEST).read_text())
    assert manifest["task"] == "pose" and manifest["kpt_shape"] == [17, 3] and manifest["flip_idx"] == list(FLIP_INDEX)
    spec = keypoint_spec(manifest)
    assert spec.shape == (17, 3) and spec.flip_index == FLIP_INDEX
    assert sorted(p.name for p in (root / "images" / "train").iterdir()) == ["00000.jpg", "00001.jpg", "00002.jpg"]
    rows, state = read_label_rows(root / "labels" / "val" / "00001.txt")
    parsed = parse_pose_rows(rows, spec.shape, nc=1)
    assert state == "found" and len(parsed.labels) >= 1 and parsed.keypoints.shape[1:] == (17, 3)
    stamp = (root / "labels" / "val" / "00001.txt").stat().st_mtime_ns
    assert ensure_synthetic_pose(tmp_path / "pose", n_train=3, n_val=2, img_size=64, seed=1) == root
    assert (root / "labels" / "val" / "00001.txt").stat().st_mtime_ns == stamp  # reused, not rewritten


def test_a_folder_holding_anything_is_never_touched(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(SyntheticError, match="'notes.txt' but no .yolo-generated file") as info:
        ensure_synthetic_pose(folder, n_train=2, n_val=1, img_size=64)
    assert "\n" not in str(info.value) and (folder / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary folder left behind
    empty = tmp_path / "empty"
    empty.mkdir()
    assert is_valid_pose(ensure_synthetic_pose(empty, n_train=2, n_val=1, img_size=64), make_spec(2, 1, 64, 0, 3,
                                                                                                   0.4, 0.8))
