"""Metrics against hand-computed cases: matching, ignore regions, 101-point AP, P/R/F1, confusion matrix; and
against pycocotools' COCOeval on random scenes, with and without crowd regions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from utils.evaluation.metrics import (
    IOU_THRESHOLDS,
    ConfusionMatrix,
    ap_per_class,
    coco_ap,
    ignored_detections,
    match_predictions,
)


def _labels(*rows):
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, 5)


def _dets(*rows):
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, 6)


def test_perfect_detections_give_ap_one():
    labels = _labels([0, 10, 10, 50, 50], [1, 60, 60, 90, 90], [1, 5, 60, 30, 95])
    dets = torch.cat((labels[:, 1:], torch.tensor([[0.9], [0.8], [0.7]]), labels[:, :1]), 1)
    correct = match_predictions(dets, labels)
    assert correct.all()
    result = ap_per_class(correct, dets[:, 4].numpy(), dets[:, 5].numpy(), labels[:, 0].numpy())
    assert np.allclose(result.ap, 1.0)
    assert result.mean_results() == pytest.approx((1.0, 1.0, 1.0, 1.0))


def test_known_pr_curve_gives_known_ap():
    # 4 labels; ranked detections TP, FP, TP, FP -> recall 0.25, 0.25, 0.5, 0.5; precision 1, .5, 2/3, .5.
    # Envelope: recall points 0..0.25 -> 1 (26 points), 0.26..0.5 -> 2/3 (25 points), the rest 0.
    tp = np.array([[True], [False], [True], [False]])
    ap, curve = coco_ap(*_pr(tp[:, 0], 4))
    assert ap == pytest.approx((26 * 1.0 + 25 * 2 / 3) / 101)
    assert curve[0] == 1.0 and curve[25] == 1.0 and curve[26] == pytest.approx(2 / 3) and curve[51] == 0.0


def _pr(tp: np.ndarray, n_labels: int) -> tuple[np.ndarray, np.ndarray]:
    tps = np.cumsum(tp)
    fps = np.cumsum(~tp)
    return tps / (tps + fps), tps / n_labels


def test_ap_per_class_uses_score_order_and_excludes_classes_without_labels():
    conf = np.array([0.2, 0.9, 0.5, 0.7])
    tp = np.array([[False], [True], [False], [True]])  # sorted: 0.9 TP, 0.7 TP, 0.5 FP, 0.2 FP
    result = ap_per_class(tp, conf, np.zeros(4), np.array([0, 0, 0, 0]))
    # recall 0.25, 0.5 at precision 1 -> 51 points of 1.0
    assert result.ap[0, 0] == pytest.approx(51 / 101)
    assert list(result.classes) == [0]
    # A detection of class 2, which has no labels, changes nothing: only classes with labels are averaged.
    extra = ap_per_class(np.array([[True], [False]]), np.array([0.9, 0.8]), np.array([0, 2]), np.array([0]))
    assert list(extra.classes) == [0] and extra.ap[0, 0] == pytest.approx(1.0)


def test_class_without_detections_gets_zero_ap():
    result = ap_per_class(np.zeros((0, 10), bool), np.zeros(0), np.zeros(0), np.array([1, 1, 4]))
    assert list(result.classes) == [1, 4]
    assert np.all(result.ap == 0) and result.mean_results() == (0.0, 0.0, 0.0, 0.0)
    maps = result.class_maps(5)
    assert maps.shape == (5,) and np.all(maps == 0)


def test_precision_recall_at_best_f1():
    # Two TPs at high confidence then two FPs at low: the best F1 is reached with P = 1, R = 2/3.
    tp = np.array([[True], [True], [False], [False]])
    result = ap_per_class(tp, np.array([0.9, 0.8, 0.3, 0.2]), np.zeros(4), np.zeros(3))
    # P and R are read on a 1000-point confidence grid, linearly interpolated: close to, not exactly, 1.
    assert result.precision[0] == pytest.approx(1.0, abs=1e-3)
    assert result.recall[0] == pytest.approx(2 / 3)
    assert result.f1[0] == pytest.approx(0.8, abs=1e-3)


def test_matching_per_iou_threshold():
    labels = _labels([0, 0, 0, 100, 100])
    # IoU of 0..100 with 0..80 (height 100) is 0.8: a TP up to threshold 0.8, not above.
    dets = _dets([0, 0, 80, 100, 0.9, 0])
    correct = match_predictions(dets, labels)[0]
    assert list(correct) == [bool(t <= 0.8 + 1e-9) for t in IOU_THRESHOLDS]
    # Wrong class never matches.
    assert not match_predictions(_dets([0, 0, 100, 100, 0.9, 1]), labels).any()


def test_matching_is_greedy_in_score_order_like_cocoeval():
    labels = _labels([0, 0, 0, 100, 100])
    # Lower-scored exact box comes first in the input; the higher-scored rough box must take the label.
    dets = _dets([0, 0, 100, 100, 0.5, 0], [0, 0, 90, 100, 0.9, 0])
    correct = match_predictions(dets, labels)
    assert correct[1, 0] and not correct[0, 0]  # at .5: the 0.9 one wins, the exact one is a duplicate
    # Above IoU 0.9 the rough box cannot match, so the exact one gets the label.
    assert correct[0, -1] and not correct[1, -1]


def test_matching_picks_best_iou_label_among_free_ones():
    labels = _labels([0, 0, 0, 100, 100], [0, 10, 0, 110, 100])
    dets = _dets([10, 0, 110, 100, 0.9, 0], [0, 0, 100, 100, 0.8, 0])
    correct = match_predictions(dets, labels)
    assert correct.all()  # each detection takes its own exact label


def test_confusion_matrix_counts():
    cm = ConfusionMatrix(nc=2, conf=0.25, iou_thres=0.45)
    labels = _labels([0, 0, 0, 10, 10], [1, 20, 20, 30, 30], [1, 50, 50, 60, 60])
    dets = _dets([0, 0, 10, 10, 0.9, 0],  # correct class 0
                 [20, 20, 30, 30, 0.8, 0],  # class 1 label predicted as 0
                 [80, 80, 90, 90, 0.7, 1],  # false positive
                 [50, 50, 60, 60, 0.1, 1])  # below conf: ignored -> label 3 missed
    cm.process_batch(dets, labels)
    expected = np.array([[1, 1, 0],
                         [0, 0, 1],
                         [0, 1, 0]])
    assert np.array_equal(cm.matrix, expected)
    tp, fp = cm.tp_fp()
    assert list(tp) == [1, 0] and list(fp) == [1, 1]
    cm.process_batch(None, _labels([0, 1, 1, 5, 5]))
    assert cm.matrix[2, 0] == 1
    other = ConfusionMatrix(nc=2)
    other.merge([cm.matrix, cm.matrix])
    assert other.matrix.sum() == 2 * cm.matrix.sum()


def _regions(*rows):
    return np.array(rows, dtype=np.float64).reshape(-1, 6)


def test_one_label_one_crowd_region_hand_computed():
    labels = _labels([0, 0, 0, 10, 10])
    crowd = _regions([0, 20, 0, 60, 40, 1])
    dets = _dets([25, 5, 35, 15, 0.9, 0],  # inside the crowd region: ignored at every threshold
                 [50, 0, 70, 10, 0.85, 0],  # half of it on the region (intersection / its area = .5): ignored at .5
                 [0, 0, 10, 10, 0.8, 0])  # the label: a true positive
    correct = match_predictions(dets, labels)
    ignored = ignored_detections(dets, correct, crowd)
    assert correct.tolist() == [[False] * 10, [False] * 10, [True] * 10]
    assert ignored.tolist() == [[True] * 10, [True] + [False] * 9, [False] * 10]
    conf, cls = dets[:, 4].numpy(), dets[:, 5].numpy()
    result = ap_per_class(correct, conf, cls, np.array([0]), ignored=ignored)
    # IoU .5: ignored, ignored, TP -> P 1 at R 1: AP 1. IoU .55-.95: ignored, FP, TP -> P .5 at R 1: AP .5.
    assert result.ap[0].tolist() == [1.0] + [0.5] * 9
    assert result.mean_results() == pytest.approx((1.0, 1.0, 1.0, 0.55), abs=1e-12)
    counted = ap_per_class(correct, conf, cls, np.array([0]))  # the same detections without the ignore rule
    assert counted.ap[0] == pytest.approx([1 / 3] * 10) and counted.precision[0] == pytest.approx(1 / 3)
    cm = ConfusionMatrix(nc=1, conf=0.25, iou_thres=0.45)
    cm.process_batch(dets, labels, crowd)  # both detections on the region (overlap 1 and .5 > .45) count nothing
    assert cm.matrix.tolist() == [[1, 0], [0, 0]]
    cm.process_batch(dets, labels)
    assert cm.matrix.tolist() == [[2, 2], [0, 0]]


def test_ignore_regions_take_what_the_labels_leave_and_difficult_ones_use_iou():
    labels = _labels([0, 0, 0, 10, 10])
    dets = _dets([0, 0, 10, 10, 0.9, 0], [0, 0, 10, 10, 0.8, 0], [0, 0, 10, 10, 0.7, 1])
    crowd = _regions([0, 0, 0, 60, 40, 1])  # covers the label too
    correct = match_predictions(dets, labels)
    ignored = ignored_detections(dets, correct, crowd)
    assert correct[:, 0].tolist() == [True, False, False]  # the label first; its duplicate lies on the crowd
    assert ignored[:, 0].tolist() == [False, True, False]  # region; a region of another class ignores nothing
    difficult = _regions([0, 20, 0, 60, 40, 0], [0, 70, 0, 80, 10, 0])  # VOC difficult objects: plain IoU
    inside = _dets([25, 5, 35, 15, 0.9, 0], [70, 0, 80, 10, 0.8, 0], [71, 0, 80, 10, 0.7, 0])
    ignored = ignored_detections(inside, np.zeros((3, 10), bool), difficult)
    assert ignored[:, 0].tolist() == [False, True, True] and ignored[1].all() and ignored[2].sum() == 9  # .9 IoU
    assert not ignored_detections(inside, np.zeros((3, 10), bool), None).any()


def _random_scene(rng: np.random.Generator, n_images: int = 30, nc: int = 3):
    """Labels and noisy detections (jittered copies plus spurious boxes) for several images."""
    scenes = []
    for _ in range(n_images):
        m = rng.integers(0, 6)
        xy = rng.uniform(0, 80, (m, 2))
        labels = np.concatenate((rng.integers(0, nc, (m, 1)), xy, xy + rng.uniform(5, 40, (m, 2))), 1)
        keep = rng.random(m) < 0.8
        dets = labels[keep, 1:] + rng.normal(0, 2.5, (keep.sum(), 4))
        dets = np.concatenate((dets, rng.uniform(0.05, 1, (len(dets), 1)), labels[keep, :1]), 1)
        k = rng.integers(0, 4)
        junk_xy = rng.uniform(0, 80, (k, 2))
        junk = np.concatenate((junk_xy, junk_xy + rng.uniform(5, 40, (k, 2)), rng.uniform(0.05, 1, (k, 1)),
                               rng.integers(0, nc, (k, 1))), 1)
        scenes.append((labels, np.concatenate((dets, junk)).reshape(-1, 6)))
    return scenes


def _cocoeval_maps(scenes: list, crowds: list) -> tuple[float, float]:
    """COCOeval's (mAP@.5:.95, mAP@.5) for the scenes' labels, detections and crowd regions (k, 6)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = {"images": [], "annotations": [], "categories": [{"id": c} for c in range(3)]}
    predictions = []
    for i, ((labels, dets), regions) in enumerate(zip(scenes, crowds)):
        gt["images"].append({"id": i, "width": 128, "height": 128})
        objects = [(*row, 0) for row in labels] + [(*row[:5], 1) for row in regions]
        for c, x1, y1, x2, y2, crowd in objects:
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": i, "category_id": int(c),
                                      "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1),
                                      "iscrowd": int(crowd)})
        for x1, y1, x2, y2, conf, c in dets:
            predictions.append({"image_id": i, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1],
                                "score": conf})
    coco_gt = COCO()
    coco_gt.dataset = gt
    coco_gt.createIndex()
    evaluator = COCOeval(coco_gt, coco_gt.loadRes(predictions), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return float(evaluator.stats[0]), float(evaluator.stats[1])


def _our_maps(scenes: list, crowds: list) -> tuple[float, float]:
    """Our (mAP@.5:.95, mAP@.5) for the same scenes."""
    stats = []
    for (labels, dets), regions in zip(scenes, crowds):
        correct = match_predictions(dets, labels)
        stats.append((correct, ignored_detections(dets, correct, regions), dets[:, 4], dets[:, 5], labels[:, 0]))
    tp, ignored, conf, pred_cls, target_cls = (np.concatenate(x) for x in zip(*stats))
    _, _, map50, map_ = ap_per_class(tp, conf, pred_cls, target_cls, ignored=ignored).mean_results()
    return map_, map50


def test_map_agrees_with_cocoeval_on_random_scenes():
    pytest.importorskip("pycocotools")
    scenes = _random_scene(np.random.default_rng(0))
    no_crowds = [_regions() for _ in scenes]
    assert _our_maps(scenes, no_crowds) == pytest.approx(_cocoeval_maps(scenes, no_crowds), abs=1e-9)


def test_map_with_crowd_regions_agrees_with_cocoeval_on_random_scenes():
    pytest.importorskip("pycocotools")
    rng = np.random.default_rng(1)
    scenes, crowds = [], []
    for labels, dets in _random_scene(rng, n_images=40):
        xy = rng.uniform(0, 60, (2, 2))
        regions = np.concatenate((rng.integers(0, 3, (2, 1)), xy, xy + rng.uniform(20, 60, (2, 2)), np.ones((2, 1))), 1)
        on_regions = regions[:, 1:5] + rng.normal(0, 6, (2, 4))  # detections on the regions, some well inside
        on_regions = np.concatenate((on_regions, rng.uniform(0.05, 1, (2, 1)), regions[:, :1]), 1)
        scenes.append((labels, np.concatenate((dets, on_regions))))
        crowds.append(regions)
    coco = _cocoeval_maps(scenes, crowds)
    assert _our_maps(scenes, crowds) == pytest.approx(coco, abs=1e-9)
    no_crowds = [_regions() for _ in scenes]
    assert abs(_our_maps(scenes, no_crowds)[0] - coco[0]) > 0.02  # without the ignore rule it would not agree
