"""utils/tasks/segment/masks.py:
the scanline fill against matplotlib's point-in-polygon, the overlap index image, mask IoU,
cropping, prototype masks, letterbox undo, polygons from masks and COCO RLE against pycocotools."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.path import Path as MplPath

from utils.tasks.segment.masks import (
    crop_masks,
    fill_polygon,
    index_to_masks,
    mask_iou,
    mask_to_polygon,
    masks_to_polygons,
    normalized_to_pixels,
    overlap_index,
    polygon_area,
    polygons_to_masks,
    process_masks,
    prototype_masks,
    rle_area,
    rle_counts,
    rle_decode,
    rle_encode,
    scale_masks,
)


def star(rng: np.random.Generator, centre: tuple[float, float], radius: float, points: int = 12) -> np.ndarray:
    """A random simple (star-shaped) polygon around ``centre``."""
    angles = np.sort(rng.uniform(0, 2 * np.pi, points))
    radii = rng.uniform(0.3, 1.0, points) * radius
    return np.stack([centre[0] + radii * np.cos(angles), centre[1] + radii * np.sin(angles)], 1)


def circle(centre: tuple[float, float], radius: float, points: int = 60) -> np.ndarray:
    angles = np.arange(points) * 2 * np.pi / points
    return np.stack([centre[0] + radius * np.cos(angles), centre[1] + radius * np.sin(angles)], 1)


def centres_inside(polygon: np.ndarray, shape_hw: tuple[int, int], downsample: int = 1) -> np.ndarray:
    """The reference rule by an independent implementation: matplotlib's point-in-polygon at pixel centres."""
    h, w = shape_hw[0] // downsample, shape_hw[1] // downsample
    ys, xs = np.mgrid[0:h, 0:w]
    centres = np.stack([(xs.ravel() + 0.5) * downsample, (ys.ravel() + 0.5) * downsample], 1)
    return MplPath(polygon).contains_points(centres).reshape(h, w)


def test_a_square_fills_the_pixels_whose_centre_it_holds() -> None:
    mask = polygons_to_masks([np.array([[1, 1], [3, 1], [3, 3], [1, 3]], float)], (6, 6))[0]
    expected = np.zeros((6, 6), np.uint8)
    expected[1:3, 1:3] = 1
    assert (mask == expected).all()
    mask = polygons_to_masks([np.array([[1.4, 0.6], [3.6, 0.6], [3.6, 2.4], [1.4, 2.4]])], (6, 6))[0]
    assert mask.sum() == 3 and mask[1, 1:4].all()  # x centres 1.5, 2.5, 3.5 in [1.4, 3.6); y only 1.5 in [0.6, 2.4)
    assert polygons_to_masks([np.array([[0, 0], [5, 0]], float)], (6, 6)).sum() == 0  # fewer than 3 points


@pytest.mark.parametrize("downsample", [1, 4])
def test_random_polygons_match_an_independent_point_in_polygon(downsample: int) -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        polygon = star(rng, tuple(rng.uniform(-10, 90, 2)), rng.uniform(5, 50), int(rng.integers(3, 40)))
        mask = polygons_to_masks([polygon], (80, 96), downsample)[0].astype(bool)
        assert (mask == centres_inside(polygon, (80, 96), downsample)).all()


def test_area_and_adjacent_polygons() -> None:
    rng = np.random.default_rng(1)
    polygon = star(rng, (100, 100), 80, 30)
    mask = polygons_to_masks([polygon], (200, 200))[0]
    assert abs(mask.sum() - polygon_area(polygon)) < 0.02 * polygon_area(polygon)
    left = np.array([[10, 10], [50.3, 10], [50.3, 60], [10, 60]])  # two polygons sharing an edge share no pixel
    right = np.array([[50.3, 10], [90, 10], [90, 60], [50.3, 60]])
    a, b = polygons_to_masks([left, right], (100, 100)).astype(bool)
    assert not (a & b).any() and (a | b).sum() == 80 * 50
    assert polygon_area(np.array([[0, 0], [4, 0], [4, 3]])) == 6.0


def test_fill_ignores_bad_points_and_stays_inside_the_mask() -> None:
    mask = np.zeros((8, 8), np.uint8)
    fill_polygon(mask, np.array([[0, 0], [np.nan, 1], [3, 3]]))
    assert mask.sum() == 0
    fill_polygon(mask, np.array([[-1e12, -1e12], [1e12, -1e12], [1e12, 1e12], [-1e12, 1e12]]), 7)
    assert (mask == 7).all()


