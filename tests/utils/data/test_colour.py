"""utils/data/colour.py: the HSV change drawn as hsv_table draws it, applied by one matrix product within a level
of the lookup table's H, S and V; the same change on a batch's device (recolour) within a level of it."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from utils.data import augment
from utils.data.colour import COLOUR_KEY, RECOLOUR_CHUNK, HsvChange, draw_hsv, recolour, take_colour


def _image(seed: int = 0, shape: tuple[int, int] = (48, 64)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)


def test_the_draws_are_hsv_tables_draws() -> None:
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    change, table = draw_hsv(a, 0.015, 0.7, 0.4), augment.hsv_table(b, 0.015, 0.7, 0.4)
    assert np.array_equal(change.table(), table)
    assert a.random() == b.random()  # the same number of draws: the samples' later draws are kept


def test_no_gains_draw_nothing() -> None:
    a, b = np.random.default_rng(1), np.random.default_rng(1)
    assert draw_hsv(a, 0, 0, 0) is None and augment.hsv_table(b, 0, 0, 0) is None
    assert a.random() == b.random()


def test_applied_within_one_level_of_the_table_in_hsv() -> None:
    for seed in range(5):
        change = draw_hsv(np.random.default_rng(seed), 0.015, 0.7, 0.4)
        img = _image(seed)
        hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
        by_table = cv2.LUT(hsv, change.table()).astype(int)
        by_matrix = cv2.transform(hsv, np.diag(np.asarray(change.gains, np.float32))).astype(int)
        hue = np.abs(by_table[..., 0] - by_matrix[..., 0] % 180)
        assert np.minimum(hue, 180 - hue).max() <= 1  # the hue is circular: 179 and 0 are one level apart
        assert np.abs(by_table[..., 1:] - by_matrix[..., 1:]).max() <= 1
        fast, slow = change.apply(img, inplace=False), augment.apply_hsv(img.copy(), change.table())
        diff = np.abs(fast.astype(int) - slow.astype(int))
        assert diff.mean() < 1.5 and not np.array_equal(fast, img)


def test_apply_in_place_or_not_and_through_apply_hsv() -> None:
    change, img = HsvChange((1.01, 1.3, 0.8)), _image(1)
    copy = img.copy()
    out = change.apply(img, inplace=False)
    assert np.array_equal(img, copy) and out is not img
    assert augment.apply_hsv(img, change) is img and np.array_equal(img, out)  # apply_hsv takes a change too


def test_hue_gains_past_the_range_use_the_table_exactly() -> None:
    img = _image(2)
    for gains in ((1.6, 1.0, 1.0), (1.5, 0.5, 1.2)):  # 179 x 1.6 > 255: the matrix would saturate the hue
        change = HsvChange(gains)
        assert np.array_equal(change.apply(img, inplace=False), augment.apply_hsv(img.copy(), change.table()))


def _rgb_batch(bgr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bgr[..., ::-1])).permute(2, 0, 1)[None]


@pytest.mark.parametrize("gains", [(1.0, 1.0, 1.0), (1.012, 1.5, 0.7), (0.986, 0.4, 1.35), (1.015, 1.69, 1.39),
                                   (1.6, 1.0, 1.2), (0.3, 0.5, 1.0)])
def test_recolour_is_the_loaders_change_within_a_level(gains: tuple[float, float, float]) -> None:
    """Every 8-bit colour, through the batch's change on its device and through HsvChange.apply (OpenCV), the
    matrix's gains and the table's (a hue gain past 1.42): at most one level apart, and half of one on average."""
    cube = np.stack(np.meshgrid(*[np.arange(256, dtype=np.uint8)] * 3, indexing="ij"), -1).reshape(4096, 4096, 3)
    expected = HsvChange(gains).apply(cube, inplace=False)
    got = recolour(_rgb_batch(cube), torch.tensor([gains]))[0].permute(1, 2, 0).numpy()[..., ::-1]
    diff = np.abs(got.astype(np.int16) - expected)
    assert diff.max() <= 1 and diff.mean() < 0.5


def test_recolour_takes_each_images_gains_and_keeps_the_layout() -> None:
    n = RECOLOUR_CHUNK + 3  # two chunks
    images = torch.from_numpy(np.stack([_image(s, (24, 32)) for s in range(n)])).permute(0, 3, 1, 2)
    images = images.contiguous(memory_format=torch.channels_last)
    gains = 1 + (torch.rand(n, 3, generator=torch.Generator().manual_seed(0)) - 0.5) * torch.tensor([0.03, 1.4, 0.8])
    out = recolour(images, gains)
    assert out.dtype == torch.uint8 and out.is_contiguous(memory_format=torch.channels_last)
    for i in range(n):
        one = recolour(images[i:i + 1].contiguous(), gains[i:i + 1])
        assert torch.equal(out[i:i + 1], one)
        expected = HsvChange(tuple(gains[i].tolist())).apply(images[i].permute(1, 2, 0).numpy()[..., ::-1].copy())
        assert np.abs(one[0].permute(1, 2, 0).numpy()[..., ::-1].astype(int) - expected).max() <= 1
    assert not torch.equal(out[0], images[0]) and not torch.equal(out[0], out[n - 1])


def test_take_colour_leaves_the_tasks_extras() -> None:
    gains = torch.ones(2, 3)
    extras = [{COLOUR_KEY: gains, "masks": torch.zeros(2)}]
    assert take_colour(extras) is gains and list(extras[0]) == ["masks"]
    assert take_colour(extras) is None and take_colour([]) is None
