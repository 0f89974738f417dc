"""Boxes follow the pixels through every transform: draw a box, transform, compare with the drawn pixels."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.boxes import xywhn2xyxy, xyxy2xywhn
from utils.data import augment
from utils.data.datasets import YoloDataset


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


def _gradients(sizes: list[tuple[int, int]]) -> list[np.ndarray]:
    """Smooth colour ramps, a different one per image (interpolation differences stay small on them)."""
    out = []
    for k, (h, w) in enumerate(sizes):
        yy, xx = np.mgrid[0:h, 0:w]
        out.append(np.stack([40 + xx * 150 // w + k * 10, 60 + yy * 150 // h, 200 - (xx + yy) * 100 // (w + h)],
                            -1).astype(np.uint8))
    return out


WARPS = {"scale+translate": {"degrees": 0, "translate": 0.1, "scale": 0.5, "shear": 0, "perspective": 0},
         "rotate+shear": {"degrees": 10, "translate": 0.1, "scale": 0.5, "shear": 5, "perspective": 0},
         "perspective": {"degrees": 0, "translate": 0.1, "scale": 0.3, "shear": 0, "perspective": 0.0005}}


@pytest.mark.parametrize("warp", WARPS)
@pytest.mark.parametrize("enlarge", [1, 4])
def test_composed_mosaic_warp_equals_canvas_then_warp(warp: str, enlarge: int) -> None:
    """warp_mosaic gives mosaic4 + random_perspective's boxes exactly and its pixels within interpolation."""
    size, sizes = 256, [(192, 256), (256, 160), (120, 256), (256, 256)]
    small = [cv2.resize(img, (w // 4, h // 4), interpolation=cv2.INTER_AREA)
             for img, (h, w) in zip(_gradients(sizes), sizes)]
    full = [cv2.resize(img, (w, h)) for img, (h, w) in zip(small, sizes)]  # what load_image would give
    sources = small if enlarge == 4 else full
    labels = [np.array([[k, 0.5, 0.5, 0.4, 0.3]], np.float32) for k in range(4)]
    for seed in range(3):
        rng = np.random.default_rng(seed)
        canvas, boxes = augment.mosaic4(full, labels, size, rng)
        expected, expected_boxes = augment.random_perspective(canvas, boxes, rng, border=(-size // 2, -size // 2),
                                                              **WARPS[warp])
        out, out_boxes = augment.warp_mosaic(sources, labels, size, np.random.default_rng(seed), sizes,
                                             **WARPS[warp])
        assert out.shape == expected.shape and len(out_boxes) > 0
        np.testing.assert_allclose(out_boxes, expected_boxes, atol=1e-4)
        diff = np.abs(out.astype(int) - expected.astype(int)).max(2)
        if warp == "scale+translate":  # resized blocks land on whole pixels: up to half a pixel off at tile edges
            assert diff.mean() < 2.0 and (diff > 10).mean() < 0.02, (diff.mean(), (diff > 10).mean())
        else:  # the same warp, tile by tile: differences only where tiles meet
            assert diff.mean() < 0.5 and (diff > 10).mean() < 0.01, (diff.mean(), (diff > 10).mean())


@pytest.mark.parametrize("warp", WARPS)
@pytest.mark.parametrize("enlarge", [1, 3])
def test_composed_mosaic_boxes_land_on_the_white_squares(warp: str, enlarge: int) -> None:
    size = 128
    images, labels, sizes = [], [], []
    for k in range(4):
        h, w = 96 + 8 * k, 120 - 8 * k
        img, lab = _canvas(h // enlarge, w // enlarge, (10 // enlarge + k, 12 // enlarge, (w - 24) // enlarge,
                                                         (h - 20 + k) // enlarge))
        images.append(img)
        labels.append(_normalised(lab, w // enlarge, h // enlarge))
        sizes.append((h // enlarge * enlarge, w // enlarge * enlarge))
    for seed in range(6):
        out, boxes = augment.warp_mosaic(images, labels, size, np.random.default_rng(seed), sizes, **WARPS[warp])
        bright = out.max(2) > 127
        covered = np.zeros_like(bright)
        for box in boxes:
            x1, y1, x2, y2 = box[1:].round().astype(int)
            region = np.zeros_like(bright)
            region[max(y1 - 3, 0):y2 + 3, max(x1 - 3, 0):x2 + 3] = True
            covered |= region
            drawn = _pixel_box(np.where(region[..., None], out, 0), 127)
            if 0 < box[1] and 0 < box[2] and box[3] < size and box[4] < size:
                np.testing.assert_allclose(box[1:], drawn, atol=2.0)
            else:  # cut by the border: the box of the cut corners may be larger than what is left of the square
                assert (drawn[:2] >= box[1:3] - 2).all() and (drawn[2:] <= box[3:] + 2).all(), (box, drawn)
        _assert_unlabelled_are_cropped_remnants(bright & ~covered)


def test_mosaic_colour_change_on_the_tiles_matches_the_change_afterwards() -> None:
    """Small tiles are coloured before the warp (cheaper): the same picture as colouring the output."""
    sizes = [(24, 32), (32, 24), (20, 32), (28, 28)]
    images, labels = _gradients(sizes), [np.zeros((0, 5), np.float32)] * 4
    table = augment.hsv_table(np.random.default_rng(3), 0.015, 0.7, 0.4)
    kwargs = {"degrees": 0, "translate": 0.1, "scale": 0.5, "shear": 0, "perspective": 0}
    first, _ = augment.warp_mosaic(images, labels, 64, np.random.default_rng(0), **kwargs, hsv=table)  # tiles
    plain, _ = augment.warp_mosaic(images, labels, 64, np.random.default_rng(0), **kwargs)
    after = augment.apply_hsv(plain.copy(), table)
    assert not np.array_equal(plain, after)
    diff = np.abs(first.astype(int) - after.astype(int))
    assert diff.mean() < 1.5 and np.percentile(diff, 99) <= 8, (diff.mean(), np.percentile(diff, 99))
    pad = plain.max(2) == augment.PAD_COLOR[0]
    assert pad.any() and (first[pad] == after[pad]).all()  # the padding gets the same colour either way


def test_large_tiles_are_coloured_tile_by_tile_as_the_output_would_be() -> None:
    """Tiles larger than the output (the usual 480-640 px sources) are coloured on their source crop or on the block
    they paste, whichever is smaller; the picture is that of colouring the output, each pixel coloured once."""
    from utils.data.colour import draw_hsv

    sizes = [(96, 128), (128, 96), (80, 128), (112, 112)]
    images, labels = _gradients(sizes), [np.zeros((0, 5), np.float32)] * 4
    kwargs = {"degrees": 0, "translate": 0.1, "scale": 0.5, "shear": 0, "perspective": 0}
    for seed in range(4):
        change = draw_hsv(np.random.default_rng(seed + 10), 0.015, 0.7, 0.4)
        tiled, _ = augment.warp_mosaic(images, labels, 64, np.random.default_rng(seed), **kwargs, hsv=change)
        plain, _ = augment.warp_mosaic(images, labels, 64, np.random.default_rng(seed), **kwargs)
        after = change.apply(plain, inplace=False)
        diff = np.abs(tiled.astype(int) - after.astype(int))
        assert diff.mean() < 1.5 and np.percentile(diff, 99) <= 8, (diff.mean(), np.percentile(diff, 99))
        twice = np.abs(change.apply(after, inplace=False).astype(int) - after.astype(int))
        assert twice.mean() > diff.mean()  # colouring twice would show: no pixel is