def test_overlap_index_puts_the_smaller_instance_on_top() -> None:
    big = np.array([[0, 0], [40, 0], [40, 40], [0, 40]], float)
    small = np.array([[10, 10], [20, 10], [20, 20], [10, 20]], float)
    for polygons in ([big, small], [small, big]):
        index, order = overlap_index(polygons, (48, 48))
        assert index.dtype == np.uint8
        assert [polygons[i] is big for i in order] == [True, False]  # largest first
        assert index[15, 15] == 2 and index[5, 5] == 1 and index[45, 45] == 0
        masks = index_to_masks(index, 2)
        assert masks.shape == (2, 48, 48) and masks[1].sum() == 100 and masks[0].sum() == 1600 - 100
    index, order = overlap_index([big, small], (48, 48), downsample=4)
    assert index.shape == (12, 12) and (index == 2).sum() == 9  # centres (j + 0.5) * 4 = 10, 14, 18 in [10, 20)
    index, order = overlap_index([], (48, 48), downsample=4)  # an image whose objects augmentation dropped
    assert index.shape == (12, 12) and not index.any() and len(order) == 0


def test_overlap_index_widens_past_255_instances() -> None:
    polygons = [np.array([[x, y], [x + 1, y], [x + 1, y + 1], [x, y + 1]], float) for y in range(17) for x in range(16)]
    index, order = overlap_index(polygons, (17, 16))
    assert index.dtype == np.int32 and index.max() == 272 and len(set(index.ravel().tolist())) == 272


def test_mask_iou_pairwise_and_batched() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(3, 5, 10, 12, generator=gen) > 0.5
    b = torch.rand(3, 4, 10, 12, generator=gen) > 0.5
    iou = mask_iou(a, b)
    assert iou.shape == (3, 5, 4)
    for k in range(3):
        for i in range(5):
            for j in range(4):
                inter = (a[k, i] & b[k, j]).sum().item()
                union = (a[k, i] | b[k, j]).sum().item()
                assert iou[k, i, j].item() == pytest.approx(inter / union)
    assert torch.equal(mask_iou(a[0], b[0]), iou[0])
    empty = torch.zeros(1, 4, 4, dtype=torch.bool)
    assert mask_iou(empty, empty).item() == 0.0


def test_crop_keeps_pixels_whose_centre_is_in_the_box() -> None:
    masks = torch.ones(2, 4, 6)
    cropped = crop_masks(masks, torch.tensor([[0.6, 0.4, 3.4, 2.6], [0.0, 0.0, 6.0, 4.0]]))
    expected = torch.zeros(4, 6)
    expected[0:3, 1:3] = 1  # x centres 0.5 < 0.6 out, 1.5 and 2.5 in, 3.5 > 3.4 out; y 0.5, 1.5, 2.5 in, 3.5 out
    assert torch.equal(cropped[0], expected) and cropped[1].sum() == 24


def test_prototype_masks_by_hand() -> None:
    protos = torch.tensor([[[1.0, -1.0], [2.0, 0.0]], [[0.0, 1.0], [-1.0, 3.0]]])  # (2, 2, 2)
    coefficients = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    logits = prototype_masks(protos, coefficients)
    assert torch.allclose(logits[0], torch.tensor([[1.0, 1.0], [0.0, 6.0]]))
    assert torch.allclose(logits[1], torch.tensor([[-1.0, 1.5], [-2.5, 1.5]]))
    masks = process_masks(protos, coefficients, torch.tensor([[0.0, 0.0, 4.0, 4.0], [0.0, 0.0, 2.0, 4.0]]), (4, 4),
                          upsample=False)
    assert masks.tolist() == [[[True, True], [False, True]], [[False, False], [False, False]]]
    up = process_masks(protos, coefficients, torch.tensor([[0.0, 0.0, 4.0, 4.0], [0.0, 0.0, 4.0, 4.0]]), (4, 4))
    native = process_masks(protos, coefficients, torch.tensor([[0.0, 0.0, 4.0, 4.0], [0.0, 0.0, 4.0, 4.0]]), (4, 4),
                           native=True)
    assert up.shape == native.shape == (2, 4, 4) and torch.equal(up, native)  # whole-image boxes: same masks
    assert up[0, 3, 3] and not up[0, 3, 0]
    assert process_masks(protos, coefficients[:0], torch.zeros(0, 4), (4, 4)).shape == (0, 4, 4)


def test_scale_masks_undoes_a_letterbox() -> None:
    rng = np.random.default_rng(2)
    polygon = star(rng, (50, 30), 25, 20)
    original = polygons_to_masks([polygon], (60, 100))[0]  # h0, w0 = 60, 100
    gain, pad = 0.64, (0.0, 12.8)  # 100 -> 64 wide, 60 -> 38.4 high, padded to 64 x 64
    letterboxed = polygons_to_masks([polygon * gain + pad], (64, 64))
    restored = scale_masks(torch.from_numpy(letterboxed), (60, 100), ((gain, gain), pad))[0].numpy()
    iou = (restored & (original > 0)).sum() / (restored | (original > 0)).sum()
    assert restored.shape == (60, 100) and iou > 0.93
    assert torch.equal(scale_masks(torch.from_numpy(letterboxed), (60, 100)),
                       scale_masks(torch.from_numpy(letterboxed), (60, 100), ((gain, gain), pad)))


