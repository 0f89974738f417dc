"""Autoanchor: check how well the model's anchors fit the data set's boxes, and re-fit them when they do not.

A box "fits" an anchor when neither side ratio exceeds ``thr`` (the loss's ``anchor_t``). The
best possible recall (BPR) is the fraction of boxes with at least one fitting anchor. Below 0.98,
new anchors come from k-means on the box sizes, refined by a genetic (mutation) search.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from models.yolo import check_anchor_order
from utils.distributed import comm as dist
from utils.log import LOGGER, colorstr

if TYPE_CHECKING:
    from utils.data.datasets import YoloDataset

BPR_TARGET = 0.98


def _prefix() -> str:
    return colorstr("autoanchor: ")


def label_sizes(dataset: YoloDataset, img_size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """(n, 2) box sizes in pixels as training sees them (long side = img_size), optionally jittered x0.9-1.1."""
    shapes = img_size * dataset.shapes / dataset.shapes.max(1, keepdims=True)
    if rng is not None:
        shapes = shapes * rng.uniform(0.9, 1.1, size=(len(shapes), 1))
    sizes = [labels[:, 3:5] * shape for shape, labels in zip(shapes, dataset.labels) if len(labels)]
    return np.concatenate(sizes, 0).astype(np.float32) if sizes else np.zeros((0, 2), np.float32)


def anchor_metric(anchors: np.ndarray | torch.Tensor, wh: np.ndarray | torch.Tensor,
                  thr: float) -> tuple[float, float]:
    """(BPR, anchors above threshold per box) for anchors (k, 2) and box sizes (n, 2), both pixels."""
    fit = _fit(anchors, wh)
    return float((fit.max(1) > 1 / thr).mean()), float((fit > 1 / thr).sum(1).mean())


def _fit(anchors: np.ndarray | torch.Tensor, wh: np.ndarray | torch.Tensor) -> np.ndarray:
    """(n, k) worst side ratio of each box to each anchor (1 = same size); numpy, as it is small work."""
    ratio = np.asarray(wh, np.float64)[:, None] / np.asarray(anchors, np.float64)[None]  # (n, k, 2)
    return np.minimum(ratio, 1 / ratio).min(2)


def kmeans(points: np.ndarray, k: int, rng: np.random.Generator, iters: int = 30) -> np.ndarray:
    """Lloyd's k-means with k-means++ seeding (centres (k, d)); small and dependency-free."""
    centres = [points[rng.integers(len(points))]]
    for _ in range(1, k):
        d2 = ((points[:, None] - np.array(centres)[None]) ** 2).sum(2).min(1)
        centres.append(points[rng.choice(len(points), p=d2 / d2.sum())] if d2.sum() > 0 else points[0])
    centres = np.array(centres, np.float64)
    for _ in range(iters):
        assign = ((points[:, None] - centres[None]) ** 2).sum(2).argmin(1)
        for j in range(k):
            if (assign == j).any():
                centres[j] = points[assign == j].mean(0)
    return centres


def _fitness(anchors: np.ndarray, wh: np.ndarray, thr: float) -> float:
    best = _fit(anchors, wh).max(1)
    return float((best * (best > 1 / thr)).mean())


def _describe(anchors: np.ndarray, wh: np.ndarray, thr: float, img_size: int) -> np.ndarray:
    """Sort anchors by area and log their fit in the reference's format."""
    anchors = anchors[np.argsort(anchors.prod(1))]
    fit = _fit(anchors, wh)
    best = fit.max(1)
    bpr, aat = float((best > 1 / thr).mean()), float((fit > 1 / thr).sum(1).mean())
    LOGGER.info(f"{_prefix()}thr={1 / thr:.2f}: {bpr:.4f} best possible recall, {aat:.2f} anchors past thr")
    past = fit[fit > 1 / thr]
    listed = ",  ".join(f"{round(w)},{round(h)}" for w, h in anchors)
    LOGGER.info(f"{_prefix()}n={len(anchors)}, img_size={img_size}, metric_all={fit.mean():.3f}/{best.mean():.3f}"
                f"-mean/best, past_thr={past.mean() if len(past) else 0:.3f}-mean: {listed}")
    return anchors


