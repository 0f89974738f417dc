"""utils.boxes against torchvision (IoU, NMS) and round trips of the box formats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision

from utils.boxes import (
    bbox_iou,
    box_iou,
    clip_boxes,
    non_max_suppression,
    scale_boxes,
    xywh2xyxy,
    xywhn2xyxy,
    xyxy2xywh,
    xyxy2xywhn,
)


def _random_boxes(n: int, generator: torch.Generator, size: float = 100.0) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=generator) * size
    wh = torch.rand(n, 2, generator=generator) * size / 2 + 1
    return torch.cat((xy, xy + wh), 1)


def test_box_iou_matches_torchvision():
    g = torch.Generator().manual_seed(0)
    a, b = _random_boxes(50, g), _random_boxes(40, g)
    assert torch.allclose(box_iou(a, b), torchvision.ops.box_iou(a, b), atol=1e-6)


def test_bbox_iou_elementwise_matches_pairwise():
    g = torch.Generator().manual_seed(1)
    a, b = _random_boxes(30, g), _random_boxes(30, g)
    pairwise = torchvision.ops.box_iou(a, b).diagonal()
    assert torch.allclose(bbox_iou(a, b, xywh=False), pairwise, atol=1e-5)
    assert torch.allclose(bbox_iou(xyxy2xywh(a), xyxy2xywh(b), xywh=True), pairwise, atol=1e-5)
    giou = bbox_iou(a, b, xywh=False, kind="giou")
    assert torch.allclose(giou, torchvision.ops.generalized_box_iou(a, b).diagonal(), atol=1e-5)
    assert torch.all(bbox_iou(a, b, xywh=False, kind="ciou") <= bbox_iou(a, b, xywh=False) + 1e-6)


def test_nms_matches_torchvision():
    g = torch.Generator().manual_seed(2)
    n, nc = 200, 1
    boxes = _random_boxes(n, g)
    obj = torch.rand(n, 1, generator=g) * 0.9 + 0.1
    pred = torch.cat((xyxy2xywh(boxes), obj, torch.ones(n, nc)), 1)[None]  # class score 1: conf = obj
    out = non_max_suppression(pred, conf_thres=0.0, iou_thres=0.5, max_det=1000)[0]
    keep = torchvision.ops.nms(boxes, obj[:, 0], 0.5)
    assert torch.allclose(out[:, :4], boxes[keep], atol=1e-4)
    assert torch.allclose(out[:, 4], obj[keep, 0])


def test_nms_per_class_and_agnostic():
    # Two identical boxes of different classes: per-class NMS keeps both, agnostic keeps one.
    pred = torch.tensor([[[50, 50, 20, 20, 0.9, 1.0, 0.0], [50, 50, 20, 20, 0.8, 0.0, 1.0]]])
    assert len(non_max_suppression(pred, 0.1, 0.5)[0]) == 2
    assert len(non_max_suppression(pred, 0.1, 0.5, agnostic=True)[0]) == 1
    multi = torch.tensor([[[50, 50, 20, 20, 0.9, 0.8, 0.7]]])
    assert len(non_max_suppression(multi, 0.1, 0.5, multi_label=True)[0]) == 2
    assert len(non_max_suppression(multi, 0.1, 0.5, multi_label=False)[0]) == 1
    with pytest.raises(ValueError):
        non_max_suppression(pred, 1.5, 0.5)


def test_format_round_trips():
    g = torch.Generator().manual_seed(3)
    boxes = _random_boxes(20, g)
    assert torch.allclose(xywh2xyxy(xyxy2xywh(boxes)), boxes, atol=1e-4)
    norm = xyxy2xywhn(boxes, w=200, h=100)
    assert torch.allclose(xywhn2xyxy(norm, w=200, h=100), boxes, atol=1e-4)
    arr = boxes.numpy()
    assert np.allclose(xywh2xyxy(xyxy2xywh(arr)), arr, atol=1e-4)


def test_scale_boxes_undoes_letterbox():
    # Original 100 (h) x 200 (w) letterboxed to 64 x 64: gain 0.32, vertical pad (64 - 32) / 2 = 16.
    original = torch.tensor([[20.0, 10.0, 180.0, 90.0]])
    letterboxed = original * 0.32 + torch.tensor([0, 16, 0, 16])
    back = scale_boxes((64, 64), letterboxed.clone(), (100, 200))
    assert torch.allclose(back, original, atol=1e-4)
    back2 = scale_boxes((64, 64), letterboxed.clone(), (100, 200), ratio_pad=((0.32, 0.32), (0.0, 16.0)))
    assert torch.allclose(back2, original, atol=1e-4)
    clipped = clip_boxes(torch.tensor([[-5.0, -5.0, 300.0, 300.0]]), (100, 200))
    assert clipped.tolist() == [[0.0, 0.0, 200.0, 100.0]]
