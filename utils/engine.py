"""The loops train.py and test.py share: ``evaluate`` (validation, distributed across ranks).

Under torch.distributed every rank evaluates its shard of the val set (a ``shard_eval=True`` loader),
the per-image statistics are gathered, and every rank computes the same metrics a 1-process run gets.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from utils import dist
from utils.boxes import non_max_suppression, scale_boxes, xywhn2xyxy, xyxy2xywh, xyxy2xywhn
from utils.callbacks import progress_bar, progress_text
from utils.logging import LOGGER
from utils.metrics import ConfusionMatrix, DetectionMetrics, ap_per_class, match_predictions
from utils.optim import Stepper

# COCO's 80 training classes -> the 91 category ids of its annotation files.
COCO80_TO_91 = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28, 31, 32, 33, 34,
    35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90,
)
TABLE_HEADER = ("%22s" + "%11s" * 6) % ("Class", "Images", "Labels", "P", "R", "mAP@.5", "mAP@.5:.95")
ROW_FORMAT = "%22s" + "%11i" * 2 + "%11.3g" * 4
PLOTTED_BATCHES = 3  # val_batch0..2 images


@dataclass
class EvalResult:
    """What a validation pass measured; identical on every rank."""

    mp: float = 0.0
    mr: float = 0.0
    map50: float = 0.0
    map: float = 0.0
    maps: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (nc,) mAP@.5:.95 per class
    speed: tuple[float, float, float] = (0.0, 0.0, 0.0)  # pre-process, inference, NMS ms per image
    loss: torch.Tensor | None = None  # mean (box, obj, cls) loss when compute_loss was given
    seen: int = 0
    n_labels: int = 0
    metrics: DetectionMetrics | None = None  # per-class details and curves
    confusion: ConfusionMatrix | None = None  # (nc + 1, nc + 1) counts at conf 0.25, IoU 0.45
    json_path: Path | None = None
    coco_map50: float | None = None  # pycocotools' figures, when it ran (rank 0 only)
    coco_map: float | None = None

    def results(self) -> tuple[float, float, float, float]:
        """(P, R, mAP@.5, mAP@.5:.95), the order results.csv and fitness use."""
        return self.mp, self.mr, self.map50, self.map


@dataclass
class ImageStats:
    """One image's evaluation record: small, picklable, gathered across ranks."""

    path: str
    correct: np.ndarray  # (n, 10) bool
    conf: np.ndarray  # (n,)
    pred_cls: np.ndarray  # (n,)
    target_cls: np.ndarray  # (m,)
    json_rows: list[dict] = field(default_factory=list)


class _Timer:
    """Accumulates seconds per stage; synchronises CUDA so GPU time is not misattributed."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.totals = [0.0, 0.0, 0.0]

    @contextlib.contextmanager
    def stage(self, index: int) -> Iterator[None]:
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        self.totals[index] += time.perf_counter() - start


@contextlib.contextmanager
def _head_returns_raw_maps(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Let the Detect head return raw maps (for the loss) while every BatchNorm stays in eval mode."""
    detect = getattr(model, "detect", None)
    if not enabled or detect is None:
        yield
        return
    detect.train()
    try:
        yield
    finally:
        detect.eval()


