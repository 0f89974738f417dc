"""utils/tasks/obb/metric.py through the shared evaluation: OBB mAP with the exact rotated IoU, checked by hand and
against an independent computation: pycocotools' COCOeval (its own matching and 101-point AP) fed the IoU of the
same rotated boxes as shapely computes it, on letterboxed batches the metric maps back to the original pixels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from shapely.geometry import Polygon
from torch import nn

from utils.evaluation.evaluate import evaluate
from utils.tasks.contract import OutputContract
from utils.tasks.obb.rotated import xywhr2corners

GAIN, PAD, SIZE, NC = 0.5, (3.0, 7.0), (120, 112), 3  # original pixels * GAIN + PAD = the batch's (h, w) SIZE


def polygon(box: np.ndarray) -> Polygon:
    return Polygon(xywhr2corners(torch.as_tensor(box, dtype=torch.float64)).tolist())


def shapely_iou(first: np.ndarray, second: np.ndarray) -> float:
    a, b = polygon(first), polygon(second)
    inter = a.intersection(b).area
    return inter / (a.area + b.area - inter)


class FixedRows(nn.Module):
    """A YOLO26-obb stand-in: each batch's final rows [x, y, w, h, score, cls, angle] given in advance."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        super().__init__()
        self.batches, self.contract = list(batches), OutputContract("xyxy_score_cls", NC, 1, "obb")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.batches.pop(0)


def batch_of(scenes: list[tuple[np.ndarray, np.ndarray]]) -> tuple[tuple, torch.Tensor]:
    """A collated validation batch of the scenes (labels (m, 6) [cls, xywhr] in original pixels) and the model's
    rows for it (detections (n, 7) [xywhr, conf, cls] in original pixels, padded with rows of score 0)."""
    h, w = SIZE
    targets, quads, rows = [], [], []
    most = max(len(d) for _, d in scenes)
    for i, (labels, dets) in enumerate(scenes):
        corners = xywhr2corners(torch.as_tensor(labels[:, 1:6])).numpy() * GAIN + PAD  # the batch's pixels
        low, high = corners.min(1), corners.max(1)
        targets.append(np.concatenate((np.full((len(labels), 1), i), labels[:, :1], (low + high) / 2 / [w, h],
                                       (high - low) / [w, h]), 1))
        quads.append((corners / [w, h]).astype(np.float32))
        boxes = dets[:, :5].copy()
        boxes[:, :2] = boxes[:, :2] * GAIN + PAD
        boxes[:, 2:4] *= GAIN
        image_rows = np.concatenate((boxes[:, :4], dets[:, 5:7], boxes[:, 4:5]), 1)
        rows.append(np.concatenate((image_rows, np.zeros((most - len(dets), 7))), 0))
    shapes = tuple(((SIZE[0] / GAIN, SIZE[1] / GAIN), ((GAIN, GAIN), PAD)) for _ in scenes)
    batch = (torch.zeros(len(scenes), 3, h, w, dtype=torch.uint8), torch.tensor(np.concatenate(targets)).float(),
             tuple(f"{i}.jpg" for i in range(len(scenes))), shapes, {"quads": quads})
    return batch, torch.tensor(np.stack(rows)).float()


def evaluated(scenes: list[tuple[np.ndarray, np.ndarray]], per_batch: int = 4) -> tuple[float, ...]:
    parts = [batch_of(scenes[i:i + per_batch]) for i in range(0, len(scenes), per_batch)]
    model = FixedRows([rows for _, rows in parts])
    result = evaluate(model, [batch for batch, _ in parts], "cpu", [f"c{i}" for i in range(NC)])
    return result.results()


def test_hand_computed_aps() -> None:
    label = np.array([[0, 50.0, 50.0, 40.0, 20.0, 0.4]])
    exact = np.array([[50.0, 50.0, 40.0, 20.0, 0.4, 0.9, 0]])
    assert evaluated([(label, exact)])[2:] == pytest.approx((1.0, 1.0))
    wrong_first = np.array([[150.0, 50.0, 40.0, 20.0, 0.4, 0.95, 0], [50.0, 50.0, 40.0, 20.0, 0.4, 0.9, 0]])
    assert evaluated([(label, wrong_first)])[2:] == pytest.approx((0.5, 0.5))
    turned = np.array([[50.0, 50.0, 20.0, 40.0, 0.4 + math.pi / 2, 0.9, 0]])  # the same rectangle
    assert evaluated([(label, turned)])[2:] == pytest.approx((1.0, 1.0))
    tilted = np.array([[50.0, 50.0, 40.0, 20.0, 0.4 + math.pi / 4, 0.9, 0]])  # IoU 0.517: a match at .5 only
    assert 0.5 < shapely_iou(tilted[0, :5], label[0, 1:]) < 0.55
    assert evaluated([(label, tilted)])[2:] == pytest.approx((1.0, 0.1))
    assert evaluated([(label, exact * [1, 1, 1, 1, 1, 1, 0] + [0, 0, 0, 0, 0, 0, 1])])[2:] == (0.0, 0.0)


def random_scenes(rng: np.random.Generator, n_images: int = 12) -> list[tuple[np.ndarray, np.ndarray]]:
    """Labels (m, 6) [cls, x, y, w, h, r] and detections (n, 7) [x, y, w, h, r, conf, cls]: jittered labels (some
    off, some on the wrong class) and random false positives, with distinct scores."""
    scenes = []
    for _ in range(n_images):
        m = int(rng.integers(1, 8))
        labels = np.concatenate((rng.integers(0, NC, (m, 1)), rng.uniform(20, 180, (m, 2)),
                                 rng.uniform(10, 50, (m, 2)), rng.uniform(0, math.pi / 2, (m, 1))), 1)
        jitter = labels[:, 1:].copy()
        jitter[:, :2] += rng.normal(0, 3, (m, 2))
        jitter[:, 2:4] *= rng.uniform(0.8, 1.2, (m, 2))
        jitter[:, 4] += rng.normal(0, 0.15, m)
        cls = np.where(rng.random(m) < 0.15, (labels[:, 0] + 1) % NC, labels[:, 0])
        k = int(rng.integers(0, 5))
        junk = np.concatenate((rng.uniform(0, 200, (k, 2)), rng.uniform(10, 50, (k, 2)),
                               rng.uniform(-1, 2, (k, 1))), 1)
        boxes = np.concatenate((jitter, junk))
        dets = np.concatenate((boxes, rng.uniform(0.05, 1, (len(boxes), 1)),
                               np.concatenate((cls, rng.integers(0, NC, k)))[:, None]), 1)
        scenes.append((labels, dets))
    return scenes


def cocoeval_maps(scenes: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
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

    gt = {"images": [], "annotations": [], "categories": [{"id": c} for c in range(NC)]}
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
    _, _, map50, map50_95 = evaluated(scenes)
    expected = cocoeval_maps(scenes)
    assert 0.2 < map50_95 < 0.9  # a scene with hits and misses at most thresholds
    assert (map50_95, map50) == pytest.approx(expected, abs=1e-9)
    assert evaluated(scenes, per_batch=5)[2:] == pytest.approx((map50, map50_95), abs=1e-12)  # other batches