def test_polygon_from_mask_round_trip_and_largest_part() -> None:
    rng = np.random.default_rng(3)
    for _ in range(5):  # random outlines may leave a pixel joined by a corner only: nearly exact
        mask = polygons_to_masks([star(rng, (40, 30), 25, 8)], (64, 80))[0]
        again = polygons_to_masks([mask_to_polygon(mask)], (64, 80))[0]
        assert (again != mask).sum() <= 2
    disc = polygons_to_masks([circle((40, 30), 17.3)], (64, 80))[0]
    assert (polygons_to_masks([mask_to_polygon(disc)], (64, 80))[0] == disc).all()  # exact
    two = np.zeros((20, 30), np.uint8)
    two[2:5, 2:5] = 1
    two[8:18, 10:25] = 1
    polygon = mask_to_polygon(two)
    assert polygon.min(0).tolist() == [10.25, 8.25] and polygon.max(0).tolist() == [24.75, 17.75]
    assert mask_to_polygon(np.zeros((5, 5), np.uint8)).shape == (0, 2)
    one = np.zeros((5, 5), np.uint8)
    one[2, 3] = 1  # a single pixel is a small square around its centre
    assert (polygons_to_masks([mask_to_polygon(one)], (5, 5))[0] == one).all()
    normalised = masks_to_polygons(torch.from_numpy(two[None]), normalize=True)
    assert len(normalised) == 1 and normalised[0].max() < 1 and normalised[0].min() > 0
    pixels = normalized_to_pixels(normalised, 30, 20)[0]
    assert np.allclose(pixels, polygon, atol=1e-4)


def test_rle_agrees_with_pycocotools_both_ways() -> None:
    """Our codec against pycocotools' (an independent implementation of COCO's format), on random outlines and the
    edge cases: empty, full, a first pixel set, long runs (multi-character and negative deltas)."""
    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(4)
    masks = list(polygons_to_masks([star(rng, (20, 15), 12), star(rng, (10, 20), 8)], (30, 40)))
    masks += [np.zeros((30, 40), np.uint8), np.ones((30, 40), np.uint8), np.eye(30, 40, dtype=np.uint8),
              (rng.random((300, 500)) < 0.003).astype(np.uint8), polygons_to_masks([circle((250, 150), 140)],
                                                                                   (300, 500))[0]]
    for mask in masks:
        ours = rle_encode(mask[None])[0]
        theirs = mask_utils.encode(np.asfortranarray(mask))
        assert ours == {"size": list(mask.shape), "counts": theirs["counts"].decode()}
        assert (rle_decode(theirs, mask.shape) == mask).all() and (rle_decode(ours) == mask).all()
        assert rle_area(ours) == mask.sum() == int(mask_utils.area(theirs))
        uncompressed = {"size": list(mask.shape), "counts": rle_counts(ours)[1]}
        assert mask_utils.frPyObjects(uncompressed, *mask.shape)["counts"] == theirs["counts"]
        assert (rle_decode(uncompressed) == mask).all()
    assert len(rle_encode(torch.zeros(3, 4, 5))) == 3 and rle_encode(np.zeros((0, 3, 3))) == []


@pytest.mark.parametrize("rle, reason", [
    ({"size": [4, 4]}, "needs 'size' and 'counts'"),
    ([16], "needs 'size' and 'counts'"),
    ({"size": [4, -4], "counts": [16]}, "positive integers"),
    ({"size": [4, True], "counts": [16]}, "positive integers"),
    ({"size": [4, 4], "counts": [2, 100000000, 3]}, "add up to"),
    ({"size": [4, 4], "counts": [4, -1, 13]}, "non-negative"),
    ({"size": [4, 4], "counts": "0?"}, "add up to"),  # well-formed characters, 15 pixels
    ({"size": [4, 4], "counts": "0?" * 1000}, "too long"),
    ({"size": [4, 4], "counts": "\x00abc"}, "COCO's alphabet"),
    ({"size": [4, 4], "counts": "P"}, "ends inside a number"),
    ({"size": [4, 4], "counts": "O"}, "negative run"),
    ({"size": [4, 4], "counts": 12}, "string or a list"),
])
def test_bad_rles_are_refused_before_decoding(rle: dict, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        rle_decode(rle)


def test_rle_size_must_be_the_images() -> None:
    with pytest.raises(ValueError, match="differs from the image"):
        rle_counts({"size": [4, 4], "counts": [16]}, (5, 4))
    assert rle_counts({"size": [4, 4], "counts": b"<4"}, (4, 4)) == ((4, 4), [12, 4])
