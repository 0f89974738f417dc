"""The task-aligned assigner on cases worked out by hand: one box, competing boxes, small boxes, one-to-one."""

from __future__ import annotations

import pytest
import torch

from utils.boxes import bbox_iou
from utils.training.tal import TaskAlignedAssigner, bbox2dist, dist2bbox, make_anchors

POINTS = make_anchors([(4, 4)], [8])[0] * 8  # 16 cell centres of one stride-8 level, in pixels: (4, 4) ... (28, 28)
FAR = [200.0, 200.0, 201.0, 201.0]  # a predicted box that overlaps nothing


def predictions(boxes: dict[int, list[float]], nc: int = 2, score: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores (1, 16, nc) all ``score``, predicted boxes (1, 16, 4): ``boxes`` at the given cells, FAR elsewhere)."""
    pd_boxes = torch.tensor([FAR] * 16).unsqueeze(0)
    for cell, box in boxes.items():
        pd_boxes[0, cell] = torch.tensor(box)
    return torch.full((1, 16, nc), score), pd_boxes


def ground_truth(*boxes: tuple[int, list[float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    labels = torch.tensor([[[float(c)] for c, _ in boxes]])
    return labels, torch.tensor([[b for _, b in boxes]]), torch.ones(1, len(boxes), 1, dtype=torch.bool)


def test_box_distances_round_trip() -> None:
    points = torch.tensor([[4.0, 4.0], [10.0, 2.0]])
    boxes = torch.tensor([[0.0, 1.0, 9.0, 6.0], [2.0, 0.0, 30.0, 3.0]])
    dist = bbox2dist(points, boxes)
    assert dist.tolist() == [[4.0, 3.0, 5.0, 2.0], [8.0, 2.0, 20.0, 1.0]]
    torch.testing.assert_close(dist2bbox(dist, points, xywh=False), boxes)
    assert dist2bbox(dist, points).tolist()[0] == [4.5, 3.5, 9.0, 5.0]  # xywh
    assert bbox2dist(points, boxes, reg_max=15).max().item() == pytest.approx(14.99)


def test_one_box_takes_its_best_cells_with_normalised_targets() -> None:
    """Cells 0, 1, 4, 5 have their centres in [0, 0, 16, 16]; with top 2, the exact prediction (cell 0) and the better
    of cells 1 and 5 are assigned; targets: 1 at the best cell, (ciou / best ciou) ** 6 x best ciou at the other."""
    gt = [0.0, 0.0, 16.0, 16.0]
    scores, boxes = predictions({0: gt, 1: [0.0, 0.0, 16.0, 8.0], 5: [4.0, 4.0, 20.0, 20.0], 4: FAR})
    assigned = TaskAlignedAssigner(topk=2, num_classes=2, strides=None)(scores, boxes, POINTS, *ground_truth((1, gt)))
    ciou = {c: bbox_iou(torch.tensor(gt), boxes[0, c], xywh=False, kind="ciou").item() for c in (1, 5)}
    second = max(ciou, key=ciou.get)
    assert torch.nonzero(assigned.foreground[0]).view(-1).tolist() == sorted([0, second])
    assert assigned.labels[0, 0] == 1 and assigned.boxes[0, second].tolist() == gt
    assert assigned.scores[0, 0].tolist() == pytest.approx([0.0, 1.0])
    assert assigned.scores[0, second, 1].item() == pytest.approx(ciou[second] ** 6, rel=1e-4)
    assert assigned.scores[0, ~assigned.foreground[0]].abs().sum() == 0


def test_a_cell_claimed_by_two_boxes_goes_to_the_one_it_overlaps_most() -> None:
    """Both boxes hold cell 5's centre (12, 12); its prediction equals box B, so B keeps it."""
    box_a, box_b = [0.0, 0.0, 16.0, 16.0], [8.0, 8.0, 24.0, 24.0]
    scores, boxes = predictions({5: box_b, 0: box_a, 10: box_b})
    assigned = TaskAlignedAssigner(topk=2, num_classes=2, strides=None)(
        scores, boxes, POINTS, *ground_truth((0, box_a), (1, box_b)))
    assert assigned.foreground[0, 5] and assigned.gt_index[0, 5] == 1 and assigned.labels[0, 5] == 1
    assert assigned.foreground[0, 0] and assigned.gt_index[0, 0] == 0


