"""utils/tasks/segment/mask_loss.py: the mask term by hand, ~0 for a perfect prediction, the two mask layouts alike,
and each family's reduction."""

from __future__ import annotations

import math

import pytest
import torch

from utils.tasks.segment.mask_loss import (
    anchor_free_mask_loss,
    fit_masks,
    gather_masks,
    instance_mask_loss,
    object_indices,
    yolov5_mask_loss,
)
from utils.tasks.segment.masks import overlap_index


def bce(logit: float, target: float) -> float:
    p = 1 / (1 + math.exp(-logit))
    return -(target * math.log(p) + (1 - target) * math.log(1 - p))


def test_one_positive_by_hand() -> None:
    """nm = 1, 2x2 prototypes, a box over the left column: the loss is the mean BCE of the two pixels inside."""
    protos = torch.tensor([[[0.5, -2.0], [1.5, 3.0]]])  # (1, 2, 2)
    coefficients = torch.tensor([[2.0]])  # logits: 1, -4 / 3, 6
    gt = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    box = torch.tensor([[0.0, 0.0, 1.0, 2.0]])  # left column: pixels (0, 0) and (1, 0)
    area = torch.tensor([0.5])  # 1 x 2 of 2 x 2
    loss = instance_mask_loss(gt, coefficients, protos, box, area)
    expected = (bce(1.0, 1.0) + bce(3.0, 0.0)) / 4 / 0.5
    assert loss.shape == (1,) and loss.item() == pytest.approx(expected, rel=1e-6)


def test_a_perfect_prediction_costs_nothing() -> None:
    gt = torch.zeros(3, 16, 16)
    gt[0, 2:8, 2:8], gt[1, 8:14, 3:12], gt[2, 0:16, 10:16] = 1, 1, 1
    protos = (gt * 2 - 1) * 30  # one prototype per object, +-30 logits
    coefficients = torch.eye(3)
    boxes = torch.tensor([[0.0, 0, 16, 16]] * 3)
    loss = instance_mask_loss(gt, coefficients, protos, boxes, torch.ones(3))
    assert (loss < 1e-9).all()
    wrong = instance_mask_loss(1 - gt, coefficients, protos, boxes, torch.ones(3))
    assert (wrong > 10).all()


def test_only_the_box_counts_and_the_area_normalises() -> None:
    gt = torch.zeros(1, 8, 8)
    protos = torch.zeros(1, 8, 8)  # every logit 0: BCE log 2 everywhere
    coefficients = torch.ones(1, 1)
    small = instance_mask_loss(gt, coefficients, protos, torch.tensor([[0.0, 0, 2, 2]]), torch.tensor([4 / 64]))
    large = instance_mask_loss(gt, coefficients, protos, torch.tensor([[0.0, 0, 8, 8]]), torch.tensor([1.0]))
    assert small.item() == pytest.approx(math.log(2)) and large.item() == pytest.approx(math.log(2))
    protos[0, 4:, 4:] = 50.0  # outside the small box: changes only the large box's loss
    assert instance_mask_loss(gt, coefficients, protos, torch.tensor([[0.0, 0, 2, 2]]),
                              torch.tensor([4 / 64])).item() == pytest.approx(math.log(2))


def test_overlap_and_stacked_layouts_give_the_same_targets() -> None:
    polygons = [torch.tensor([[0, 0], [40, 0], [40, 40], [0, 40]]).numpy(),
                torch.tensor([[10, 10], [20, 10], [20, 20], [10, 20]]).numpy()]
    index, order = overlap_index(polygons, (48, 48))  # labels are put in `order` (largest first)
    image_of_target = torch.tensor([0, 0])
    ranks = object_indices(image_of_target, overlap=True)
    assert ranks.tolist() == [1, 2] and object_indices(torch.tensor([0, 0, 1, 1, 1])).tolist() == [1, 2, 1, 2, 3]
    assert object_indices(torch.tensor([0, 1, 1]), overlap=False).tolist() == [0, 1, 2]
    from_index = gather_masks(torch.from_numpy(index)[None], 0, ranks, overlap=True)
    assert from_index[1].sum() == 100 and from_index[0].sum() == 1600 - 100  # the small one on top
    stacked = from_index.clone()
    assert torch.equal(gather_masks(stacked, 0, torch.tensor([0, 1]), overlap=False), from_index)
    assert fit_masks(torch.from_numpy(index)[None], (12, 12)).shape == (1, 12, 12)
    assert fit_masks(torch.from_numpy(index)[None], (12, 12))[0, 3, 3] == 2  # sample (12, 12) -> inside the small