def _forward(model: nn.Module, imgs: torch.Tensor, targets: torch.Tensor, compute_loss: Any,
             half: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Decoded predictions (b, n, 5 + nc) and, with ``compute_loss``, the batch's loss items."""
    autocast = torch.autocast("cuda", dtype=torch.float16) if half and imgs.is_cuda else contextlib.nullcontext()
    with autocast, _head_returns_raw_maps(model, compute_loss is not None):
        out = model(imgs)
    if compute_loss is None:
        return out.float(), None
    maps = [m.float() for m in out]
    loss_items = compute_loss(maps, targets)[1].detach()[:3]
    return model.detect.decode(maps), loss_items


def _labels_in_original(targets: torch.Tensor, image_index: int, img_hw: Sequence[int], shape: Any,
                        single_cls: bool) -> torch.Tensor:
    """One image's labels as (m, 5) [cls, x1, y1, x2, y2] in original pixels."""
    labels = targets[targets[:, 0] == image_index, 1:6].clone()
    if single_cls:
        labels[:, 0] = 0
    boxes = xywhn2xyxy(labels[:, 1:5], w=img_hw[1], h=img_hw[0])
    labels[:, 1:5] = scale_boxes(img_hw, boxes, shape[0], shape[1])
    return labels


def _json_rows(path: str, det: torch.Tensor, is_coco: bool) -> list[dict]:
    """COCO result rows: image_id from the file stem, bbox [x, y, w, h] in original pixels."""
    stem = Path(path).stem
    image_id: int | str = int(stem) if stem.isnumeric() else stem
    boxes = xyxy2xywh(det[:, :4].double())
    boxes[:, :2] -= boxes[:, 2:] / 2
    rows = []
    for box, conf, cls in zip(boxes.tolist(), det[:, 4].tolist(), det[:, 5].long().tolist()):
        rows.append({"image_id": image_id, "category_id": COCO80_TO_91[cls] if is_coco else cls,
                     "bbox": [round(v, 3) for v in box], "score": round(conf, 5)})
    return rows


def _save_txt(path: str, det: torch.Tensor, shape0: Sequence[int], folder: Path, save_conf: bool) -> None:
    """labels/<stem>.txt: ``cls cx cy w h [conf]`` normalised to the original image."""
    boxes = xyxy2xywhn(det[:, :4].clone(), w=shape0[1], h=shape0[0])
    lines = []
    for box, conf, cls in zip(boxes.tolist(), det[:, 4].tolist(), det[:, 5].long().tolist()):
        values = [cls, *box] + ([conf] if save_conf else [])
        lines.append(" ".join(f"{v:g}" if isinstance(v, int) else f"{v:.6g}" for v in values))
    (folder / f"{Path(path).stem}.txt").write_text("".join(line + "\n" for line in lines))


@dataclass
class _Options:
    """The per-image settings of one evaluate() call."""

    single_cls: bool
    confusion: ConfusionMatrix
    save_json: bool
    is_coco: bool
    txt_dir: Path | None
    save_conf: bool


def _image_stats(det: torch.Tensor, targets: torch.Tensor, index: int, img_hw: Sequence[int], path: str,
                 shape: Any, opts: _Options) -> ImageStats:
    """Scale one image's detections to original pixels, match them, and record what the outputs need."""
    labels = _labels_in_original(targets, index, img_hw, shape, opts.single_cls)
    det = det.clone()
    if opts.single_cls:
        det[:, 5] = 0
    det[:, :4] = scale_boxes(img_hw, det[:, :4], shape[0], shape[1])
    opts.confusion.process_batch(det, labels)
    if opts.txt_dir is not None:
        _save_txt(path, det, shape[0], opts.txt_dir, opts.save_conf)
    return ImageStats(path=str(path), correct=match_predictions(det, labels), conf=det[:, 4].cpu().numpy(),
                      pred_cls=det[:, 5].cpu().numpy(), target_cls=labels[:, 0].cpu().numpy(),
                      json_rows=_json_rows(path, det.cpu(), opts.is_coco) if opts.save_json else [])


def _show_progress() -> bool:
    """A progress bar on the main process's terminal only; logs (not a TTY) get the plain table."""
    return dist.is_main_process() and sys.stdout.isatty()


def _progress(loader: Any, enabled: bool) -> Any:
    """A tqdm bar titled with the table header where ``enabled``; the plain loader elsewhere."""
    if not enabled:
        return loader
    from tqdm import tqdm

    return tqdm(loader, desc=TABLE_HEADER, bar_format="{l_bar}{bar:10}{r_bar}", file=sys.stdout, mininterval=1.0)


def _plot_batch(imgs: torch.Tensor, targets: torch.Tensor, dets: list[torch.Tensor], paths: Sequence[str],
                names: Sequence[str], save_dir: Path, batch_index: int) -> None:
    """val_batch{i}_labels.jpg and val_batch{i}_pred.jpg (boxes in letterboxed pixels)."""
    from utils.plots import plot_images

    plot_images(imgs, targets, paths, save_dir / f"val_batch{batch_index}_labels.jpg", names)
    plot_images(imgs, None, paths, save_dir / f"val_batch{batch_index}_pred.jpg", names, preds=dets)


@torch.no_grad()
def _run_shard(model: nn.Module, loader: Any, device: torch.device, names: Sequence[str], opts: _Options,
               nms: dict, half: bool, compute_loss: Any, plot_dir: Path | None) -> dict:
    """Evaluate this rank's batches; returns what is gathered: per-image stats, stage times, loss sums."""
    timer = _Timer(device)
    records: list[ImageStats] = []
    loss_sum, batches, batch_shape = torch.zeros(3), 0, (0, 3, 0, 0)
    for batch_index, (imgs, targets, paths, shapes) in enumerate(_progress(loader, _show_progress())):
        with timer.stage(0):
            x = imgs.to(device, non_blocking=True).float() / 255  # uint8 -> [0, 1]
            targets = targets.to(device)
        with timer.stage(1):
            preds, loss_items = _forward(model, x, targets, compute_loss, half)
        with timer.stage(2):
            dets = non_max_suppression(preds, multi_label=True, **nms)
        if loss_items is not None:
            loss_sum += loss_items.cpu()
        batches, batch_shape = batches + 1, batch_shape if batches else tuple(x.shape)  # the first batch's
        img_hw = tuple(x.shape[2:])
        records += [_image_stats(det, targets, i, img_hw, paths[i], shapes[i], opts) for i, det in enumerate(dets)]
        if plot_dir is not None and batch_index < PLOTTED_BATCHES:
            _plot_batch(imgs, targets.cpu(), [d.cpu() for d in dets], paths, names, plot_dir, batch_index)
    return {"records": records, "times": timer.totals, "loss": loss_sum if compute_loss is not None else None,
            "batches": batches, "shape": batch_shape, "confusion": opts.confusion.matrix}


def _merge(parts: list[dict]) -> tuple[list[ImageStats], DetectionMetrics, dict]:
    """Every rank's records in one order (by path, as a 1-process run sorts them) and the metrics."""
    records = sorted((r for part in parts for r in part["records"]), key=lambda r: r.path)
    correct = np.concatenate([r.correct for r in records]) if records else np.zeros((0, 10), bool)
    conf, pred_cls, target_cls = (np.concatenate([getattr(r, k) for r in records]) if records else np.zeros(0)
                                  for k in ("conf", "pred_cls", "target_cls"))
    metrics = ap_per_class(correct, conf, pred_cls, target_cls)
    totals = {
        "times": np.sum([p["times"] for p in parts], 0),
        "batches": sum(p["batches"] for p in parts),
        "loss": None if parts[0]["loss"] is None else sum(p["loss"] for p in parts),
        "shape": max((p["shape"] for p in parts), key=lambda s: s[0]),
        "confusion": [p["confusion"] for p in parts],
    }
    return records, metrics, totals


def _log_table(records: list[ImageStats], metrics: DetectionMetrics, names: Sequence[str], verbose: bool) -> None:
    """The table users know: an ``all`` row, then one row per class with ``verbose``."""
    n_labels = sum(len(r.target_cls) for r in records)
    mp, mr, map50, map_ = metrics.mean_results()
    if not _show_progress():  # the progress bar's title is the header
        LOGGER.info(TABLE_HEADER)
    LOGGER.info(ROW_FORMAT % ("all", len(records), n_labels, mp, mr, map50, map_))
    if n_labels == 0:
        LOGGER.warning("WARNING: no labels in the val set: metrics need labels (check the data YAML's val path)")
    if verbose and len(names) > 1:
        for i, c in enumerate(metrics.classes):
            images = sum(bool(np.any(r.target_cls == c)) for r in records)
            name = names[c] if c < len(names) else str(c)
            LOGGER.info(ROW_FORMAT % (name, images, metrics.n_labels[i], metrics.precision[i], metrics.recall[i],
                                      metrics.ap[i, 0], metrics.ap[i].mean()))


def evaluate(model: nn.Module, loader: Any, *, device: torch.device | str, names: Sequence[str],
             conf_thres: float = 0.001, iou_thres: float = 0.6, max_det: int = 300, single_cls: bool = False,
             half: bool = False, save_dir: str | Path | None = None, plots: bool = False, save_json: bool = False,
             save_txt: bool = False, save_conf: bool = False, verbose: bool = False, is_coco: bool = False,
             compute_loss: Any = None, agnostic: bool = False, anno_json: str | Path | None = None) -> EvalResult:
    """Validate ``model`` (eval mode, not DDP-wrapped) on ``loader``: P, R, mAP@.5, mAP@.5:.95, speed, outputs.

    Under DDP pass a ``shard_eval=True`` loader; the per-image statistics are gathered and every rank returns
    the metrics a 1-process run gives. Files and the table come from rank 0. All ranks must call it.
    """
    device, main = torch.device(device), dist.is_main_process()
    save_dir = Path(save_dir) if save_dir is not None else None
    names = ["item"] if single_cls else list(names)
    txt_dir = save_dir / "labels" if save_txt and save_dir is not None else None
    if txt_dir is not None:
        txt_dir.mkdir(parents=True, exist_ok=True)
    plots = plots and save_dir is not None
    # The confusion matrix is counted on every rank whatever ``plots`` says there, so the merged one is complete.
    opts = _Options(single_cls, ConfusionMatrix(len(names)), save_json and save_dir is not None, is_coco, txt_dir,
                    save_conf)
    nms = {"conf_thres": conf_thres, "iou_thres": iou_thres, "agnostic": agnostic or single_cls, "max_det": max_det}
    was_training = model.training
    model.eval()
    try:
        part = _run_shard(model, loader, device, names, opts, nms, half, compute_loss,
                          save_dir if plots and main else None)
    finally:
        model.train(was_training)
    records, metrics, totals = _merge(dist.all_gather_object(part))
    result = _result(records, metrics, totals, len(names), opts)
    _log_table(records, metrics, names, verbose)
    pre, inf, nms_ms = result.speed
    LOGGER.info(f"Speed: {pre:.1f}/{inf:.1f}/{nms_ms:.1f} ms pre-process/inference/NMS per image "
                f"at shape {totals['shape']}")
    if main and save_dir is not None:
        _write_outputs(result, records, names, save_dir, plots, opts.save_json, anno_json)
    return result


def _result(records: list[ImageStats], metrics: DetectionMetrics, totals: dict, nc: int,
            opts: _Options) -> EvalResult:
    seen = len(records)
    speed = tuple(float(t) / max(seen, 1) * 1e3 for t in totals["times"])
    loss = None if totals["loss"] is None else totals["loss"] / max(totals["batches"], 1)
    opts.confusion.merge(totals["confusion"])
    mp, mr, map50, map_ = metrics.mean_results()
    return EvalResult(mp=mp, mr=mr, map50=map50, map=map_, maps=metrics.class_maps(nc), speed=speed, loss=loss,
                      seen=seen, n_labels=sum(len(r.target_cls) for r in records), metrics=metrics,
                      confusion=opts.confusion)


def _write_outputs(result: EvalResult, records: list[ImageStats], names: Sequence[str], save_dir: Path,
                   plots: bool, save_json: bool, anno_json: str | Path | None) -> None:
    """Rank 0: predictions JSON (and pycocotools' mAP when annotations exist), PR/F1/P/R curves, confusion."""
    if save_json:
        result.json_path = save_dir / "predictions.json"
        result.json_path.write_text(json.dumps([row for r in records for row in r.json_rows]))
        LOGGER.info(f"Saved {sum(len(r.json_rows) for r in records)} predictions to {result.json_path}")
        if anno_json is not None:
            coco = coco_evaluate(anno_json, result.json_path, [Path(r.path).stem for r in records])
            if coco is not None:
                result.coco_map, result.coco_map50 = coco
    if plots and result.metrics is not None:
        from utils.plots import plot_metric_curves

        plot_metric_curves(result.metrics, names, save_dir)
        if result.confusion is not None:
            result.confusion.plot(save_dir, names)


def coco_evaluate(anno_json: str | Path, pred_json: str | Path,
                  stems: Sequence[str] = ()) -> tuple[float, float] | None:
    """pycocotools' (mAP@.5:.95, mAP@.5) of a predictions file; None (with a note) when it cannot run."""
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
    evaluator = COCOeval(gt, gt.loadRes(str(pred_json)), "bbox")
    ids = [int(s) if s.isnumeric() else s for s in stems]
    if ids:
        evaluator.params.imgIds = ids
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return float(evaluator.stats[0]), float(evaluator.stats[1])


def _autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """Mixed precision on CUDA only; a no-op context elsewhere."""
    return torch.amp.autocast("cuda", enabled=True) if enabled and device.type == "cuda" else contextlib.nullcontext()


def train_one_epoch(model: torch.nn.Module, loader: Iterable, stepper: Stepper, compute_loss: Callable, *,
                    device: torch.device, epoch: int, epochs: int, img_size: int, amp: bool = False,
                    step_sizes: Sequence[int] | None = None, loss_scale: float = 1.0, show_progress: bool = True,
                    on_batch: Callable[[int, torch.Tensor, torch.Tensor, Any], None] | None = None,
                    on_nonfinite: Callable[[int], None] | None = None) -> torch.Tensor:
    """Train ``model`` (DDP-wrapped or not) for one pass over ``loader``; returns the mean (box, obj, cls) loss
    of this rank's batches.

    ``step_sizes`` gives the multi-scale image size of each batch (decided on rank 0 and broadcast);
    ``loss_scale`` is the world size under DDP, since DDP averages gradients where the loss sums over images.
    ``on_batch(i, imgs, targets, paths)`` runs after each batch (plots, mid-epoch checkpoints).
    A non-finite loss on any rank skips that batch's backward on every rank (decided collectively, so DDP
    stays in step) and calls ``on_nonfinite(i)``. All ranks must call it (DDP's all-reduce runs in backward).
    """
    model.train()
    mean_loss, done = torch.zeros(3, device=device), 0
    num_batches = len(loader)
    bar = progress_bar(loader, num_batches, enabled=show_progress)
    for i, (imgs, targets, paths, _) in enumerate(bar):
        stepper.begin_batch(epoch)
        imgs = imgs.to(device, non_blocking=True).float() / 255  # (b, 3, h, w) in 0-1
        if step_sizes is not None and step_sizes[i] != imgs.shape[-1]:
            imgs = F.interpolate(imgs, size=(step_sizes[i], step_sizes[i]), mode="bilinear", align_corners=False)
        with _autocast(device, amp):
            preds = model(imgs)
            loss, loss_items = compute_loss(preds, targets.to(device))
        if dist.any_rank(not bool(torch.isfinite(loss).all())):  # every rank skips this step together
            if on_nonfinite is not None:
                on_nonfinite(i)
        else:
            stepper.backward(loss * loss_scale)
            mean_loss = (mean_loss * done + loss_items) / (done + 1)
            done += 1
        mem = torch.cuda.memory_reserved() / 1e9 if device.type == "cuda" else 0.0
        bar.set_description(progress_text(epoch, epochs, mem, mean_loss.tolist(), targets.shape[0], imgs.shape[-1]),
                            refresh=False)  # drawn at tqdm's own pace, not once per batch
        if on_batch is not None:
            on_batch(i, imgs, targets, paths)
    bar.close()
    return mean_loss