def test_small_boxes_are_widened_to_the_second_stride() -> None:
    """A 2 px box holds no cell centre; widened to 16 px about its centre (6, 6) it holds cells 0, 1, 4, 5."""
    tiny = [5.0, 5.0, 7.0, 7.0]
    scores, boxes = predictions({0: tiny, 1: tiny, 4: tiny, 5: tiny})
    gts = ground_truth((0, tiny))
    plain = TaskAlignedAssigner(topk=10, num_classes=2, strides=None)(scores, boxes, POINTS, *gts)
    widened = TaskAlignedAssigner(topk=10, num_classes=2, strides=(8, 16, 32))(scores, boxes, POINTS, *gts)
    assert not plain.foreground.any()
    assert torch.nonzero(widened.foreground[0]).view(-1).tolist() == [0, 1, 4, 5]
    assert widened.boxes[0, 0].tolist() == tiny  # the target is still the box itself


def test_one_to_one_keeps_a_single_cell_per_box() -> None:
    gt = [0.0, 0.0, 16.0, 16.0]
    scores, boxes = predictions({0: [0.0, 0.0, 15.0, 15.0], 1: gt, 4: [1.0, 1.0, 16.0, 16.0], 5: gt})
    assigned = TaskAlignedAssigner(topk=7, num_classes=2, strides=None, topk2=1)(scores, boxes, POINTS,
                                                                                   *ground_truth((0, gt)))
    assert assigned.foreground.sum() == 1 and assigned.foreground[0, 1]  # the first of the two exact predictions
    assert assigned.scores[0, 1, 0].item() == pytest.approx(1.0)


def test_padded_rows_and_images_without_boxes_assign_nothing() -> None:
    scores, boxes = predictions({0: [0.0, 0.0, 16.0, 16.0]})
    labels, gt_boxes, mask = ground_truth((0, [0.0, 0.0, 16.0, 16.0]))
    mask[:] = False  # the row is padding
    assigner = TaskAlignedAssigner(topk=10, num_classes=2)
    assert not assigner(scores, boxes, POINTS, labels, gt_boxes, mask).foreground.any()
    empty = assigner(scores, boxes, POINTS, labels[:, :0], gt_boxes[:, :0], mask[:, :0])
    assert not empty.foreground.any() and (empty.labels == 2).all() and empty.scores.sum() == 0


def test_batched_assignment_equals_one_image_at_a_time() -> None:
    torch.manual_seed(0)
    b, n, nc, m = 3, 64, 4, 5
    points = make_anchors([(8, 8)], [8])[0] * 8
    scores = torch.rand(b, n, nc)
    centres, sizes = torch.rand(b, n, 2) * 64, torch.rand(b, n, 2) * 30 + 2
    boxes = torch.cat((centres - sizes / 2, centres + sizes / 2), -1)
    gt_c, gt_s = torch.rand(b, m, 2) * 64, torch.rand(b, m, 2) * 30 + 1
    gt_boxes = torch.cat((gt_c - gt_s / 2, gt_c + gt_s / 2), -1)
    labels = torch.randint(0, nc, (b, m, 1)).float()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool).unsqueeze(-1)
    assigner = TaskAlignedAssigner(topk=10, num_classes=nc, strides=(8, 16))
    batched = assigner(scores, boxes, points, labels, gt_boxes, mask)
    for i in range(b):
        k = int(mask[i].sum())
        single = assigner(scores[i:i + 1], boxes[i:i + 1], points, labels[i:i + 1, :k], gt_boxes[i:i + 1, :k],
                          mask[i:i + 1, :k])
        assert torch.equal(single.foreground[0], batched.foreground[i])
        torch.testing.assert_close(single.scores[0], batched.scores[i])
        torch.testing.assert_close(single.boxes[0][single.foreground[0]], batched.boxes[i][batched.foreground[i]])
    assert batched.foreground.sum() > 10