def kmean_anchors(dataset: YoloDataset, n: int = 9, img_size: int = 640, thr: float = 4.0, gen: int = 1000,
                  seed: int = 0) -> np.ndarray:
    """Anchors (n, 2) in pixels fitted to the data set: k-means on whitened sizes, then ``gen`` mutations."""
    rng = np.random.default_rng(seed)
    wh0 = label_sizes(dataset, img_size)
    tiny = int((wh0 < 3.0).any(1).sum())
    if tiny:
        LOGGER.warning(f"{_prefix()}WARNING: Extremely small objects found. {tiny} of {len(wh0)} labels are "
                       "< 3 pixels in size.")
    wh = wh0[(wh0 >= 2.0).any(1)].astype(np.float64)
    LOGGER.info(f"{_prefix()}Running kmeans for {n} anchors on {len(wh)} points...")
    if len(wh) >= n:
        scale = wh.std(0) + 1e-9
        anchors = kmeans(wh / scale, n, rng) * scale
    else:  # too few boxes: spread anchors over the size range
        anchors = np.sort(rng.uniform(img_size / 64, img_size / 2, (n, 2)), axis=0)
    anchors = _describe(anchors, wh0, thr, img_size)
    best_fit = _fitness(anchors, wh, thr)
    bar = tqdm(range(gen), desc=f"{_prefix()}Evolving anchors with Genetic Algorithm:",
               disable=not dist.is_main_process() or not sys.stderr.isatty(), leave=False)  # no bar in a log
    for _ in bar:
        change = np.ones(anchors.shape)
        while (change == 1).all():  # mutate until something changes
            change = ((rng.random(anchors.shape) < 0.9) * rng.random() * rng.standard_normal(anchors.shape) * 0.1
                      + 1).clip(0.3, 3.0)
        candidate = (anchors * change).clip(min=2.0)
        fit = _fitness(candidate, wh, thr)
        if fit > best_fit:
            best_fit, anchors = fit, candidate
            bar.desc = f"{_prefix()}Evolving anchors with Genetic Algorithm: fitness = {best_fit:.4f}"
    LOGGER.info(f"{_prefix()}Evolving anchors with Genetic Algorithm: fitness = {best_fit:.4f}")
    return _describe(anchors, wh0, thr, img_size)


def _new_anchors(dataset: YoloDataset, anchors: torch.Tensor, thr: float, img_size: int) -> np.ndarray | None:
    """Rank 0's decision: better anchors (k, 2) in pixels, or None to keep the model's."""
    wh = label_sizes(dataset, img_size, np.random.default_rng(0))
    if not len(wh):
        LOGGER.info(f"{_prefix()}no labels to check anchors against; keeping the model's anchors")
        return None
    bpr, aat = anchor_metric(anchors, wh, thr)
    message = f"{_prefix()}Analyzing anchors... anchors/target = {aat:.2f}, Best Possible Recall (BPR) = {bpr:.4f}"
    if bpr >= BPR_TARGET:
        LOGGER.info(f"{message}. Current anchors are a good fit to dataset")
        return None
    LOGGER.info(f"{message}. Attempting to improve anchors, please wait...")
    new = kmean_anchors(dataset, n=len(anchors), img_size=img_size, thr=thr)
    new_bpr, _ = anchor_metric(new, wh, thr)
    if new_bpr <= bpr:
        LOGGER.info(f"{_prefix()}Original anchors better than new anchors. Proceeding with original anchors.")
        return None
    return new


def check_anchors(dataset: YoloDataset, model: torch.nn.Module, thr: float = 4.0, img_size: int = 640) -> bool:
    """Replace the model's anchors when they fit the data badly (BPR < 0.98); True when they were replaced.

    Rank 0 decides and the result is broadcast, so every rank ends with identical anchors.
    All ranks must call it.
    """
    detect = model.head  # an anchor-based head (the builder calls this only for those)
    current = detect.anchors.detach().cpu().view(-1, 2)  # pixels, P3 first
    new = _new_anchors(dataset, current, thr, img_size) if dist.is_main_process() else None
    new = dist.broadcast_object(None if new is None else new.tolist())
    if new is None:
        return False
    with torch.no_grad():
        levels = torch.tensor(new, dtype=detect.anchors.dtype, device=detect.anchors.device)
        detect.anchors.copy_(levels.view_as(detect.anchors))  # sorted by area: smallest on P3
    check_anchor_order(detect)
    detect.clear_grid_cache()
    LOGGER.info(f"{_prefix()}New anchors saved to model. Update model *.yaml to use these anchors in the future.")
    return True
