"""utils/data/classify_folders.py, augment_classify.py and synthetic_cls.py / synthetic_obb.py: ImageNet-style
folders read with bounds and one-line refusals, the classification augmentation by hand, and the built-in sets
written deterministically and read back."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from utils.data.augment_classify import color_jitter, crop_box, resize_center_crop, train_transform, val_transform
from utils.data.classify_folders import scan_classification, scan_split, summary
from utils.data.errors import DataError
from utils.data.obb_labels import corner_rows_to_targets, read_obb_label_file
from utils.data.synthetic import make_spec
from utils.data.synthetic_cls import split_counts as cls_counts
from utils.data.synthetic_cls import write_cls_set
from utils.data.synthetic_obb import ASPECTS, OBB_NAMES, OWN_FILES, write_obb_set
from utils.data.synthetic_obb import split_counts as obb_counts
from utils.geometry.rotated import xywhr2corners


def image(path: Path, value: int = 80, size: tuple[int, int] = (12, 16)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((*size, 3), value, np.uint8))


def test_class_folders_are_read(tmp_path: Path) -> None:
    root = tmp_path / "set"
    for split, classes in (("train", ("dog", "cat", "bird")), ("val", ("cat", "dog"))):
        for name in classes:
            image(root / split / name / "a.jpg")
    image(root / "train" / "cat" / "nested" / "b.png", 200)
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    image(root / "train" / ".hidden" / "c.jpg")
    outside = tmp_path / "elsewhere"
    image(outside / "x.jpg")
    os.symlink(outside / "x.jpg", root / "train" / "dog" / "linked.jpg")
    os.symlink(outside, root / "train" / "linked-class")
    data = scan_classification(root)
    assert data.names == ["bird", "cat", "dog"] and data.val.names == data.names
    assert data.train.files == ["bird/a.jpg", "cat/a.jpg", "cat/nested/b.png", "dog/a.jpg"]
    assert data.train.labels.tolist() == [0, 1, 1, 2] and data.train.counts().tolist() == [1, 2, 1]
    assert (data.train.outside, data.train.others) == (2, 1)  # a file and a class folder lead outside
    assert summary(data.train) == "train: 4 images in 3 classes; 2 links leading outside and 1 other files left out"
    pixels, label = data.train.read(2)
    assert label == 1 and pixels.shape == (12, 16, 3) and pixels.mean() == pytest.approx(200, abs=2)
    assert data.val.labels.tolist() == [1, 2]
    (root / "train" / "bird" / "a.jpg").write_bytes(b"GIF89a not one")
    with pytest.raises(DataError, match="bird/a.jpg: .*GIF"):
        data.train.read(0)


def test_bad_folders_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such folder"):
        scan_classification(tmp_path)
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        scan_split(tmp_path / "train")
    (tmp_path / "train" / "cat").mkdir()
    with pytest.raises(DataError, match="no images in its class folders"):
        scan_split(tmp_path / "train")
    image(tmp_path / "train" / "cat" / "a.jpg")
    image(tmp_path / "val" / "cow" / "a.jpg")
    with pytest.raises(DataError, match="class folder 'cow' is not one of the 1 training classes"):
        scan_classification(tmp_path)
    (tmp_path / "train" / ("x" * 200)).mkdir()
    with pytest.raises(DataError, match="is not a class name"):
        scan_split(tmp_path / "train")


def test_crop_box_stays_inside_with_its_ratio() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        top, left, h, w = crop_box(60, 90, rng)
        assert 0 <= top and top + h <= 60 and 0 <= left and left + w <= 90
        assert 0.08 * 5400 * 0.8 <= h * w <= 5400
    # a thin image: no try fits, so the centred crop of the largest allowed ratio
    assert crop_box(10, 400, np.random.default_rng(0), scale=(0.99, 1.0)) == (0, 193, 10, 13)


def test_transforms_by_hand() -> None:
    gradient = np.tile(np.arange(200, dtype=np.uint8), (100, 1))  # x goes 0..199
    img = np.stack([gradient] * 3, -1)
    cropped = resize_center_crop(img, 64)  # 100 x 200 -> 64 x 128, then columns 32..95
    assert cropped.shape == (64, 64, 3)
    assert abs(int(cropped[0, 0, 0]) - 50) <= 2 and abs(int(cropped[0, -1, 0]) - 149) <= 2
    out = val_transform(img, 64)
    assert out.shape == (3, 64, 64) and out.dtype == np.float32 and out.max() <= 1.0
    assert np.allclose(out[0] * 255, cropped[..., 2])
    rng = np.random.default_rng(1)
    assert np.array_equal(color_jitter(img, rng, 0, 0, 0, 0), img)
    colour = np.zeros((4, 4, 3), np.uint8)
    colour[..., 2] = 200  # red in BGR
    shifted = color_jitter(colour, np.random.default_rng(2), 0, 0, 0, 0.5)
    assert not np.array_equal(shifted, colour)
    no_crop = {"fliplr": 1.0, "hsv_h": 0, "hsv_s": 0, "hsv_v": 0}
    flipped = train_transform(img, 32, np.random.default_rng(3), no_crop)
    assert flipped.shape == (3, 32, 32) and flipped[0, 0, 0] > flipped[0, 0, -1]  # the gradient now runs right to left
    first = train_transform(img, 32, np.random.default_rng(4))
    assert np.array_equal(first, train_transform(img, 32, np.random.default_rng(4)))


def test_synthetic_classification_set(tmp_path: Path) -> None:
    spec = make_spec(7, 4, 64, seed=3)
    names = write_cls_set(tmp_path / "a", spec)
    write_cls_set(tmp_path / "b", spec)
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)
    data = scan_classification(tmp_path / "a")
    assert data.names == ["circle", "square", "triangle"] and len(data.train) == 7 and len(data.val) == 4
    counts = cls_counts(spec)
    assert data.train.counts().tolist() == [counts[f"train/{n}"] for n in data.names] == [3, 2, 2]


def test_synthetic_obb_set_has_exact_rectangles(tmp_path: Path) -> None:
    spec = make_spec(5, 2, (64, 80), seed=1)
    names = write_obb_set(tmp_path, spec)
    assert all(OWN_FILES.fullmatch(n) for n in names) and len(names) == 2 * sum(obb_counts(spec).values()) // 2
    labels = sorted((tmp_path / "labels" / "train").glob("*.txt"))
    assert len(labels) == 5
    for label in labels:
        rows, state, _, _ = read_obb_label_file(label, len(OBB_NAMES))
        img = cv2.imread(str(tmp_path / "images" / "train" / f"{label.stem}.jpg"))
        h, w = img.shape[:2]
        targets = corner_rows_to_targets(rows, (w, h))
        assert state == "found" and len(rows)
        aspect = np.maximum(targets[:, 3] * w, targets[:, 4] * h) / np.minimum(targets[:, 3] * w, targets[:, 4] * h)
        np.testing.assert_allclose(aspect, np.array(ASPECTS)[rows[:, 0].astype(int)], rtol=1e-4)
        boxes = targets[:, 1:].astype(np.float64) * [w, h, w, h, 1]
        covered = np.zeros((h, w), bool)
        for box in boxes[::-1]:  # the last drawn first: earlier ones may lie under it
            inner, ring = region(box, -1.5, (h, w)) & ~covered, region(box, 2.5, (h, w)) & ~region(box, 1.0, (h, w))
            inside = img[inner].astype(np.float64)
            assert inside.std(0).max() < 12  # one solid colour inside the label's rectangle
            assert np.abs(inside.mean(0) - img[ring & ~covered].mean(0)).max() > 25  # and another just outside it
            covered |= region(box, 1.0, (h, w))


def region(box: np.ndarray, grow: float, shape: tuple[int, int]) -> np.ndarray:
    """The pixels whose centres lie in the rotated box ``box`` (xywhr, pixels) with each side moved by ``grow``."""
    grown = torch.tensor([*box[:2], box[2] + 2 * grow, box[3] + 2 * grow, box[4]], dtype=torch.float64)
    mask = np.zeros(shape, np.uint8)
    cv2.fillPoly(mask, [np.round((xywhr2corners(grown).numpy() - 0.5) * 256).astype(np.int32)], 1, cv2.LINE_8,
                 shift=8)
    return mask > 0
