"""utils/tasks/obb/rotated.py: rotated boxes' corners, exact IoU (against hand-computed areas and shapely, an
independent polygon library), ProbIoU's properties, and rotated NMS."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from shapely.geometry import Polygon

from utils.tasks.obb.rotated import (
    corners2xywhr,
    nms_rotated,
    probiou,
    probiou_matrix,
    regularize,
    rotated_iou,
    rotated_iou_pairs,
    rotated_non_max_suppression,
    xywhr2corners,
)


def random_boxes(generator: torch.Generator, n: int) -> torch.Tensor:
    centres = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 20
    sizes = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 10 + 0.5
    angles = (torch.rand(n, 1, generator=generator, dtype=torch.float64) - 0.5) * 4
    return torch.cat((centres, sizes, angles), 1)


def shapely_iou(box1: torch.Tensor, box2: torch.Tensor) -> float:
    first, second = Polygon(xywhr2corners(box1).tolist()), Polygon(xywhr2corners(box2).tolist())
    inter = first.intersection(second).area
    return inter / (first.area + second.area - inter)


def test_corners_by_hand_and_back() -> None:
    box = torch.tensor([10.0, 20.0, 4.0, 2.0, 0.0])
    assert xywhr2corners(box).tolist() == [[12.0, 21.0], [8.0, 21.0], [8.0, 19.0], [12.0, 19.0]]
    turned = xywhr2corners(torch.tensor([0.0, 0.0, 4.0, 2.0, math.pi / 2]))
    assert torch.allclose(turned, torch.tensor([[-1.0, 2.0], [-1.0, -2.0], [1.0, -2.0], [1.0, 2.0]]), atol=1e-6)
    # a quarter turn is the same rectangle with width and height swapped: regularized to r in [0, pi/2)
    assert torch.allclose(regularize(torch.tensor([0.0, 0.0, 4.0, 2.0, math.pi / 2 + 0.3])),
                          torch.tensor([0.0, 0.0, 2.0, 4.0, 0.3]), atol=1e-6)
    assert torch.allclose(regularize(torch.tensor([0.0, 0.0, 4.0, 2.0, -0.3])),
                          torch.tensor([0.0, 0.0, 2.0, 4.0, math.pi / 2 - 0.3]), atol=1e-6)
    boxes = regularize(random_boxes(torch.Generator().manual_seed(1), 64))
    assert torch.allclose(corners2xywhr(xywhr2corners(boxes)), boxes, atol=1e-9)
    assert torch.allclose(corners2xywhr(xywhr2corners(boxes).roll(1, -2)), boxes, atol=1e-9)  # any start corner


def test_a_quadrilateral_gets_its_smallest_enclosing_rectangle() -> None:
    quad = torch.tensor([[0.0, 0.0], [4.0, 0.0], [4.0, 2.0], [0.0, 3.0]])  # a trapezoid: the 4 x 3 box encloses it
    box = corners2xywhr(quad)
    assert torch.allclose(box, torch.tensor([2.0, 1.5, 4.0, 3.0, 0.0]), atol=1e-6)
    assert Polygon(xywhr2corners(box).tolist()).buffer(1e-6).contains(Polygon(quad.tolist()))


def test_exact_iou_by_hand() -> None:
    square = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0]])
    half = torch.tensor([[1.0, 0.0, 2.0, 2.0, 0.0]])
    diamond = torch.tensor([[0.0, 0.0, 2.0, 2.0, math.pi / 4]])
    far = torch.tensor([[5.0, 5.0, 2.0, 2.0, 0.3]])
    assert rotated_iou_pairs(square, half).item() == pytest.approx(1 / 3)
    assert rotated_iou_pairs(square, diamond).item() == pytest.approx(1 / math.sqrt(2))  # an octagon 8(sqrt2 - 1)
    assert rotated_iou_pairs(square, square).item() == pytest.approx(1.0)
    assert rotated_iou_pairs(square, far).item() == 0.0
    inner = torch.tensor([[0.2, -0.1, 1.0, 0.5, 0.7]])  # inside the square: IoU is the area ratio
    assert rotated_iou_pairs(square, inner).item() == pytest.approx(0.5 / 4)


def test_exact_iou_equals_shapely_on_random_and_touching_pairs() -> None:
    generator = torch.Generator().manual_seed(0)
    first, second = random_boxes(generator, 300), random_boxes(generator, 300)
    second[:20] = first[:20]  # identical
    shift = first[20:40, 2:3] * torch.cat((torch.cos(first[20:40, 4:]), torch.sin(first[20:40, 4:])), 1)
    second[20:40] = first[20:40]
    second[20:40, :2] += shift  # sharing an edge: IoU 0
    second[40:60] = first[40:60]
    second[40:60, 4] += math.pi / 2  # the same centre, turned a quarter
    ours = rotated_iou_pairs(first, second)
    expected = torch.tensor([shapely_iou(a, b) for a, b in zip(first, second)], dtype=torch.float64)
    assert (ours - expected).abs().max() < 1e-9
    assert (expected > 0).sum() > 100  # the comparison covers overlapping pairs, not only zeros
    matrix = rotated_iou(first[:30], second[:40])
    pairs = rotated_iou_pairs(first[:30].repeat_interleave(40, 0), second[:40].repeat(30, 1)).view(30, 40)
    assert torch.allclose(matrix, pairs, atol=1e-12)
    assert rotated_iou(first[:0], second).shape == (0, 300)


def test_probiou_properties() -> None:
    generator = torch.Generator().manual_seed(2)
    boxes = random_boxes(generator, 50)
    assert torch.allclose(probiou(boxes, boxes), torch.ones(50, dtype=torch.float64), atol=1e-3)
    turned = boxes[:, [0, 1, 3, 2, 4]].clone()
    turned[:, 4] += math.pi / 2  # the same rectangle
    other = random_boxes(generator, 50)
    assert torch.allclose(probiou(turned, other), probiou(boxes, other), atol=1e-9)
    assert torch.allclose(probiou(boxes, other), probiou(other, boxes), atol=1e-12)
    far = boxes.clone()
    far[:, :2] += 1000
    assert (probiou(boxes, far) < 1e-3).all()
    near = boxes.clone()
    near[:, 0] += 0.1
    assert (probiou(boxes, near) > probiou(boxes, near + torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64))).all()
    assert probiou_matrix(boxes[:3], other[:4]).shape == (3, 4)
    exact, prob = rotated_iou_pairs(boxes, other), probiou(boxes, other)
    assert np.corrcoef(exact.numpy(), prob.numpy())[0, 1] > 0.8  # they rank overlaps alike


@pytest.mark.parametrize("kind", ["polygon", "probiou"])
def test_nms_is_exact_greedy(kind: str) -> None:
    boxes = torch.tensor([[0.0, 0.0, 4.0, 2.0, 0.0],  # best
                          [0.5, 0.0, 4.0, 2.0, 0.0],  # overlaps the best: suppressed
                          [1.8, 0.0, 4.0, 2.0, 0.0],  # overlaps only the suppressed one enough: kept
                          [10.0, 10.0, 2.0, 2.0, 0.5]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    iou = rotated_iou(boxes, boxes) if kind == "polygon" else probiou_matrix(boxes, boxes)
    threshold = float((iou[0, 2] + iou[1, 2]) / 2)  # between: 1 suppresses 2, 0 does not
    assert iou[0, 1] > threshold and iou[0, 2] < threshold
    assert nms_rotated(boxes, scores, threshold, kind).tolist() == [0, 2, 3]
    assert nms_rotated(boxes[:0], scores[:0], 0.5).numel() == 0
    with pytest.raises(ValueError, match="polygon, probiou"):
        nms_rotated(boxes, scores, 0.5, "box")


def test_rotated_non_max_suppression_rows() -> None:
    # (1, 4, 4 + 2 + 1): two overlapping boxes of class 0, one on top of them of class 1, one below the threshold
    rows = torch.tensor([[[10.0, 10.0, 8.0, 4.0, 0.9, 0.1, 0.3],
                          [10.5, 10.0, 8.0, 4.0, 0.8, 0.0, 0.3],
                          [10.0, 10.0, 8.0, 4.0, 0.2, 0.7, 0.3],
                          [30.0, 30.0, 8.0, 4.0, 0.1, 0.1, 0.0]]])
    det = rotated_non_max_suppression(rows, conf_thres=0.25, iou_thres=0.5)[0]
    expected = torch.tensor([[10.0, 10.0, 8.0, 4.0, 0.3, 0.9, 0.0], [10.0, 10.0, 8.0, 4.0, 0.3, 0.7, 1.0]])
    assert torch.allclose(det, expected)
    assert rotated_non_max_suppression(rows, 0.25, 0.5, agnostic=True)[0][:, 6].tolist() == [0.0]
    assert rotated_non_max_suppression(rows, 0.25, 0.5, classes=[1])[0][:, 6].tolist() == [1.0]
    multi = rotated_non_max_suppression(rows, 0.05, 0.5, multi_label=True)[0]
    assert sorted(multi[:, 6].tolist()) == [0.0, 0.0, 1.0, 1.0]  # the far box's two classes and one of each pair
    assert len(rotated_non_max_suppression(rows, 0.25, 0.5, max_det=1)[0]) == 1


def test_nms_in_blocks_equals_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator().manual_seed(3)
    boxes = random_boxes(generator, 300)
    scores = torch.rand(300, generator=generator, dtype=torch.float64)
    whole = nms_rotated(boxes, scores, 0.3, "polygon")
    monkeypatch.setattr("utils.tasks.obb.rotated.NMS_BLOCK", 7)  # 43 blocks, rows suppressed across blocks
    assert torch.equal(nms_rotated(boxes, scores, 0.3, "polygon"), whole)
    assert 20 < len(whole) < 290  # a scene where suppression happens and leaves many
