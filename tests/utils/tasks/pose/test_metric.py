"""utils/evaluation/pose_metrics.py: OKS by hand, COCOeval's rules for labels without keypoints and crowd regions,
and the box and keypoint mAP against pycocotools' COCOeval ``keypoints`` and ``bbox`` on data sets the test writes
(COCO's 17 sigmas, and 5 keypoints with sigmas of their own)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from utils.evaluation.outputs import coco_evaluate
from utils.tasks.pose.labels import COCO_SIGMAS
from utils.tasks.pose.metric import (
    COCO_MAX_DETS,
    PoseRecord,
    keypoint_json_rows,
    match_with_ignored_labels,
    object_keypoint_similarity,
    pose_metrics,
    pose_record,
)

CATEGORY_IDS = [1, 4]


def test_oks_by_hand() -> None:
    """Two labelled keypoints, sigmas 0.1 and 0.2, area 100: the first 3 px off, the second exact, a third
    unlabelled keypoint anywhere: OKS = (exp(-9 / (2 * 0.04 * 100)) + 1) / 2."""
    gt = np.array([[[10.0, 10.0, 2.0], [20.0, 20.0, 1.0], [0.0, 0.0, 0.0]]])
    pred = np.array([[[13.0, 10.0], [20.0, 20.0], [90.0, 90.0]]])
    oks = object_keypoint_similarity(pred, gt, [100.0], [[0.0, 0.0, 30.0, 30.0]], [0.1, 0.2, 0.3])
    assert oks[0, 0] == pytest.approx((math.exp(-9 / (2 * 0.04 * 100)) + 1) / 2, rel=1e-9)


def test_an_object_without_keypoints_scores_predictions_outside_its_grown_box() -> None:
    """Box [10, 10, 20, 20] grows by its size to [0, 0, 30, 30]: a keypoint inside counts 1, one 4 px right of
    x = 30 counts exp(-16 / (2 (2 sigma)^2 area)); the mean is over all keypoints."""
    gt = np.zeros((1, 2, 3))
    pred = np.array([[[5.0, 25.0], [34.0, 15.0]]])
    oks = object_keypoint_similarity(pred, gt, [50.0], [[10.0, 10.0, 20.0, 20.0]], [0.1, 0.1])
    assert oks[0, 0] == pytest.approx((1 + math.exp(-16 / (2 * 0.04 * 50))) / 2, rel=1e-9)


def test_ignored_labels_and_crowd_regions_follow_cocoeval() -> None:
    """Label 0 counts, label 1 is ignored (no keypoints), label 2 a crowd region. Detections by score: a takes
    label 0; b (no counted label left) is ignored on label 1; c, also on label 1 only, is a false positive (an
    ignored label takes one detection); d and e both land on the crowd region: ignored."""
    similarity = np.array([[0.9, 0.9, 0.0], [0.8, 0.8, 0.0], [0.0, 0.7, 0.0], [0.0, 0.0, 0.6], [0.0, 0.0, 0.95]])
    conf = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    correct, ignored = match_with_ignored_labels(similarity, conf, np.array([False, True, True]),
                                                 np.array([False, False, True]))
    assert correct[:, 0].tolist() == [True, False, False, False, False]
    assert ignored[:, 0].tolist() == [False, True, False, True, True]
    assert ignored[:, 5].tolist() == [False, True, False, False, True]  # at .75: d (0.6) reaches nothing
    assert correct[:, 9].tolist() == [False] * 5 and ignored[:, 9].tolist() == [False] * 4 + [True]


def test_records_count_labels_with_keypoints_and_keep_each_class_best_detections() -> None:
    labels = np.array([[0, 0, 0, 10, 10], [0, 20, 20, 40, 40], [1, 50, 50, 60, 60]], dtype=float)
    gt = np.zeros((3, 1, 3))
    gt[0] = [[5, 5, 2]]
    gt[2] = [[55, 55, 1]]
    dets = np.array([[0, 0, 10, 10, 0.9, 0], [20, 20, 40, 40, 0.8, 0], [50, 50, 60, 60, 0.7, 1],
                     [50, 50, 60, 60, 0.2, 1]])
    pred = np.array([[[5, 5]], [[30, 30]], [[55, 55]], [[55, 56]]], dtype=float)
    record = pose_record(dets, pred, labels, gt, [0.1], max_dets=1)
    assert record.pose_ignored[:, 0].tolist() == [False, True, False, True]  # each class's best one is judged
    assert record.target_cls.tolist() == [0, 0, 1] and record.pose_target_cls.tolist() == [0, 1]
    assert record.pose_tp[[0, 2]].all() and not record.pose_tp[[1, 3]].any()
    assert record.box_tp[:3].all() and not record.box_tp[3].any()  # the boxes judge all: the last a duplicate
    metrics = pose_metrics([record])
    box_map, pose_map = metrics.mean_results()[3], metrics.mean_results()[7]
    assert box_map == pytest.approx(1.0) and pose_map == pytest.approx(1.0)  # every box label found first
    assert metrics.fitness() == pytest.approx(2.0)
    assert pose_metrics([]).mean_results() == (0.0,) * 8


def random_keypoints(rng: np.random.Generator, box: list[float], count: int, labelled_share: float) -> np.ndarray:
    x1, y1, x2, y2 = box
    points = np.zeros((count, 3))
    for k in range(count):
        if rng.random() < labelled_share:
            points[k] = rng.uniform(x1, x2), rng.uniform(y1, y2), rng.choice([1.0, 2.0])
    return points


def write_data_set(folder: Path, seed: int, count: int, sigmas: np.ndarray) -> tuple[Path, Path, list[PoseRecord]]:
    """Images with 1-5 objects (a few without labelled keypoints, some crowd regions), predictions at every degree
    of closeness (keypoints moved by a share of the object's size, wrong class, duplicated, an image with more than
    20) plus false positives, written as COCO JSON; and our records."""
    rng = np.random.default_rng(seed)
    gt: dict = {"images": [], "annotations": [],
                "categories": [{"id": i, "name": f"c{i}", "keypoints": [f"k{k}" for k in range(count)]}
                               for i in CATEGORY_IDS]}
    predictions, records = [], []
    for image_id in range(1, 26):
        h, w = int(rng.integers(80, 160)), int(rng.integers(80, 160))
        gt["images"].append({"id": image_id, "file_name": f"{image_id}.jpg", "width": w, "height": h})
        labels, keypoints, areas, crowd = [], [], [], []
        for _ in range(int(rng.integers(1, 6))):
            bw, bh = rng.uniform(15, 50), rng.uniform(15, 50)
            x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            box = [x1, y1, x1 + bw, y1 + bh]
            is_crowd = rng.random() < 0.08
            points = np.zeros((count, 3)) if is_crowd else random_keypoints(rng, box, count,
                                                                             rng.choice([0.0, 0.6, 1.0]))
            cls = int(rng.integers(0, 2))
            area = 0.53 * bw * bh
            labels.append([cls, *box])
            keypoints.append(points)
            areas.append(area)
            crowd.append(is_crowd)
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": image_id,
                                      "category_id": CATEGORY_IDS[cls], "iscrowd": int(is_crowd), "area": area,
                                      "bbox": [x1, y1, bw, bh], "keypoints": points.ravel().tolist(),
                                      "num_keypoints": int((points[:, 2] > 0).sum())})
        dets, pred_points = [], []
        for (cls, *box), points in zip(labels, keypoints):
            copies = int(rng.choice([0, 1, 1, 1, 2])) + (12 if image_id == 3 else 0)  # image 3: many duplicates
            size = math.sqrt((box[2] - box[0]) * (box[3] - box[1]))
            for _ in range(copies):
                moved = points[:, :2] + rng.normal(0, rng.choice([0.02, 0.06, 0.15]) * size, (count, 2))
                unlabelled = points[:, 2] == 0
                moved[unlabelled] = rng.uniform(box[0], box[2], (int(unlabelled.sum()), 2))
                jitter = rng.normal(0, 0.05 * size, 4)
                pred_cls = cls if rng.random() > 0.1 else 1 - cls
                dets.append([*(np.array(box) + jitter), round(float(rng.uniform(0.05, 1.0)), 5), pred_cls])
                pred_points.append(np.concatenate((moved, rng.uniform(0, 1, (count, 1))), 1))
        for _ in range(int(rng.integers(0, 3))):  # false positives
            x1, y1 = rng.uniform(0, w - 20), rng.uniform(0, h - 20)
            dets.append([x1, y1, x1 + 20, y1 + 20, round(float(rng.uniform(0.05, 1.0)), 5), int(rng.integers(0, 2))])
            pred_points.append(np.concatenate((rng.uniform([x1, y1], [x1 + 20, y1 + 20], (count, 2)),
                                               np.ones((count, 1))), 1))
        det_array = np.array(dets, dtype=np.float64).reshape(-1, 6)
        point_array = np.array(pred_points, dtype=np.float64).reshape(-1, count, 3)
        rows = keypoint_json_rows(image_id, det_array, point_array, CATEGORY_IDS)
        predictions += rows
        exact = np.array([[*r["keypoints"]] for r in rows]).reshape(-1, count, 3)  # as written (rounded)
        boxes = np.array([[*r["bbox"]] for r in rows]).reshape(-1, 4)
        det_array[:, :4] = np.concatenate((boxes[:, :2], boxes[:, :2] + boxes[:, 2:]), 1)
        det_array[:, 4] = [r["score"] for r in rows] if rows else []
        records.append(pose_record(det_array, exact, np.array(labels), np.array(keypoints), sigmas,
                                   areas=np.array(areas), crowd=np.array(crowd), max_dets=COCO_MAX_DETS))
    (folder / "gt.json").write_text(json.dumps(gt))
    (folder / "predictions.json").write_text(json.dumps(predictions))
    return folder / "gt.json", folder / "predictions.json", records


@pytest.mark.parametrize("seed, count", [(0, 17), (1, 17), (2, 5)])
def test_keypoint_map_agrees_with_cocoeval_keypoints(tmp_path: Path, seed: int, count: int) -> None:
    sigmas = np.asarray(COCO_SIGMAS) if count == 17 else np.array([0.06, 0.08, 0.1, 0.12, 0.15])
    anno, predictions, records = write_data_set(tmp_path, seed, count, sigmas)
    ours = pose_metrics(records).mean_results()
    keypoints = coco_evaluate(anno, predictions, iou_type="keypoints", params={"kpt_oks_sigmas": sigmas})
    boxes = coco_evaluate(anno, predictions, iou_type="bbox")
    assert keypoints is not None and boxes is not None
    assert 0.1 < keypoints[0] < 0.9  # a data set where matching decides: neither empty nor perfect
    assert abs(ours[7] - keypoints[0]) < 0.005 and abs(ours[6] - keypoints[1]) < 0.005, (ours, keypoints)
    assert abs(ours[3] - boxes[0]) < 0.005 and abs(ours[2] - boxes[1]) < 0.005, (ours, boxes)
    assert abs(ours[7] - ours[3]) > 0.005  # keypoints and boxes are scored apart


def test_the_comparison_can_fail(tmp_path: Path) -> None:
    """Scored with other sigmas than COCOeval's, or without COCOeval's labels-without-keypoints rule, the keypoint
    mAP moves away from COCOeval's: the agreement above is not a coincidence of easy data."""
    sigmas = np.asarray(COCO_SIGMAS)
    anno, predictions, records = write_data_set(tmp_path, 0, 17, sigmas)
    keypoints = coco_evaluate(anno, predictions, iou_type="keypoints", params={"kpt_oks_sigmas": sigmas})
    wider = coco_evaluate(anno, predictions, iou_type="keypoints", params={"kpt_oks_sigmas": sigmas * 2})
    assert abs(pose_metrics(records).mean_results()[7] - wider[0]) > 0.01
    counted = [PoseRecord(r.box_tp, r.box_ignored, r.pose_tp, np.zeros_like(r.pose_ignored), r.conf, r.pred_cls,
                          r.target_cls, r.target_cls) for r in records]
    assert abs(pose_metrics(counted).mean_results()[7] - keypoints[0]) > 0.005


def test_keypoint_json_rows() -> None:
    dets = np.array([[5.0, 5, 20, 10, 0.912345, 1]])
    rows = keypoint_json_rows("img7", dets, np.array([[[6.12345, 7.0, 0.5], [8.0, 9.0, 1.0]]]), CATEGORY_IDS)
    assert rows == [{"image_id": "img7", "category_id": 4, "bbox": [5.0, 5.0, 15.0, 5.0], "score": 0.91234,
                     "keypoints": [6.123, 7.0, 0.5, 8.0, 9.0, 1.0]}]
    plain = keypoint_json_rows(1, dets, np.array([[[6.0, 7.0]]]))
    assert plain[0]["keypoints"] == [6.0, 7.0, 1.0] and plain[0]["category_id"] == 1
    assert keypoint_json_rows(1, dets[:0], np.zeros((0, 2, 3))) == []