def two_images() -> dict:
    """Two 32x32 images at 8x8 prototypes: image 0 has two objects, image 1 one (overlap index images)."""
    index = torch.zeros(2, 32, 32, dtype=torch.uint8)
    index[0, 0:16, 0:16] = 1
    index[0, 16:32, 16:32] = 2
    index[1, 8:24, 4:28] = 1
    gen = torch.Generator().manual_seed(0)
    protos = torch.randn(2, 4, 8, 8, generator=gen, requires_grad=True)
    return {"index": index, "protos": protos, "gen": gen}


def test_yolov5_reduction_is_the_mean_per_image_summed() -> None:
    data = two_images()
    protos, index = data["protos"], data["index"]
    coefficients = torch.randn(4, 4, generator=data["gen"], requires_grad=True)
    level = {"image": torch.tensor([0, 0, 0, 1]), "index": torch.tensor([1, 2, 2, 1]), "coefficients": coefficients,
             "xywh": torch.tensor([[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5],
                                   [0.5, 0.5, 0.75, 0.5]])}
    total = yolov5_mask_loss(protos, [level, level], index)
    small = fit_masks(index, (8, 8))
    expected = 0.0
    for image, rows in ((0, [0, 1, 2]), (1, [3])):
        per = []
        for r in rows:
            gt = (small[image] == level["index"][r]).float()[None]
            cx, cy, w, h = level["xywh"][r].tolist()
            box = torch.tensor([[(cx - w / 2) * 8, (cy - h / 2) * 8, (cx + w / 2) * 8, (cy + h / 2) * 8]])
            per.append(instance_mask_loss(gt, coefficients[r:r + 1], protos[image], box, torch.tensor([w * h])))
        expected += torch.cat(per).mean()
    assert total.item() == pytest.approx(2 * expected.item(), rel=1e-6)  # two levels
    total.backward()
    assert torch.isfinite(protos.grad).all() and coefficients.grad.abs().sum() > 0
    nothing = yolov5_mask_loss(protos, [], index)
    assert nothing.item() == 0 and nothing.requires_grad


def test_anchor_free_reduction_is_the_sum_over_the_positives_count() -> None:
    data = two_images()
    protos, index = data["protos"], data["index"]
    coefficients = torch.randn(2, 5, 4, generator=data["gen"], requires_grad=True)  # 5 anchor points
    foreground = torch.tensor([[True, False, True, True, False], [False, True, False, False, False]])
    object_index = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 0, 0]])  # 0-based within the image
    boxes = torch.zeros(2, 5, 4)
    boxes[0, [0]] = torch.tensor([0.0, 0, 16, 16])
    boxes[0, [2, 3]] = torch.tensor([16.0, 16, 32, 32])
    boxes[1, 1] = torch.tensor([4.0, 8, 28, 24])
    total = anchor_free_mask_loss(protos, coefficients, foreground, object_index, boxes, (32, 32), index)
    small = fit_masks(index, (8, 8))
    parts = []
    for image, point in ((0, 0), (0, 2), (0, 3), (1, 1)):
        gt = (small[image] == object_index[image, point] + 1).float()[None]
        box = boxes[image, point][None]
        area = (box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]) / (32 * 32)
        parts.append(instance_mask_loss(gt, coefficients[image, point][None], protos[image], box / 4, area))
    assert total.item() == pytest.approx(torch.cat(parts).sum().item() / 4, rel=1e-6)
    stacked = torch.stack([small[0] == 1, small[0] == 2, small[1] == 1]).float()
    same = anchor_free_mask_loss(protos, coefficients, foreground, object_index, boxes, (32, 32), stacked,
                                 image_of_target=torch.tensor([0, 0, 1]), overlap=False)
    assert same.item() == pytest.approx(total.item(), rel=1e-6)
    total.backward()
    assert coefficients.grad[0, 1].abs().sum() == 0 and coefficients.grad[0, 0].abs().sum() > 0
    none = anchor_free_mask_loss(protos, coefficients, torch.zeros_like(foreground), object_index, boxes, (32, 32),
                                 index)
    assert none.item() == 0 and none.requires_grad
