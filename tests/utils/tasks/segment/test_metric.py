"""utils/tasks/segment/metric.py: mask matching by hand, box and mask metrics side by side, and the mask mAP
against pycocotools' COCOeval ``segm`` on a data set the test writes (ground truth and predictions as RLE)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from utils.evaluation.outputs import coco_evaluate
from utils.tasks.segment.masks import polygons_to_masks, rle_decode, rle_encode
from utils.tasks.segment.metric import (
    SegmentRecord,
    mask_json_rows,
    match_mask_predictions,
    segment_record,
    segmentation_metrics,
)

CATEGORY_IDS = [2, 5, 9]


def square_mask(shape: tuple[int, int], x1: int, y1: int, x2: int, y2: int) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[y1:y2, x1:x2] = True
    return mask


def test_masks_are_matched_by_mask_iou_not_box_iou() -> None:
    """Two detections with the label's box: the one whose mask is the label's matches at every threshold, the
    other (a ring inside the same box, mask IoU 0.36) at none; the box IoU would match both."""
    gt = square_mask((20, 20), 0, 0, 10, 10)
    ring = gt.clone()
    ring[1:9, 1:9] = False  # 36 of the 100 pixels
    labels = torch.tensor([[1.0, 0, 0, 10, 10]])
    dets = torch.tensor([[0.0, 0, 10, 10, 0.9, 1], [0.0, 0, 10, 10, 0.8, 1]])
    correct = match_mask_predictions(dets, torch.stack([ring, gt]), labels, gt[None])
    assert correct[1].all() and not correct[0].any()  # the better-scored ring takes nothing
    assert match_mask_predictions(dets, torch.stack([gt, gt]), labels, gt[None]).sum(0).tolist() == [1] * 10
    other_class = match_mask_predictions(torch.tensor([[0.0, 0, 10, 10, 0.9, 2]]), gt[None], labels, gt[None])
    assert not other_class.any() and match_mask_predictions(dets[:0], gt[:0], labels, gt[None]).shape == (0, 10)


def test_box_and_mask_metrics_side_by_side() -> None:
    gt = torch.stack([square_mask((32, 32), 0, 0, 16, 16), square_mask((32, 32), 16, 16, 32, 32)])
    labels = torch.tensor([[0.0, 0, 0, 16, 16], [1.0, 16, 16, 32, 32]])
    half = square_mask((32, 32), 0, 0, 16, 8)  # the right box, half the mask: mask IoU .5
    dets = torch.tensor([[0.0, 0, 16, 16, 0.9, 0], [16.0, 16, 32, 32, 0.8, 1]])
    record = segment_record(dets, torch.stack([half, gt[1]]), labels, gt)
    assert record.box_tp.all() and record.mask_tp[0].tolist() == [True] + [False] * 9 and record.mask_tp[1].all()
    metrics = segmentation_metrics([record])
    box_p, box_r, box_50, box_map, mask_p, mask_r, mask_50, mask_map = metrics.mean_results()
    assert box_50 == pytest.approx(1.0) and box_map == pytest.approx(1.0)
    assert mask_50 == pytest.approx(1.0) and mask_map == pytest.approx((0.1 + 1.0) / 2)
    assert metrics.fitness() == pytest.approx(0.1 + 0.9 + 0.1 + 0.9 * 0.55)
    empty = segmentation_metrics([])
    assert empty.mean_results() == (0.0,) * 8


def blob(rng: np.random.Generator, centre: tuple[float, float], radius: float, points: int = 9) -> np.ndarray:
    angles = np.sort(rng.uniform(0, 2 * np.pi, points))
    radii = rng.uniform(0.5, 1.0, points) * radius
    return np.stack([centre[0] + radii * np.cos(angles), centre[1] + radii * np.sin(angles)], 1)


def mask_box(mask: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def write_data_set(folder: Path, seed: int) -> tuple[Path, Path, list[SegmentRecord]]:
    """Images with 1-5 objects each (ground truth as RLE), predictions that overlap them by every degree (moved,
    shrunk, wrong class, duplicated) plus false positives, written with mask_json_rows; and our records."""
    rng = np.random.default_rng(seed)
    gt: dict = {"images": [], "annotations": [], "categories": [{"id": i, "name": f"c{i}"} for i in CATEGORY_IDS]}
    predictions, records = [], []
    for image_id in range(1, 21):
        h, w = int(rng.integers(60, 100)), int(rng.integers(60, 100))
        gt["images"].append({"id": image_id, "file_name": f"{image_id}.jpg", "width": w, "height": h})
        outlines = [blob(rng, (rng.uniform(10, w - 10), rng.uniform(10, h - 10)), rng.uniform(8, 25))
                    for _ in range(int(rng.integers(1, 6)))]
        classes = rng.integers(0, 3, len(outlines))
        gt_masks = polygons_to_masks(outlines, (h, w))
        keep = gt_masks.sum((1, 2)) > 0
        outlines, classes, gt_masks = [o for o, k in zip(outlines, keep) if k], classes[keep], gt_masks[keep]
        for cls, mask in zip(classes, gt_masks):
            x1, y1, x2, y2 = mask_box(mask)
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": image_id, "iscrowd": 0,
                                      "category_id": CATEGORY_IDS[cls], "segmentation": rle_encode(mask[None])[0],
                                      "area": int(mask.sum()), "bbox": [x1, y1, x2 - x1, y2 - y1]})
        pred_outlines, pred_classes = [], []
        for outline, cls in zip(outlines, classes):
            for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):  # missed, found, found twice
                centre = outline.mean(0)
                moved = (outline - centre) * rng.uniform(0.8, 1.15) + centre + rng.normal(0, 1.2, 2)
                pred_outlines.append(moved + rng.normal(0, 0.6, moved.shape))
                pred_classes.append(cls if rng.random() > 0.1 else (cls + 1) % 3)
        for _ in range(int(rng.integers(0, 3))):  # false positives
            pred_outlines.append(blob(rng, (rng.uniform(10, w - 10), rng.uniform(10, h - 10)), rng.uniform(5, 15)))
            pred_classes.append(int(rng.integers(0, 3)))
        pred_masks = polygons_to_masks(pred_outlines, (h, w))
        found = pred_masks.sum((1, 2)) > 0
        pred_masks, pred_classes = pred_masks[found], np.array(pred_classes)[found]
        boxes = [mask_box(m) for m in pred_masks]
        dets = torch.tensor([[*b, round(float(rng.uniform(0.05, 1.0)), 5), c] for b, c in zip(boxes, pred_classes)],
                            dtype=torch.float64).reshape(-1, 6)
        predictions += mask_json_rows(image_id, dets, pred_masks, CATEGORY_IDS)
        labels = torch.tensor([[c, *mask_box(m)] for c, m in zip(classes, gt_masks)], dtype=torch.float64)
        records.append(segment_record(dets, torch.from_numpy(pred_masks), labels, torch.from_numpy(gt_masks)))
    (folder / "gt.json").write_text(json.dumps(gt))
    (folder / "predictions.json").write_text(json.dumps(predictions))
    return folder / "gt.json", folder / "predictions.json", records


@pytest.mark.parametrize("seed", [0, 1])
def test_mask_map_agrees_with_cocoeval_segm(tmp_path: Path, seed: int) -> None:
    anno, predictions, records = write_data_set(tmp_path, seed)
    ours = segmentation_metrics(records).mean_results()
    segm = coco_evaluate(anno, predictions, iou_type="segm")
    bbox = coco_evaluate(anno, predictions, iou_type="bbox")
    assert segm is not None and bbox is not None
    assert 0.1 < segm[0] < 0.9  # a data set where matching decides: neither empty nor perfect
    assert abs(ours[7] - segm[0]) < 0.005 and abs(ours[6] - segm[1]) < 0.005  # mask mAP@.5:.95, mAP@.5
    assert abs(ours[3] - bbox[0]) < 0.005 and abs(ours[2] - bbox[1]) < 0.005  # the boxes beside them
    assert abs(ours[7] - ours[3]) > 0.005  # masks and boxes are scored apart


def test_mask_json_rows_hold_decodable_rles() -> None:
    masks = np.zeros((2, 30, 40), np.uint8)
    masks[0, 5:10, 5:20] = 1
    masks[1, 20:30, 0:4] = 1
    dets = torch.tensor([[5.0, 5, 20, 10, 0.912345, 1], [0.0, 20, 4, 30, 0.5, 0]])
    rows = mask_json_rows("img7", dets, masks, CATEGORY_IDS)
    assert [r["category_id"] for r in rows] == [5, 2] and rows[0]["bbox"] == [5.0, 5.0, 15.0, 5.0]
    assert rows[0]["score"] == 0.91234 and rows[0]["image_id"] == "img7"
    assert all((rle_decode(r["segmentation"]) == m).all() for r, m in zip(rows, masks))
    assert json.loads(json.dumps(rows)) == rows and mask_json_rows(1, dets[:0], masks[:0]) == []
