"""utils/tasks/classify/augment.py: the classification augmentation by hand: the random resized crop's box, the
resize and centre crop, colour jitter and flips, reproducible from the random stream."""

from __future__ import annotations

import numpy as np

from utils.tasks.classify.augment import color_jitter, crop_box, resize_center_crop, train_transform, val_transform


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
    assert np.array_equal(val_transform(img, 64), cropped)
    rng = np.random.default_rng(1)
    assert np.array_equal(color_jitter(img, rng, 0, 0, 0, 0), img)
    colour = np.zeros((4, 4, 3), np.uint8)
    colour[..., 2] = 200  # red in BGR
    shifted = color_jitter(colour, np.random.default_rng(2), 0, 0, 0, 0.5)
    assert not np.array_equal(shifted, colour)
    no_crop = {"fliplr": 1.0, "hsv_h": 0, "hsv_s": 0, "hsv_v": 0}
    flipped = train_transform(img, 32, np.random.default_rng(3), no_crop)
    assert flipped.shape == (32, 32, 3) and flipped[0, 0, 0] > flipped[0, -1, 0]  # the gradient runs right to left
    first = train_transform(img, 32, np.random.default_rng(4))
    assert np.array_equal(first, train_transform(img, 32, np.random.default_rng(4)))
