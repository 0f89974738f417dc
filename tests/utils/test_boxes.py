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


def _reference_nms(prediction: torch.Tensor, conf_thres: float = 0.25, iou_thres: float = 0.45,
                   classes: list[int] | None = None, agnostic: bool = False, multi_label: bool = False,
                   max_det: int = 300, max_nms: int = 30000, stable: bool = False) -> list[torch.Tensor]:
    """The implementation before the vectorised one, kept verbatim as the independent reference.

    ``stable`` breaks ties between equal scores by candidate order instead of the unstable sorts' arbitrary
    order (a stable sort, then NMS given descending ranks as scores): the only change, for tied scores.
    """
    nc = prediction.shape[2] - 5
    multi_label &= nc > 1
    output = [torch.zeros((0, 6), device=prediction.device)] * prediction.shape[0]
    for i, x in enumerate(prediction):  # (n, 5 + nc)
        x = x[x[:, 4] > conf_thres]
        if not x.shape[0]:
            continue
        scores = x[:, 5:] * x[:, 4:5]
        boxes = xywh2xyxy(x[:, :4])
        if multi_label:
            idx, cls = (scores > conf_thres).nonzero(as_tuple=False).T
            det = torch.cat((boxes[idx], scores[idx, cls, None], cls[:, None].float()), 1)
        else:
            conf, cls = scores.max(1, keepdim=True)
            det = torch.cat((boxes, conf, cls.float()), 1)[conf.view(-1) > conf_thres]
        if classes is not None:
            det = det[(det[:, 5:6] == torch.tensor(classes, device=det.device)).any(1)]
        if not det.shape[0]:
            continue
        det = det[det[:, 4].argsort(descending=True, stable=stable)[:max_nms]]
        group = torch.zeros_like(det[:, 5]) if agnostic else det[:, 5]
        order = torch.arange(det.shape[0], 0, -1, dtype=det.dtype, device=det.device) if stable else det[:, 4]
        keep = torchvision.ops.batched_nms(det[:, :4], order, group, iou_thres)[:max_det]
        output[i] = det[keep]
    return output


def _random_prediction(batch: int, n: int, nc: int, seed: int, size: float = 160.0) -> torch.Tensor:
    """Uniform random decoded predictions (b, n, 5 + nc): xywh in pixels, objectness, class scores."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(batch, n, 2, generator=g) * size
    wh = torch.rand(batch, n, 2, generator=g) * size / 4 + 2
    return torch.cat((xy, wh, torch.rand(batch, n, 1 + nc, generator=g)), 2)


def _realistic_prediction(batch: int, nc: int, seed: int, size: float = 160.0, n: int = 1575) -> torch.Tensor:
    """Predictions shaped like a trained detector's at 160 px (3 x (20^2 + 10^2 + 5^2) = 1575 rows): a few
    objects, each seen by ~30 rows with jittered boxes and high scores for its class, and background rows
    with objectness 1e-4..0.03 and low class scores, so conf 0.001 leaves hundreds of candidates."""
    g = torch.Generator().manual_seed(seed)
    pred = torch.empty(batch, n, 5 + nc)
    pred[..., :2] = torch.rand(batch, n, 2, generator=g) * size
    pred[..., 2:4] = torch.exp(torch.rand(batch, n, 2, generator=g) * 3) * 4  # 4..80 px
    pred[..., 4] = 10 ** (torch.rand(batch, n, generator=g) * 2.5 - 4)
    pred[..., 5:] = torch.sigmoid(torch.randn(batch, n, nc, generator=g) * 1.5 - 3)
    rows_per_object = 30
    for image in range(batch):
        objects = int(torch.randint(2, 9, (1,), generator=g))
        rows = torch.randperm(n, generator=g)[:objects * rows_per_object].view(objects, rows_per_object)
        for rows_of_object in rows:
            centre, wh = torch.rand(2, generator=g) * size, torch.rand(2, generator=g) * 60 + 10
            jitter = torch.randn(rows_per_object, 4, generator=g) * 0.1
            pred[image, rows_of_object, :2] = centre + jitter[:, :2] * wh
            pred[image, rows_of_object, 2:4] = wh * torch.exp(jitter[:, 2:])
            pred[image, rows_of_object, 4] = torch.rand(rows_per_object, generator=g) * 0.65 + 0.3
            pred[image, rows_of_object, 5 + int(torch.randint(nc, (1,), generator=g))] = \
                torch.rand(rows_per_object, generator=g) * 0.5 + 0.49
    return pred


def _has_tied_scores(prediction: torch.Tensor, conf_thres: float) -> bool:
    """Whether two candidates of an image have the same score: the reference's unstable sort then orders them
    arbitrarily, and only a reference with ties broken by candidate order can be compared exactly."""
    for x in prediction:
        scores = (x[:, 5:] * x[:, 4:5])[x[:, 4] > conf_thres]
        scores = scores[scores > conf_thres]
        if scores.unique().numel() < scores.numel():
            return True
    return False


def _assert_same(new: list[torch.Tensor], reference: list[torch.Tensor]) -> None:
    assert len(new) == len(reference)
    for got, want in zip(new, reference):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape)
        assert torch.equal(got, want)


def _assert_matches_reference(pred: torch.Tensor, conf_thres: float, iou_thres: float, **kwargs) -> None:
    """Bit for bit the reference's result: verbatim where no scores tie, with ties in candidate order otherwise."""
    stable = _has_tied_scores(pred, conf_thres)
    _assert_same(non_max_suppression(pred, conf_thres, iou_thres, **kwargs),
                 _reference_nms(pred, conf_thres, iou_thres, stable=stable, **kwargs))


