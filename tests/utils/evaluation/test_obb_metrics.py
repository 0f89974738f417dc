"""utils/evaluation/obb_metrics.py: OBB mAP with the exact rotated IoU, checked by hand and against an independent
computation: pycocotools' COCOeval (its own matching and 101-point AP) fed the IoU of the same rotated boxes as
shapely computes it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from shapely.geometry import Polygon

from utils.evaluation.obb_metrics import fitness, match_obb_predictions, obb_metrics, obb_record
from utils.geometry.rotated import xywhr2corners


def polygon(box: np.ndarray) -> Polygon:
    import torch

    return Polygon(xywhr2corners(torch.as_tensor(box, dtype=torch.float64)).tolist())


def shapely_iou(first: np.ndarray, second: np.ndarray) -> float:
    a, b = polygon(first), polygon(second)
    inter = a.intersection(b).area
    return inter / (a.area + b.area - inter)


def test_hand_computed_aps() -> None:
    label = np.array([[0, 50.0, 50.0, 40.0, 20.0, 0.4]])
    exact = np.array([[50.0, 50.0, 40.0, 20.0, 0.4, 0.9, 0]])
    assert obb_metrics([obb_record(exact, label)]).mean_results()[2:] == (1.0, 1.0)
    wrong_first = np.array([[150.0, 50.0, 40.0, 20.0, 0.4, 0.95, 0], [50.0, 50.0, 40.0, 20.0, 0.4, 0.9, 0]])
    assert obb_metrics([obb_record(wrong_first, label)]).mean_results()[2:] == pytest.approx((0.5, 0.5))
    # turned by a quarter the same rectangle (r + pi/2, w and h swapped) still matches exactly
    turned = np.array([[50.0, 50.0, 20.0, 40.0, 0.4 + math.pi / 2, 0.9, 0]])
    assert match_obb_predictions(turned, label).all()
    # turned by 45 degrees about its centre, a 40 x 20 box overlaps itself by 0.517: a match at .5 only
    tilted = np.array([[50.0, 50.0, 40.0, 20.0, 0.4 + math.pi / 4, 0.9, 0]])
    iou = shapely_iou(tilted[0, :5], label[0, 1:])
    assert 0.5 < iou < 0.55
    assert match_obb_predictions(tilted, label)[0].tolist() == [True] + [False] * 9
    other_class = exact.copy()
    other_class[0, 6] = 1
    assert not match_obb_predictions(other_class, label).any()


def test_difficult_regions_are_ignored() -> None:
    label = np.array([[0, 50.0, 50.0, 40.0, 20.0, 0.0]])
    difficult = np.array([[0, 150.0, 50.0, 30.0, 30.0, 0.2]])
    dets = np.array([[150.0, 50.0, 30.0, 30.0, 0.2, 0.95, 0], [50.0, 50.0, 40.0, 20.0, 0.0, 0.9, 0]])
    without = obb_metrics([obb_record(dets, label)]).mean_results()
    ignored = obb_metrics([obb_record(dets, label, difficult)]).mean_results()
    assert without[2] == pytest.approx(0.5) and ignored[2] == pytest.approx(1.0)


def random_scenes(rng: np.random.Generator, n_images: int = 12, nc: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
    """Labels (m, 6) [cls, x, y, w, h, r] and detections (n, 7): jittered labels (some off, some on the wrong
    class) and random false positives, with distinct scores."""
    scenes = []
    for _ in range(n_images):
        m = int(rng.integers(1, 8))
        labels = np.concatenate((rng.integers(0, nc, (m, 1)), rng.uniform(20, 180, (m, 2)),
                                 rng.uniform(10, 50, (m, 2)), rng.uniform(0, math.pi / 2, (m, 1))), 1)
        jitter = labels[:, 1:].copy()
        jitter[:, :2] += rng.normal(0, 3, (m, 2))
        jitter[:, 2:4] *= rng.uniform(0.8, 1.2, (m, 2))
        jitter[:, 4] += rng.normal(0, 0.15, m)
        cls = np.where(rng.random(m) < 0.15, (labels[:, 0] + 1) % nc, labels[:, 0])
        k = int(rng.integers(0, 5))
        junk = np.concatenate((rng.uniform(0, 200, (k, 2)), rng.uniform(10, 50, (k, 2)),
                               rng.uniform(-1, 2, (k, 1))), 1)
        boxes = np.concatenate((jitter, junk))
        dets = np.concatenate((boxes, rng.uniform(0.05, 1, (len(boxes), 1)),
                               np.concatenate((cls, rng.integers(0, nc, k)))[:, None]), 1)
        scenes.append((labels, dets))
    return scenes


def cocoeval_maps(scenes: list[tuple[np.ndarray, np.ndarray]], nc: int = 3) -> tuple[float, float]:
    """COCOeval's (mAP@.5:.95, mAP@.5) with shapely's IoU of the rotated boxes in place of its box IoU."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    class RotatedEval(COCOeval):
        def computeIoU(self, image_id: int, category_id: int) -> np.ndarray | list:  # noqa: N802 (COCOeval's)
            gts, dts = self._gts[image_id, category_id], self._dts[image_id, category_id]
            if not gts and not dts:
                return []
            order = np.argsort([-d["score"] for d in dts], kind="mergesort")  # as COCOeval orders them
            dts = [dts[i] for i in order][:self.params.maxDets[-1]]
            return np.array([[shapely_iou(np.array(d["rbox"]), np.array(g["rbox"])) for g in gts] for d in dts])

    gt = {"images": [], "annotations": [], "categories": [{"id": c} for c in range(nc)]}
    predictions = []
    for i, (labels, dets) in enumerate(scenes):
        gt["images"].append({"id": i, "width": 200, "height": 200})
        for c, *box in labels:
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": i, "category_id": int(c),
                                      "bbox": [0, 0, box[2], box[3]], "area": box[2] * box[3], "iscrowd": 0,
                                      "rbox": box})
        for *box, conf, c in dets:
            predictions.append({"image_id": i, "category_id": int(c), "bbox": [0, 0, box[2], box[3]],
                                "score": conf, "rbox": box})
    coco_gt = COCO()
    coco_gt.dataset = gt
    coco_gt.createIndex()
    evaluator = RotatedEval(coco_gt, coco_gt.loadRes(predictions), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return float(evaluator.stats[0]), float(evaluator.stats[1])


def test_map_equals_cocoeval_with_shapely_iou_on_random_scenes() -> None:
    scenes = random_scenes(np.random.default_rng(0))
    metrics = obb_metrics([obb_record(dets, labels) for labels, dets in scenes])
    _, _, map50, map50_95 = metrics.mean_results()
    expected = cocoeval_maps(scenes)
    assert 0.2 < map50_95 < 0.9  # a scene with hits and misses at most thresholds
    assert (map50_95, map50) == pytest.approx(expected, abs=1e-9)
    assert fitness(metrics) == pytest.approx(0.1 * map50 + 0.9 * map50_95)
    sharded = [obb_record(dets, labels) for labels, dets in scenes[::2]] + \
        [obb_record(dets, labels) for labels, dets in scenes[1::2]]  # another order, as gathered shards are
    assert obb_metrics(sharded).mean_results() == pytest.approx(metrics.mean_results(), abs=1e-12)
    assert obb_metrics([]).mean_results() == (0.0, 0.0, 0.0, 0.0)
