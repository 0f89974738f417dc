"""What validation writes besides its table: COCO-format predictions (scored with pycocotools when the data set
has annotations), YOLO-format label files (with --save-hybrid, labels and predictions together), the metric
plots, and the --task study table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from utils.boxes import label_rows, xywh2xyxy, xyxy2xywh
from utils.data.coco_json import CocoIds
from utils.log import LOGGER
from utils.paths import derived_path
from utils.tasks.contract import OutputContract

# COCO's 80 training classes -> the 91 category ids of its annotation files.
COCO80_TO_91 = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28, 31, 32, 33, 34,
    35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90,
)


def stem_id(path: str) -> int | str:
    """The image id COCO's own files use: the numeric file stem (``000000000139.jpg`` -> 139), else the stem."""
    stem = Path(path).stem
    return int(stem) if stem.isnumeric() else stem


def json_rows(path: str, det: torch.Tensor, is_coco: bool, coco_ids: CocoIds | None = None) -> list[dict]:
    """COCO result rows, bbox [x, y, w, h] in original pixels: with ``coco_ids`` (a COCO JSON split), that file's
    image and category ids; else image_id from the file stem and the class (COCO's 91 ids with ``is_coco``)."""
    image_id = coco_ids.image_id(path) if coco_ids is not None else stem_id(path)
    categories = coco_ids.category_ids if coco_ids is not None else COCO80_TO_91 if is_coco else None
    boxes = xyxy2xywh(det[:, :4].double())
    boxes[:, :2] -= boxes[:, 2:] / 2
    rows = []
    for box, conf, cls in zip(boxes.tolist(), det[:, 4].tolist(), det[:, 5].long().tolist()):
        rows.append({"image_id": image_id, "category_id": categories[cls] if categories is not None else cls,
                     "bbox": [round(v, 3) for v in box], "score": round(conf, 5)})
    return rows


def with_label_boxes(preds: torch.Tensor, targets: torch.Tensor, img_hw: Sequence[int],
                     contract: OutputContract) -> torch.Tensor:
    """--save-hybrid: each image's labels appended to its predictions (b, n, contract columns) as rows of
    confidence 1 in the contract's layout, so post-processing keeps every label and the predictions that overlap
    none (YOLOv5's hybrid auto-labelling).

    ``targets`` (m, 6) [image, class, cx, cy, w, h] normalised to the batch's ``img_hw``; rows that pad an image
    with fewer labels have zero confidence, so post-processing drops them."""
    b, _, width = preds.shape
    per_image = [targets[targets[:, 0] == i, 1:] for i in range(b)]
    extra = preds.new_zeros(b, max((len(t) for t in per_image), default=0), width)
    scale = torch.tensor([img_hw[1], img_hw[0], img_hw[1], img_hw[0]], device=preds.device, dtype=preds.dtype)
    first_class = 5 if contract.layout == "xywh_obj_cls" else 4
    for i, labels in enumerate(per_image):
        rows, boxes = extra[i, : len(labels)], labels[:, 1:5].to(preds) * scale
        classes = labels[:, 0].long().to(preds.device)
        if contract.end_to_end:  # final rows: x1, y1, x2, y2, score, class
            rows[:, :4], rows[:, 4], rows[:, 5] = xywh2xyxy(boxes), 1.0, classes.to(preds.dtype)
            continue
        rows[:, :4] = boxes
        if first_class == 5:
            rows[:, 4] = 1.0  # objectness
        rows[torch.arange(len(labels), device=preds.device), first_class + classes] = 1.0
    return torch.cat((preds, extra), 1)


def save_label_file(path: str, det: torch.Tensor, shape0: Sequence[int], folder: Path, save_conf: bool) -> None:
    """labels/<stem>.txt: ``cls cx cy w h [conf]`` rows normalised to the original image of ``shape0`` (h, w)."""
    rows = label_rows(det, (shape0[0], shape0[1]), save_conf)
    derived_path(folder, Path(path).stem, suffix=".txt").write_text("".join(row + "\n" for row in rows))


def write_outputs(result: Any, records: list[Any], names: Sequence[str], save_dir: Path, plots: bool,
                  save_json: bool, anno_json: str | Path | None, coco_ids: CocoIds | None = None) -> None:
    """Rank 0: predictions JSON (and pycocotools' mAP on the evaluated images when annotations exist), PR/F1/P/R
    curves, confusion."""
    if save_json:
        result.json_path = save_dir / "predictions.json"
        result.json_path.write_text(json.dumps([row for r in records for row in r.json_rows]))
        LOGGER.info(f"Saved {sum(len(r.json_rows) for r in records)} predictions to {result.json_path}")
        if anno_json is not None:
            ids = [coco_ids.image_id(r.path) if coco_ids is not None else stem_id(r.path) for r in records]
            coco = coco_evaluate(anno_json, result.json_path, ids)
            if coco is not None:
                result.coco_map, result.coco_map50 = coco
    if plots and result.metrics is not None:
        from utils.plots.figures import plot_confusion_matrix, plot_metric_curves

        plot_metric_curves(result.metrics, names, save_dir)
        if result.confusion is not None:
            plot_confusion_matrix(result.confusion.matrix, names, save_dir / "confusion_matrix.png")


def coco_evaluate(anno_json: str | Path, pred_json: str | Path, image_ids: Sequence[int | str] = (),
                  iou_type: str = "bbox", params: Mapping[str, Any] | None = None) -> tuple[float, float] | None:
    """pycocotools' (mAP@.5:.95, mAP@.5) of a predictions file over ``image_ids`` (default: every image), of the
    boxes, or of what ``iou_type`` names (``segm``: masks, ``keypoints``); ``params`` set COCOeval's parameters of
    those names first (``kpt_oks_sigmas``: a data set's OKS sigmas); None (with a note) when it cannot run."""
    anno_json = Path(anno_json)
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        LOGGER.info("pycocotools not installed: skipping the COCO mAP (pip install pycocotools)")
        return None
    if not anno_json.is_file():
        LOGGER.info(f"COCO annotations {anno_json} not found: skipping the COCO mAP")
        return None
    LOGGER.info(f"\nEvaluating pycocotools mAP with {anno_json} and {pred_json}...")
    gt = COCO(str(anno_json))
    if not json.loads(Path(pred_json).read_text()):
        LOGGER.info("no predictions: COCO mAP is 0")
        return 0.0, 0.0
    evaluator = COCOeval(gt, gt.loadRes(str(pred_json)), iou_type)
    if image_ids:
        evaluator.params.imgIds = list(image_ids)
    for name, value in (params or {}).items():
        setattr(evaluator.params, name, np.asarray(value, dtype=np.float64) if isinstance(value, list | tuple)
                else value)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return float(evaluator.stats[0]), float(evaluator.stats[1])


STUDY_HEADER = "img_size P R mAP@.5 mAP@.5:.95 pre_ms inference_ms nms_ms"


def write_study(path: Path, sizes: Sequence[int], results: Sequence[Any]) -> Path:
    """test.py --task study: one row per image size (P, R, mAP@.5, mAP@.5:.95, ms per image of each stage)."""
    rows = [[size, *r.results(), *r.speed] for size, r in zip(sizes, results)]
    np.savetxt(path, np.array(rows, dtype=np.float64).reshape(-1, 8), fmt="%10.4g", header=STUDY_HEADER)
    return path