NMS_CASES = [  # (conf_thres, iou_thres, keyword arguments)
    (0.001, 0.6, {"multi_label": True, "max_det": 300}),  # validation
    (0.001, 0.6, {"multi_label": False, "max_det": 300}),
    (0.001, 0.6, {"multi_label": True, "agnostic": True, "max_det": 300}),
    (0.001, 0.6, {"multi_label": True, "classes": [0, 2], "max_det": 300}),
    (0.25, 0.45, {"max_det": 1000}),  # detect.py defaults
    (0.25, 0.45, {"classes": [1], "agnostic": True, "max_det": 1000}),
    (0.001, 0.6, {"multi_label": True, "max_det": 7}),  # max_det caps, few survivors per pass
    (0.001, 0.6, {"multi_label": True, "max_det": 300, "max_nms": 50}),  # max_nms caps
    (0.001, 0.5, {"multi_label": True, "max_det": 1}),
]


@pytest.mark.parametrize(("conf_thres", "iou_thres", "kwargs"), NMS_CASES)
def test_nms_matches_reference_on_realistic_predictions(conf_thres: float, iou_thres: float, kwargs: dict):
    pred = _realistic_prediction(batch=4, nc=3, seed=0)
    assert not _has_tied_scores(pred, conf_thres)  # so the comparison is with the verbatim reference
    _assert_matches_reference(pred, conf_thres, iou_thres, **kwargs)


@pytest.mark.parametrize(("conf_thres", "iou_thres", "kwargs"), NMS_CASES)
@pytest.mark.parametrize(("n", "nc", "seed"), [(150, 3, 1), (2000, 3, 2), (300, 12, 3)])
def test_nms_matches_reference_on_random_predictions(n: int, nc: int, seed: int, conf_thres: float,
                                                     iou_thres: float, kwargs: dict):
    # 150 boxes: few candidates, class-offset boxes in one nms call (torchvision below 1000 boxes);
    # 2000 and 300 x 12 classes: thousands of candidates, nms class by class.
    pred = _random_prediction(batch=3, n=n, nc=nc, seed=seed)
    pred[1, :, 4] = 0  # an image without candidates
    _assert_matches_reference(pred, conf_thres, iou_thres, **kwargs)


def test_nms_single_class_and_float64_match_reference():
    pred = _realistic_prediction(batch=2, nc=1, seed=4).double()
    for multi_label in (False, True):
        _assert_matches_reference(pred, 0.001, 0.6, multi_label=multi_label)


