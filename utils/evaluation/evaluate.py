"""The evaluation loop train.py and test.py share: ``evaluate`` and ``measure_speed``, distributed across ranks.

Every rank evaluates its shard of the val set (a ``shard_eval=True`` loader), the per-image statistics are gathered,
and every rank computes the same metrics a 1-process run gets. Predictions become detections through the one
post-processing call (utils.tasks.contract.postprocess) with the model's output contract (its head's, or an exported
file's), whatever the family; validation losses, when asked, are named by the loss's terms. When the loader's
dataset has ``ignore_regions`` (crowd boxes and difficult objects of a COCO or VOC split), detections on them are
ignored as COCOeval does.

A task whose outputs say more than boxes judges the same detections once more per view of its metric (its
``metric`` part, utils/evaluation/task_metric.py: a segmenter's by mask IoU, so its mask mAP is COCOeval
``segm``'s), from the model's other outputs and the batch's extras; each view's P, R and mAPs become results.csv
columns (``<view>_precision``, ...) and --save-json rows carry what the metric adds (a mask's RLE).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from utils.boxes import scale_boxes, xywhn2xyxy
from utils.device import autocast
from utils.distributed import comm as dist
from utils.evaluation.metrics import (
    ConfusionMatrix,
    DetectionMetrics,
    ap_per_class,
    ignored_detections,
    match_predictions,
)
from utils.evaluation.outputs import json_rows, save_label_file, with_label_boxes, write_outputs
from utils.evaluation.results import EvalOptions, EvalResult, ImageStats
from utils.evaluation.task_metric import NO_VIEWS, ImageContext, TaskMetric
from utils.evaluation.tta import augmented_forward, layout_of
from utils.log import LOGGER
from utils.plots.annotate import class_name
from utils.tasks.contract import ContractError, OutputContract, postprocess
from utils.tasks.registry import get_task

TABLE_HEADER = ("%22s" + "%11s" * 6) % ("Class", "Images", "Labels", "P", "R", "mAP@.5", "mAP@.5:.95")
ROW_FORMAT = "%22s" + "%11i" * 2 + "%11.3g" * 4
PLOTTED_BATCHES = 3  # val_batch0..2 images
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


def model_contract(model: nn.Module) -> OutputContract:
    """The row layout of ``model``'s output: an exported model's own (``contract``, from its file's metadata), else
    its head's (``model.head.contract``). A one-line ContractError for a model that states neither."""
    contract = getattr(model, "contract", None)
    if contract is None:
        contract = getattr(getattr(model, "head", None), "contract", None)
    if not isinstance(contract, OutputContract):
        raise ContractError(f"{type(model).__name__} states no output contract (neither .contract nor .head.contract)")
    return contract


@contextlib.contextmanager
def _head_inputs(model: nn.Module, enabled: bool) -> Iterator[list]:
    """Catch what the model's head is called with during the forward pass (for the loss, which reads the head's
    training-mode outputs of the same features)."""
    caught: list = []
    if not enabled:
        yield caught
        return
    handle = model.head.register_forward_pre_hook(lambda module, args: caught.append(args[0]))
    try:
        yield caught
    finally:
        handle.remove()


def _training_outputs(head: nn.Module, features: Any) -> Any:
    """The head's training-mode outputs (what the loss reads) for ``features``, in float32, every BatchNorm of the
    model left in eval mode."""
    head.train()
    try:
        return head([f.float() for f in features] if isinstance(features, (list, tuple)) else features.float())
    finally:
        head.eval()


def model_input(imgs: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    """uint8 (b, 3, h, w) -> float in [0, 1] on ``device``, channels_last or NCHW, in one pass: the loader's batches
    are channels_last already (utils.data.batch_memory.new_batch), so on the CPU the cast reads and writes in order."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return imgs.to(device, non_blocking=True).to(dtype=torch.float32, memory_format=layout).div_(255)


def _input_layout(model: nn.Module, device: torch.device) -> bool:
    """Whether ``model`` takes channels_last input: our fused CPU model does (models.yolo.Model.fuse)."""
    return device.type == "cpu" and bool(getattr(model, "channels_last_input", False))


def metric_names(contract: OutputContract) -> tuple[str, ...]:
    """The validation columns a model of ``contract`` fills (``EvalResult.named_results``' keys): its task's."""
    return tuple(get_task(contract.task).metrics)


def task_metric(contract: OutputContract) -> TaskMetric:
    """What the task of ``contract`` adds to the boxes' evaluation (nothing for the base task)."""
    return get_task(contract.task).load("metric") or NO_VIEWS


def batch_tensors(extras: Sequence[Any], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch's fifth item (a task's extras by name, from its collate) -> its tensors on ``device``, by name, for
    a task's loss; nothing for a detection batch (four items)."""
    if not extras:
        return {}
    return {k: v.to(device, non_blocking=True) for k, v in extras[0].items() if isinstance(v, torch.Tensor)}


def _forward(model: nn.Module, imgs: torch.Tensor, targets: torch.Tensor, compute_loss: Any, half: bool,
             augment: bool = False, loss_inputs: dict | None = None
             ) -> tuple[torch.Tensor, tuple, torch.Tensor | None]:
    """Decoded predictions (b, n, contract columns), the task's other outputs (a segmenter's prototypes; () for a
    detector), and, with ``compute_loss`` (given ``loss_inputs`` by name), the batch's loss items."""
    if augment and compute_loss is None:
        with autocast(imgs.device, half):
            return augmented_forward(model, imgs, layout_of(model), model_contract(model)).float(), (), None
    with autocast(imgs.device, half), _head_inputs(model, compute_loss is not None) as features:
        out = model(imgs)
    others: tuple = ()
    if isinstance(out, (list, tuple)):  # the rows, then the task's other outputs
        out, others = out[0], tuple(o.float() if torch.is_tensor(o) else o for o in out[1:])
    if compute_loss is None:
        return out.float(), others, None
    loss_items = compute_loss(_training_outputs(model.head, features[-1]), targets, **(loss_inputs or {}))[1]
    return out.float(), others, loss_items.detach()


def _labels_in_original(targets: torch.Tensor, image_index: int, img_hw: Sequence[int], shape: Any,
                        single_cls: bool) -> torch.Tensor:
    """One image's labels as (m, 5) [cls, x1, y1, x2, y2] in original pixels."""
    labels = targets[targets[:, 0] == image_index, 1:6].clone()
    if single_cls:
        labels[:, 0] = 0
    boxes = xywhn2xyxy(labels[:, 1:5], w=img_hw[1], h=img_hw[0])
    labels[:, 1:5] = scale_boxes(img_hw, boxes, shape[0], shape[1])
    return labels


def _image_stats(det: torch.Tensor, targets: torch.Tensor, index: int, img_hw: Sequence[int], path: str,
                 shape: Any, opts: EvalOptions, confusion: ConfusionMatrix, txt_dir: Path | None,
                 ignore: np.ndarray | None = None, metric: TaskMetric = NO_VIEWS, outputs: tuple = (),
                 batch: dict | None = None) -> ImageStats:
    """Scale one image's detections to original pixels, match them (labels first, then the image's ``ignore``
    regions (k, 6) [cls, x1, y1, x2, y2, crowd] in original pixels), and record what the outputs need. A task's
    ``metric`` matches them once more per view, from the model's other ``outputs`` and the ``batch``'s extras."""
    labels = _labels_in_original(targets, index, img_hw, shape, opts.single_cls)
    rows, det = det, det[:, :6].clone()
    if opts.single_cls:
        det[:, 5] = 0
        ignore = None if ignore is None else np.concatenate((np.zeros((len(ignore), 1)), ignore[:, 1:]), 1)
    det[:, :4] = scale_boxes(img_hw, det[:, :4], shape[0], shape[1])
    extra = metric.match(ImageContext(index, rows, outputs, batch or {}, tuple(img_hw), shape, labels.cpu(), det,
                                      opts.save_json, ignore))
    confusion.process_batch(det, labels, ignore, extra.overlaps)
    if txt_dir is not None:
        save_label_file(path, det, shape[0], txt_dir, opts.save_conf)
    correct = match_predictions(det, labels, overlaps=extra.overlaps)
    rows = json_rows(path, det.cpu(), opts.is_coco, opts.coco_ids) if opts.save_json else []
    for row, added in zip(rows, extra.json or ()):
        row.update(added)
    return ImageStats(path=str(path), correct=correct, ignored=ignored_detections(det, correct, ignore),
                      conf=det[:, 4].cpu().numpy(), pred_cls=det[:, 5].cpu().numpy(),
                      target_cls=labels[:, 0].cpu().numpy(), json_rows=rows, views=extra.correct,
                      view_ignored=extra.ignored, view_target_cls=extra.target_cls)


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
    from utils.plots.figures import plot_images

    plot_images(imgs, targets, paths, save_dir / f"val_batch{batch_index}_labels.jpg", names)
    plot_images(imgs, None, paths, save_dir / f"val_batch{batch_index}_pred.jpg", names, preds=dets)


def _merge(parts: list[dict]) -> tuple[list[ImageStats], DetectionMetrics, dict]:
    """Every rank's records in one order (by path, as a 1-process run sorts them) and the metrics (each view of the
    task's metric that every record has, in the totals' ``views``)."""
    records = sorted((r for part in parts for r in part["records"]), key=lambda r: r.path)
    correct, ignored = (np.concatenate([getattr(r, k) for r in records]) if records else np.zeros((0, 10), bool)
                        for k in ("correct", "ignored"))
    conf, pred_cls, target_cls = (np.concatenate([getattr(r, k) for r in records]) if records else np.zeros(0)
                                  for k in ("conf", "pred_cls", "target_cls"))
    metrics = ap_per_class(correct, conf, pred_cls, target_cls, ignored=ignored)
    names = [v for v in (records[0].views if records else {}) if all(v in r.views for r in records)]
    views = {v: ap_per_class(np.concatenate([r.views[v] for r in records]), conf, pred_cls,
                             np.concatenate([r.view_target_cls.get(v, r.target_cls) for r in records]),
                             ignored=np.concatenate([r.view_ignored.get(v, r.ignored) for r in records]))
             for v in names}
    totals = {
        "views": views,
        "times": np.sum([p["times"] for p in parts], 0),
        "batches": sum(p["batches"] for p in parts),
        "loss": sum(losses) if (losses := [p["loss"] for p in parts if p["loss"] is not None]) else None,
        "shape": max((p["shape"] for p in parts), key=lambda s: s[0]),
        "confusion": [p["confusion"] for p in parts],
    }
    return records, metrics, totals


def _log_table(records: list[ImageStats], metrics: DetectionMetrics, names: Sequence[str], verbose: bool,
               views: dict[str, DetectionMetrics] | None = None, labels: Mapping[str, str] | None = None) -> None:
    """The table users know: an ``all`` row (and one ``all (<label>)`` row per view of the task's metric, labelled
    by ``labels``), then one row per class with ``verbose``."""
    n_labels = sum(len(r.target_cls) for r in records)
    mp, mr, map50, map_ = metrics.mean_results()
    if not _show_progress():  # the progress bar's title is the header
        LOGGER.info(TABLE_HEADER)
    LOGGER.info(ROW_FORMAT % ("all", len(records), n_labels, mp, mr, map50, map_))
    for view, view_metrics in (views or {}).items():
        label = f"all ({(labels or {}).get(view, view)})"
        LOGGER.info(ROW_FORMAT % (label, len(records), n_labels, *view_metrics.mean_results()))
    if n_labels == 0:
        LOGGER.warning("WARNING: no labels in the val set: metrics need labels (check the data YAML's val path)")
    if verbose and len(names) > 1:
        for i, c in enumerate(metrics.classes):
            images = sum(bool(np.any(r.target_cls == c)) for r in records)
            LOGGER.info(ROW_FORMAT % (class_name(names, c), images, metrics.n_labels[i], metrics.precision[i],
                                      metrics.recall[i], metrics.ap[i, 0], metrics.ap[i].mean()))


@torch.no_grad()
def _run_shard(model: nn.Module, loader: Any, device: torch.device, names: Sequence[str], opts: EvalOptions,
               compute_loss: Any, plot_dir: Path | None, txt_dir: Path | None) -> dict:
    """Evaluate this rank's batches; returns what is gathered: per-image stats, stage times, loss sums."""
    timer, confusion = _Timer(device), ConfusionMatrix(len(names))  # counted on every rank: the merge is complete
    records: list[ImageStats] = []
    loss_sum, batches, batch_shape = None, 0, (0, 3, 0, 0)
    contract = model_contract(model)
    metric = task_metric(contract)
    nms = {"conf_thres": opts.conf_thres, "iou_thres": opts.iou_thres, "max_det": opts.max_det,
           "agnostic": opts.agnostic or opts.single_cls}
    ignore_of = getattr(getattr(loader, "dataset", None), "ignore_regions", lambda path: None)
    channels_last = _input_layout(model, device)
    for batch_index, (imgs, targets, paths, shapes, *extras) in enumerate(_progress(loader, _show_progress())):
        dist.mark("validation", batch=batch_index)
        with timer.stage(0):
            x = model_input(imgs, device, channels_last)
            targets = targets.to(device)
        with timer.stage(1):
            preds, others, loss_items = _forward(model, x, targets, compute_loss, opts.half, opts.augment,
                                                 batch_tensors(extras, device))
        if opts.save_hybrid:
            preds = with_label_boxes(preds, targets, x.shape[2:], contract)
        with timer.stage(2):
            dets = postprocess(preds, contract, multi_label=True, **nms)
        if loss_items is not None:
            loss_sum = loss_items.cpu() if loss_sum is None else loss_sum + loss_items.cpu()
        batches, batch_shape = batches + 1, batch_shape if batches else tuple(x.shape)  # the first batch's
        img_hw = tuple(x.shape[2:])
        records += [_image_stats(det, targets, i, img_hw, paths[i], shapes[i], opts, confusion, txt_dir,
                                 ignore_of(paths[i]), metric, others, extras[0] if extras else {})
                    for i, det in enumerate(dets)]
        if plot_dir is not None and batch_index < PLOTTED_BATCHES:
            _plot_batch(imgs, targets.cpu(), [d[:, :6].cpu() for d in dets], paths, names, plot_dir, batch_index)
    return {"records": records, "times": timer.totals, "loss": loss_sum,
            "batches": batches, "shape": batch_shape, "confusion": confusion.matrix}


def evaluate(model: nn.Module, loader: Any, device: torch.device | str, names: Sequence[str],
             options: EvalOptions | None = None, compute_loss: Any = None, **overrides: Any) -> EvalResult:
    """Validate ``model`` (eval mode, not DDP-wrapped) on ``loader``: P, R, mAP@.5, mAP@.5:.95, speed, outputs.

    ``options`` with any field replaced by ``overrides``; ``compute_loss`` (a family's LossFn) adds the mean of each
    validation loss term, by the loss's ``names``.
    Under DDP pass a ``shard_eval=True`` loader; the per-image statistics are gathered and every rank returns
    the metrics a 1-process run gives. Files and the table come from rank 0. All ranks must call it.
    """
    opts = replace(options or EvalOptions(), **overrides)
    own = getattr(task_metric(model_contract(model)), "run", None)
    if own is not None:  # a task whose outputs are not boxes (a classifier) judges the whole pass itself
        return own(model, loader, torch.device(device), names, opts, compute_loss)
    device, main = torch.device(device), dist.is_main_process()
    save_dir = Path(opts.save_dir) if opts.save_dir is not None else None
    names = ["item"] if opts.single_cls else list(names)
    txt_dir = save_dir / "labels" if opts.save_txt and save_dir is not None else None
    if txt_dir is not None:
        txt_dir.mkdir(parents=True, exist_ok=True)
    plots = opts.plots and save_dir is not None
    opts = replace(opts, save_json=opts.save_json and save_dir is not None)
    was_training = model.training
    model.eval()
    try:
        part = _run_shard(model, loader, device, names, opts, compute_loss, save_dir if plots and main else None,
                          txt_dir)
    finally:
        model.train(was_training)
    records, metrics, totals = _merge(dist.all_gather_object(part, long=True))  # shards may end far apart
    result = _result(records, metrics, totals, len(names), getattr(compute_loss, "names", None))
    _log_table(records, metrics, names, opts.verbose, totals["views"], task_metric(model_contract(model)).views)
    pre, inf, nms_ms = result.speed
    LOGGER.info(f"Speed: {pre:.1f}/{inf:.1f}/{nms_ms:.1f} ms pre-process/inference/NMS per image "
                f"at shape {totals['shape']}")
    if main and save_dir is not None:
        write_outputs(result, records, names, save_dir, plots, opts.save_json, opts.anno_json, opts.coco_ids)
    return result


def _result(records: list[ImageStats], metrics: DetectionMetrics, totals: dict, nc: int,
            loss_names: Sequence[str] | None) -> EvalResult:
    seen = len(records)
    speed = tuple(float(t) / max(seen, 1) * 1e3 for t in totals["times"])
    loss = None
    if totals["loss"] is not None:  # each term by the loss's name (loss0, loss1, ... for a function without names)
        means = (totals["loss"] / max(totals["batches"], 1)).tolist()
        loss = dict(zip(loss_names or [f"loss{i}" for i in range(len(means))], means))
    confusion = ConfusionMatrix(nc)
    confusion.merge(totals["confusion"])
    mp, mr, map50, map_ = metrics.mean_results()
    return EvalResult(mp=mp, mr=mr, map50=map50, map=map_, maps=metrics.class_maps(nc), speed=speed, loss=loss,
                      seen=seen, n_labels=sum(len(r.target_cls) for r in records), metrics=metrics,
                      confusion=confusion, views=totals["views"])


@torch.no_grad()
def measure_speed(model: nn.Module, loader: Any, device: torch.device | str,
                  options: EvalOptions | None = None) -> EvalResult:
    """Time pre-processing, inference and NMS per image over ``loader`` (test.py --task speed): no matching, no
    metrics, no files. Every rank times its shard and the totals are gathered. All ranks must call it."""
    opts, device = options or EvalOptions(), torch.device(device)
    timer, seen, batch_shape, contract = _Timer(device), 0, (0, 3, 0, 0), model_contract(model)
    was_training = model.training
    model.eval()
    try:
        for imgs, targets, *_ in _progress(loader, _show_progress()):
            with timer.stage(0):
                x = model_input(imgs, device, _input_layout(model, device))
            with timer.stage(1):
                preds = _forward(model, x, targets, None, opts.half, opts.augment)[0]
            with timer.stage(2):
                postprocess(preds, contract, opts.conf_thres, opts.iou_thres, multi_label=True,
                            agnostic=opts.agnostic or opts.single_cls, max_det=opts.max_det)
            seen, batch_shape = seen + len(imgs), batch_shape if seen else tuple(x.shape)
    finally:
        model.train(was_training)
    parts = dist.all_gather_object({"times": timer.totals, "seen": seen, "shape": batch_shape})
    seen = sum(p["seen"] for p in parts)
    speed = tuple(float(t) / max(seen, 1) * 1e3 for t in np.sum([p["times"] for p in parts], 0))
    LOGGER.info(f"Speed: {speed[0]:.1f}/{speed[1]:.1f}/{speed[2]:.1f} ms pre-process/inference/NMS per image "
                f"at shape {parts[0]['shape']} ({seen} images, timing only)")
    return EvalResult(speed=speed, seen=seen)
