"""Boxes follow the pixels through every transform: draw a box, transform, compare with the drawn pixels."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from utils import augment
from utils.boxes import xywhn2xyxy, xyxy2xywhn
from utils.datasets import YoloDataset


def _canvas(h: int = 120, w: int = 160, box: tuple[int, int, int, int] = (40, 30, 100, 70)) -> tuple:
    """Black image with one white filled rectangle; labels [cls, x1, y1, x2, y2] (exclusive corners)."""
    img = np.zeros((h, w, 3), np.uint8)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = 255
    return img, np.array([[1, x1, y1, x2, y2]], np.float32)


def _pixel_box(img: np.ndarray, thr: int = 200) -> np.ndarray:
    """[x1, y1, x2, y2] (exclusive) of the bright pixels."""
    ys, xs = np.nonzero(img.max(2) > thr)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)


def _assert_follows(img: np.ndarray, labels: np.ndarray, tol: float = 2.0) -> None:
    assert len(labels) == 1 and labels[0, 0] == 1
    np.testing.assert_allclose(labels[0, 1:], _pixel_box(img), atol=tol)


@pytest.mark.parametrize("mode", [{"auto": False}, {"auto": True}, {"scale_fill": True, "auto": False},
                                  {"scaleup": False, "auto": False}])
def test_letterbox_modes(mode: dict) -> None:
    img, labels = _canvas(60, 80, (20, 10, 50, 40))
    out, (rw, rh), (pw, ph) = augment.letterbox(img, (160, 128), stride=32, **mode)
    if mode.get("auto"):
        assert out.shape[0] % 32 == 0 and out.shape[1] % 32 == 0 and out.shape[:2] != (160, 128)
    else:
        assert out.shape[:2] == (160, 128)
    if mode.get("scaleup") is False:
        assert rw == rh == 1.0
    moved = labels.copy()
    moved[:, [1, 3]] = labels[:, [1, 3]] * rw + pw
    moved[:, [2, 4]] = labels[:, [2, 4]] * rh + ph
    _assert_follows(out, moved, tol=1.5)
    assert (out[0, 0] == 114).all() or mode.get("scale_fill") or mode.get("auto")  # padded top row


@pytest.mark.parametrize("params", [
    {"degrees": 30}, {"translate": 0.2}, {"scale": 0.5}, {"shear": 10}, {"perspective": 0.0008},
    {"degrees": 10, "translate": 0.1, "scale": 0.3, "shear": 5},
])
def test_random_perspective_boxes_follow_pixels(params: dict) -> None:
    full = {"degrees": 0.0, "translate": 0.0, "scale": 0.0, "shear": 0.0, "perspective": 0.0, **params}
    for seed in range(4):
        img, labels = _canvas()
        out, moved = augment.random_perspective(img, labels, np.random.default_rng(seed), **full)
        if len(moved):
            _assert_follows(out, moved, tol=3.0 if params.get("perspective") else 2.0)


def test_box_pushed_out_of_the_image_is_dropped() -> None:
    img, labels = _canvas(100, 100, (2, 2, 12, 12))
    out, moved = augment.random_perspective(img, labels, np.random.default_rng(0), degrees=0, translate=0,
                                            scale=0, shear=0, border=(-40, -40))  # crop to the centre 20x20
    assert out.shape[:2] == (20, 20) and len(moved) == 0


def _normalised(labels: np.ndarray, w: int, h: int) -> np.ndarray:
    out = labels.copy()
    out[:, 1:] = xyxy2xywhn(labels[:, 1:], w, h, clip=True)
    return out


def test_flips() -> None:
    img, labels = _canvas()
    h, w = img.shape[:2]
    norm = _normalised(labels, w, h)
    for flip in (augment.flip_lr, augment.flip_ud):
        out, flipped = flip(img, norm)
        pixels = flipped.copy()
        pixels[:, 1:] = xywhn2xyxy(flipped[:, 1:], w, h)
        _assert_follows(out, pixels, tol=0.01)


def test_hsv_changes_colours_not_geometry() -> None:
    img = np.full((20, 20, 3), (40, 120, 200), np.uint8)
    out = augment.augment_hsv(img.copy(), np.random.default_rng(0), 0.5, 0.5, 0.5)
    assert out.shape == img.shape and not np.array_equal(out, img)
    assert len(np.unique(out.reshape(-1, 3), axis=0)) == 1  # the same change everywhere


def test_mosaic_places_each_image_with_its_box() -> None:
    images, labels = [], []
    for i in range(4):
        img, lab = _canvas(64, 64, (16 + i, 16, 48, 40 + i))
        images.append(img)
        labels.append(_normalised(lab, 64, 64))
    canvas, boxes = augment.mosaic4(images, labels, 64, np.random.default_rng(1))
    assert canvas.shape == (128, 128, 3) and len(boxes) == 4
    for box in boxes:
        x1, y1, x2, y2 = box[1:].astype(int)
        if x2 - x1 > 2 and y2 - y1 > 2:
            assert canvas[y1:y2, x1:x2].min() == 255  # every box covers white pixels only
    assert (canvas.max(2) == 255).sum() == sum(int((b[3] - b[1]) * (b[4] - b[2])) for b in boxes)


def test_mixup_keeps_both_label_sets() -> None:
    a, la = _canvas()
    b, lb = _canvas(box=(10, 10, 20, 20))
    out, labels = augment.mixup(a, la, b, lb, np.random.default_rng(0))
    assert out.shape == a.shape and len(labels) == 2
    assert 90 < out[50, 50, 0] < 165  # about half of 255 where only one image is white


def _white_box_set(root: Path, count: int = 6) -> Path:
    """Images (64-96 px) with one white rectangle on black, and its label."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        h, w = int(rng.integers(64, 97)), int(rng.integers(64, 97))
        x1, y1 = int(rng.integers(4, w // 2)), int(rng.integers(4, h // 2))
        x2, y2 = x1 + int(rng.integers(16, w // 2 - 2)), y1 + int(rng.integers(16, h // 2 - 2))
        img, _ = _canvas(h, w, (x1, y1, x2, y2))
        cv2.imwrite(str(root / "images" / f"{i}.png"), img)
        (root / "labels" / f"{i}.txt").write_text(
            f"1 {(x1 + x2) / 2 / w} {(y1 + y2) / 2 / h} {(x2 - x1) / w} {(y2 - y1) / h}\n")
    return root / "images"


def test_dataset_augmentations_keep_boxes_on_the_drawn_pixels(tmp_path: Path) -> None:
    hyp = {"hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.3, "degrees": 5, "translate": 0.1, "scale": 0.3, "shear": 2,
           "perspective": 0.0, "flipud": 0.5, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.0}
    ds = YoloDataset(_white_box_set(tmp_path), img_size=64, augment=True, hyp=hyp, nc=3, seed=1)
    for _ in range(3):
        for i in range(len(ds)):
            img, targets, _, _ = ds[i]
            hwc = img.permute(1, 2, 0).numpy()
            bright = hwc.max(2) > 130
            assert (targets[:, 1] == 1).all()
            covered = np.zeros_like(bright)
            for _, _, cx, cy, w, h in targets.tolist():
                x1, x2 = round((cx - w / 2) * 64), round((cx + w / 2) * 64)
                y1, y2 = round((cy - h / 2) * 64), round((cy + h / 2) * 64)
                covered[max(y1 - 2, 0):y2 + 2, max(x1 - 2, 0):x2 + 2] = True
                inner = bright[y1 + 2:y2 - 2, x1 + 2:x2 - 2]
                assert inner.size == 0 or inner.mean() > 0.8  # a box holds the bright pixels it follows
            _assert_unlabelled_are_cropped_remnants(bright & ~covered)


def _assert_unlabelled_are_cropped_remnants(uncovered: np.ndarray) -> None:
    """Bright pixels outside every box may only be what is left of a box cropped at the border (dropped
    because it lost most of its area): each such piece touches the image edge."""
    count, _, stats, _ = cv2.connectedComponentsWithStats(uncovered.astype(np.uint8))
    h, w = uncovered.shape
    for x, y, bw, bh, _ in stats[1:count]:
        assert x == 0 or y == 0 or x + bw == w or y + bh == h