def test_nms_breaks_score_ties_by_candidate_order():
    # Scores on a coarse grid tie often; the result is that of a stable sort (ties in (box, class) order).
    pred = _realistic_prediction(batch=2, nc=3, seed=5)
    pred[..., 4:] = (pred[..., 4:] * 20).round() / 20
    for kwargs in ({"multi_label": True}, {"multi_label": True, "max_det": 5}, {"agnostic": True}):
        _assert_same(non_max_suppression(pred, 0.001, 0.6, **kwargs),
                     _reference_nms(pred, 0.001, 0.6, stable=True, **kwargs))
    # Hand-computed: two equal boxes with equal scores; the first row's wins, whichever class it has.
    pair = torch.tensor([[[50, 50, 20, 20, 0.5, 0.0, 1.0], [50, 50, 20, 20, 0.5, 1.0, 0.0]]])
    assert non_max_suppression(pair, 0.1, 0.5, agnostic=True)[0].tolist() == [[40, 40, 60, 60, 0.5, 1.0]]


def test_nms_hand_computed_survivors_beyond_the_first_pass():
    # 30 copies of one box (scores 0.99 down to 0.70) above 10 separate boxes (0.50 down to 0.41), one class.
    # The first pass (the 20 best) keeps only the top copy, so NMS must look further to return the top copy
    # and the 4 best separate boxes.
    copies = [[30.0, 30.0, 20.0, 20.0, 0.99 - 0.01 * i, 1.0] for i in range(30)]
    separate = [[100.0 + 30 * (i % 5), 100.0 + 30 * (i // 5), 10.0, 10.0, 0.50 - 0.01 * i, 1.0] for i in range(10)]
    pred = torch.tensor([copies + separate])
    out = non_max_suppression(pred, 0.25, 0.45, max_det=5)[0]
    expected = [[20, 20, 40, 40, 0.99, 0]] + [[95 + 30 * i, 95, 105 + 30 * i, 105, 0.50 - 0.01 * i, 0]
                                             for i in range(4)]
    assert torch.allclose(out, torch.tensor(expected), atol=1e-6)
    # multi_label: a box with class scores 0.8 and 0.7 (objectness 0.9) gives 0.72 (class 0) and 0.63 (class 1);
    # classes=[1] keeps only the second, agnostic NMS of the two keeps only the first.
    multi = torch.tensor([[[50, 50, 20, 20, 0.9, 0.8, 0.7]]])
    assert torch.allclose(non_max_suppression(multi, 0.1, 0.5, multi_label=True)[0],
                          torch.tensor([[40, 40, 60, 60, 0.72, 0], [40, 40, 60, 60, 0.63, 1]]))
    assert torch.allclose(non_max_suppression(multi, 0.1, 0.5, classes=[1], multi_label=True)[0],
                          torch.tensor([[40, 40, 60, 60, 0.63, 1]]))
    assert len(non_max_suppression(multi, 0.1, 0.5, multi_label=True, agnostic=True)[0]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nms_matches_reference_on_cuda():
    # On CUDA torchvision's batched_nms offsets classes up to 25,000 boxes: both regimes appear here.
    for pred in (_realistic_prediction(batch=4, nc=3, seed=0), _random_prediction(batch=2, n=300, nc=12, seed=3),
                 _realistic_prediction(batch=2, nc=80, seed=1, size=640, n=25200)):
        for conf_thres, iou_thres, kwargs in NMS_CASES:
            stable = _has_tied_scores(pred, conf_thres)
            pred_cuda = pred.cuda()
            new = non_max_suppression(pred_cuda, conf_thres, iou_thres, **kwargs)
            assert all(d.is_cuda for d in new)
            _assert_same(new, _reference_nms(pred_cuda, conf_thres, iou_thres, stable=stable, **kwargs))


def test_nms_output_contract():
    pred = _random_prediction(batch=3, n=50, nc=2, seed=6)
    pred[2, :, 4] = 0.0  # no candidates
    out = non_max_suppression(pred, 0.25, 0.45)
    assert isinstance(out, list) and len(out) == 3
    assert all(d.shape[1] == 6 and d.dtype == torch.float32 for d in out)
    assert out[2].shape == (0, 6)
    for d in out[:2]:
        assert torch.all(d[:-1, 4] >= d[1:, 4])  # best first
        assert torch.all(d[:, 4] > 0.25) and torch.all(d[:, 2:4] > d[:, :2])
    out[0][:, :4] = 0  # outputs are independent tensors (callers rescale in place)
    assert out[1].shape[0] and out[1][:, 2].max() > 0
    assert non_max_suppression(torch.zeros(0, 10, 7), 0.25, 0.45) == []


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
