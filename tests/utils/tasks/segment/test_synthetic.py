"""The synthetic set with outlines: the detection set's images, outlines that fill the drawn pixels, valid YOLO
segment labels, generated once, atomically, never over a folder it did not make."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.data.synthetic import draw_sample, draw_shapes, make_spec
from utils.errors import UserError
from utils.paths import ROOT
from utils.safe_yaml import load_yaml
from utils.tasks.segment.labels import read_segment_label_file
from utils.tasks.segment.masks import polygons_to_masks
from utils.tasks.segment.synthetic import (
    default_seg_root,
    draw_seg_sample,
    ensure_synthetic_seg,
    is_valid_seg,
    shape_outline,
)

SMALL = {"n_train": 5, "n_val": 2, "img_size": (64, 96), "seed": 3}


def xywh_corners(xywh: np.ndarray) -> np.ndarray:
    return np.concatenate((xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2), 1)


def test_same_images_as_the_detection_set_and_matching_boxes() -> None:
    spec = make_spec(**SMALL)
    for i in range(50):
        img, boxes = draw_sample(np.random.default_rng([3, 0, i]), spec)
        img_seg, labels, outlines = draw_seg_sample(np.random.default_rng([3, 0, i]), spec)
        assert np.array_equal(img, img_seg) and len(outlines) == len(labels) == len(boxes)
        assert (labels[:, 0] == boxes[:, 0]).all()
        h, w = img.shape[:2]
        # the detection boxes are the geometric shapes'; outlines follow the pixels: each box edge moves by at most
        # 0.5 (whole-pixel vertices) + 0.5 (pixel centres) + 1.0 (half a pixel out, at a 60-degree corner) pixels
        corners = [xywh_corners(rows[:, 1:]) * [w, h, w, h] for rows in (labels, boxes)]
        assert np.abs(corners[0] - corners[1]).max() <= 2.0


def test_outlines_fill_the_pixels_cv2_painted() -> None:
    """Each shape drawn alone as the generator draws it: the outline's mask differs only along the anti-aliased
    edge (at most a quarter pixel per pixel of outline) and overlaps it by IoU >= 0.95."""
    spec = make_spec()
    for i in range(40):
        img, shapes = draw_shapes(np.random.default_rng([0, 0, i]), spec)
        h, w = img.shape[:2]
        for shape in shapes:
            canvas = np.zeros((h, w), np.uint8)
            if shape.points is None:
                cv2.circle(canvas, (round(shape.cx), round(shape.cy)), round(shape.radius), 255, -1, cv2.LINE_AA)
            else:
                cv2.fillPoly(canvas, [np.round(shape.points).astype(np.int32)], 255, cv2.LINE_AA)
            drawn = canvas >= 128
            outline = shape_outline(shape)
            mask = polygons_to_masks([outline], (h, w))[0] > 0
            perimeter = np.linalg.norm(np.diff(np.concatenate((outline, outline[:1])), axis=0), axis=1).sum()
            assert (mask ^ drawn).sum() <= 0.25 * perimeter
            assert (mask & drawn).sum() / (mask | drawn).sum() >= 0.95


def test_generated_set_has_valid_segment_labels_and_is_kept(tmp_path: Path) -> None:
    root = ensure_synthetic_seg(tmp_path / "seg", **SMALL)
    assert is_valid_seg(root, make_spec(**SMALL))
    files = sorted((root / "labels" / "train").glob("*.txt"))
    assert len(files) == 5 and len(list((root / "images" / "val").glob("*.jpg"))) == 2
    for label_file in files:
        parsed, state = read_segment_label_file(label_file, 3)
        assert state == "found" and 1 <= len(parsed.labels) <= 4
        assert all(s is not None and len(s) >= 3 for s in parsed.segments)
        img = cv2.imread(str(root / "images" / "train" / f"{label_file.stem}.jpg"))
        assert 64 <= img.shape[0] <= 96 and 64 <= img.shape[1] <= 96
    stamp = files[0].stat().st_mtime_ns
    assert ensure_synthetic_seg(tmp_path / "seg", **SMALL) == root and files[0].stat().st_mtime_ns == stamp
    again = ensure_synthetic_seg(tmp_path / "again", **SMALL)
    assert all((again / f.relative_to(root)).read_bytes() == f.read_bytes() for f in files)  # deterministic
    (root / "labels" / "train" / "00000.txt").unlink()
    assert not is_valid_seg(root, make_spec(**SMALL))
    ensure_synthetic_seg(tmp_path / "seg", **SMALL)  # damaged: made again in its place
    assert is_valid_seg(root, make_spec(**SMALL)) and not list(tmp_path.glob(".*tmp*"))


def test_a_folder_it_did_not_make_is_never_replaced(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="'notes.txt' but no .yolo-generated file") as info:
        ensure_synthetic_seg(mine, **SMALL)
    assert "\n" not in str(info.value)
    assert (mine / "notes.txt").read_text() == "keep me" and not list(tmp_path.glob(".*tmp*"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert is_valid_seg(ensure_synthetic_seg(empty, **SMALL), make_spec(**SMALL))


def test_the_data_yaml_names_the_default_parameters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = load_yaml(ROOT / "data" / "synthetic-seg.yaml")
    params = dict(data["synthetic"])
    assert params.pop("task") == "segment" and data["nc"] == 3 and data["names"] == ["circle", "square", "triangle"]
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path))
    assert default_seg_root(make_spec(**params)).parent == tmp_path
    assert default_seg_root(make_spec(**params)).name.startswith("synthetic-seg-v1-")
    detect = load_yaml(ROOT / "data" / "synthetic.yaml")["synthetic"]
    assert params == detect  # the same images as the detection set
