"""The plots users look at: results.png, labels.jpg, batch mosaics, PR/F1/P/R curves, the confusion matrix.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot state, safe in a
background thread); matplotlib is imported inside the functions, so importing this module is cheap.
Batch mosaics are drawn with OpenCV, fast enough to make during training.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from utils.boxes import xywhn2xyxy
from utils.plots.annotate import class_color_rgb, class_name, draw_detections

MOSAIC_MAX_SIZE = 1920  # longest side of a batch mosaic, in pixels
MOSAIC_MAX_IMAGES = 16
PRED_CONF_SHOWN = 0.25  # predictions below this are left out of the val_batch*_pred.jpg mosaics


def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (6, 4)) -> tuple[Any, Any]:
    """A figure on the Agg canvas (no GUI backend, no global pyplot state) and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, tight_layout=True)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig: Any, path: Path, dpi: int = 150) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def plot_results(csv_path: str | Path, save_path: str | Path | None = None) -> Path:
    """results.png next to results.csv: one panel per column (losses, P, R, mAP, learning rates) per epoch."""
    csv_path = Path(csv_path)
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0]]
    data = np.array([[float(v) for v in r] for r in rows[1:] if r], dtype=np.float64).reshape(-1, len(header))
    columns = [i for i, h in enumerate(header) if h != "epoch"]
    epochs = data[:, header.index("epoch")] if "epoch" in header else np.arange(len(data))
    ncols = math.ceil(len(columns) / 2)
    fig, axes = _figure(2, ncols, (3 * ncols, 6))
    for ax, i in zip(axes.ravel(), columns):
        ax.plot(epochs, data[:, i], marker=".", linewidth=2, markersize=6)
        ax.set_title(header[i], fontsize=10)
        ax.set_xlabel("epoch")
    for ax in axes.ravel()[len(columns):]:
        ax.set_visible(False)
    return _save(fig, Path(save_path) if save_path else csv_path.with_name("results.png"))


def plot_labels(labels: Sequence[np.ndarray] | np.ndarray, names: Sequence[str], save_dir: str | Path) -> Path:
    """labels.jpg: instances per class, box centres (x, y) and box sizes (w, h), all normalised."""
    rows = [np.asarray(x, dtype=np.float64).reshape(-1, 5) for x in labels] if isinstance(labels, (list, tuple)) \
        else [np.asarray(labels, dtype=np.float64).reshape(-1, 5)]
    all_labels = np.concatenate(rows) if rows else np.zeros((0, 5))
    classes = all_labels[:, 0].astype(int)
    nc = max(len(names), int(classes.max()) + 1 if len(classes) else 0)
    fig, axes = _figure(1, 3, (12, 4))
    hist_ax, centre_ax, size_ax = axes[0]
    counts = np.bincount(classes, minlength=nc)
    hist_ax.bar(range(nc), counts, color=[class_color_rgb(i) for i in range(nc)])
    hist_ax.set_xticks(range(nc), [class_name(names, i) for i in range(nc)], rotation=90 if nc > 10 else 0)
    hist_ax.set_ylabel("instances")
    hist_ax.set_title(f"{len(all_labels)} labels, {nc} classes")
    for ax, (a, b), title in ((centre_ax, (1, 2), "box centres"), (size_ax, (3, 4), "box sizes")):
        ax.hist2d(all_labels[:, a], all_labels[:, b], bins=50, range=((0, 1), (0, 1)), cmap="Blues")
        ax.set_xlabel("x" if a == 1 else "width")
        ax.set_ylabel("y" if a == 1 else "height")
        ax.set_title(title)
    centre_ax.invert_yaxis()  # image coordinates: y grows downwards
    return _save(fig, Path(save_dir) / "labels.jpg")


def _to_uint8_hwc(img: torch.Tensor | np.ndarray) -> np.ndarray:
    """(3, h, w) RGB tensor (uint8 or float in [0, 1]) -> (h, w, 3) BGR uint8 for OpenCV."""
    arr = img.detach().cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
    if arr.dtype != np.uint8:
        arr = (arr * 255 if arr.max() <= 1.0 else arr).clip(0, 255).astype(np.uint8)
    return np.ascontiguousarray(arr.transpose(1, 2, 0)[..., ::-1])


def _tile_boxes(index: int, h: int, w: int, targets: Any, preds: Any) -> tuple[np.ndarray, np.ndarray, Any]:
    """Boxes (xyxy pixels of the input image), classes and confidences to draw on tile ``index``."""
    if preds is not None:
        det = preds[index]
        det = (det.detach().cpu().numpy() if isinstance(det, torch.Tensor) else np.asarray(det)).reshape(-1, 6)
        det = det[det[:, 4] >= PRED_CONF_SHOWN]
        return det[:, :4], det[:, 5].astype(int), det[:, 4]
    if targets is None:
        return np.zeros((0, 4)), np.zeros(0, int), None
    t = targets.detach().cpu().numpy() if isinstance(targets, torch.Tensor) else np.asarray(targets)
    t = t[t[:, 0] == index]
    return xywhn2xyxy(t[:, 2:6], w=w, h=h), t[:, 1].astype(int), None


def plot_images(imgs: torch.Tensor | np.ndarray, targets: torch.Tensor | np.ndarray | None, paths: Sequence[str],
                fname: str | Path, names: Sequence[str] | None = None,
                preds: Sequence[torch.Tensor | np.ndarray] | None = None) -> Path:
    """A mosaic of a batch (at most 16 images) with labels, or with predictions when ``preds`` is given.

    ``imgs`` (b, 3, h, w) RGB; ``targets`` (n, 6) [image index, cls, cx, cy, w, h] normalised to the
    batch images; ``preds`` per image (k, 6) [x1, y1, x2, y2, conf, cls] in the batch images' pixels.
    """
    count = min(len(imgs), MOSAIC_MAX_IMAGES)
    h, w = int(imgs.shape[2]), int(imgs.shape[3])
    grid = max(math.ceil(math.sqrt(count)), 1)
    scale = min(1.0, MOSAIC_MAX_SIZE / (grid * max(h, w)))
    th, tw = max(int(h * scale), 1), max(int(w * scale), 1)
    rows = math.ceil(count / grid)
    mosaic = np.full((rows * th, grid * tw, 3), 255, dtype=np.uint8)
    thickness = max(round(th / 200), 1)
    for i in range(count):
        tile = _to_uint8_hwc(imgs[i])
        boxes, classes, confs = _tile_boxes(i, h, w, targets, preds)
        if scale != 1.0:
            tile = cv2.resize(tile, (tw, th), interpolation=cv2.INTER_AREA)
        draw_detections(tile, np.asarray(boxes) * scale, classes, confs, names, line_thickness=thickness)
        y, x = (i // grid) * th, (i % grid) * tw
        mosaic[y:y + th, x:x + tw] = tile
        cv2.rectangle(mosaic, (x, y), (x + tw - 1, y + th - 1), (255, 255, 255), thickness)
        if i < len(paths):
            cv2.putText(mosaic, Path(paths[i]).name[:40], (x + 3, y + th - 4), cv2.FONT_HERSHEY_SIMPLEX,
                        max(th / 600, 0.3), (220, 220, 220), 1, cv2.LINE_AA)
    fname = Path(fname)
    fname.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(fname), mosaic)
    return fname


def _class_curves_figure(x: np.ndarray, curves: np.ndarray, labels: Sequence[str], mean_label: str,
                         xlabel: str, ylabel: str, title: str) -> Any:
    """Per-class curves (legend when there are few classes) plus their mean, thick."""
    fig, axes = _figure(1, 1, (9, 6))
    ax = axes[0, 0]
    for curve, label in zip(curves, labels):
        ax.plot(x, curve, linewidth=1, label=label if len(labels) < 21 else None)
    if len(curves):
        ax.plot(x, curves.mean(0), linewidth=3, color="blue", label=mean_label)
    ax.set(xlabel=xlabel, ylabel=ylabel, xlim=(0, 1), ylim=(0, 1.02), title=title)
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left", fontsize=8)
    return fig


def plot_pr_curve(metrics: Any, names: Sequence[str], save_path: str | Path) -> Path:
    """Precision-recall curves at IoU .5 (the envelopes AP integrates), with AP@.5 per class."""
    recall_points = np.linspace(0.0, 1.0, metrics.pr_curves.shape[-1])  # the metrics' evenly spaced recall points
    labels = [f"{class_name(names, int(c))} {ap:.3f}" for c, ap in zip(metrics.classes, metrics.ap50)]
    mean_ap = float(metrics.ap50.mean()) if len(metrics.classes) else 0.0
    fig = _class_curves_figure(recall_points, metrics.pr_curves, labels, f"all classes {mean_ap:.3f} mAP@0.5",
                               "Recall", "Precision", "Precision-Recall Curve")
    return _save(fig, Path(save_path))


def _curve_vs_confidence(metrics: Any, names: Sequence[str], curves: np.ndarray, ylabel: str,
                         save_path: str | Path) -> Path:
    conf_grid = np.linspace(0.0, 1.0, curves.shape[-1])  # the metrics' evenly spaced confidences
    labels = [class_name(names, int(c)) for c in metrics.classes]
    mean_label = "all classes"
    if len(curves):
        mean = curves.mean(0)
        best = int(mean.argmax())
        mean_label = f"all classes {mean[best]:.2f} at {conf_grid[best]:.3f}"
    fig = _class_curves_figure(conf_grid, curves, labels, mean_label, "Confidence", ylabel,
                               f"{ylabel}-Confidence Curve")
    return _save(fig, Path(save_path))


def plot_f1_curve(metrics: Any, names: Sequence[str], save_path: str | Path) -> Path:
    """F1 against the confidence threshold (IoU .5): where P and R are read."""
    return _curve_vs_confidence(metrics, names, metrics.f1_curves, "F1", save_path)


def plot_metric_curves(metrics: Any, names: Sequence[str], save_dir: str | Path) -> list[Path]:
    """PR_curve.png, F1_curve.png, P_curve.png and R_curve.png in ``save_dir``."""
    save_dir = Path(save_dir)
    return [plot_pr_curve(metrics, names, save_dir / "PR_curve.png"),
            plot_f1_curve(metrics, names, save_dir / "F1_curve.png"),
            _curve_vs_confidence(metrics, names, metrics.p_curves, "Precision", save_dir / "P_curve.png"),
            _curve_vs_confidence(metrics, names, metrics.r_curves, "Recall", save_dir / "R_curve.png")]


def plot_confusion_matrix(matrix: np.ndarray, names: Sequence[str], save_path: str | Path,
                          normalize: bool = True) -> Path:
    """The confusion matrix as a heat map: rows predicted, columns true, 'background' last."""
    nc = len(matrix) - 1
    values = matrix.astype(np.float64)
    if normalize:
        values = values / np.maximum(values.sum(0, keepdims=True), 1e-9)
    ticks = [class_name(names, i) for i in range(nc)] + ["background"]
    fig, axes = _figure(1, 1, (min(4 + 0.4 * nc, 16), min(3.5 + 0.35 * nc, 14)))
    ax = axes[0, 0]
    image = ax.imshow(values, cmap="Blues", vmin=0, vmax=1 if normalize else None)
    fig.colorbar(image, ax=ax)
    ax.set_xticks(range(nc + 1), ticks, rotation=90)
    ax.set_yticks(range(nc + 1), ticks)
    ax.set(xlabel="True", ylabel="Predicted", title="Confusion Matrix" + (" (normalised)" if normalize else ""))
    if nc < 30:
        for (r, c), v in np.ndenumerate(values):
            if v > 0.005:
                ax.text(c, r, f"{v:.2f}" if normalize else f"{int(v)}", ha="center", va="center", fontsize=7,
                        color="white" if v > 0.5 * values.max() else "black")
    return _save(fig, Path(save_path))


def plot_study(study_txt: str | Path, save_path: str | Path | None = None) -> Path:
    """study.png from test.py --task study: mAP against image size, and mAP@.5:.95 against inference time."""
    study_txt = Path(study_txt)
    rows = np.loadtxt(study_txt, ndmin=2)  # img_size P R mAP@.5 mAP@.5:.95 pre inference NMS (ms)
    fig, axes = _figure(1, 2, (10, 4))
    ax_size, ax_time = axes[0]
    ax_size.plot(rows[:, 0], rows[:, 3], marker=".", label="mAP@.5")
    ax_size.plot(rows[:, 0], rows[:, 4], marker=".", label="mAP@.5:.95")
    ax_size.set_xlabel("image size (pixels)")
    ax_size.legend()
    ax_time.plot(rows[:, 6], rows[:, 4], marker=".", label=study_txt.stem.replace("study_", ""))
    for size, ms, value in zip(rows[:, 0], rows[:, 6], rows[:, 4]):
        ax_time.annotate(f"{int(size)}", (ms, value), fontsize=7)
    ax_time.set_xlabel("inference (ms/image)")
    ax_time.set_ylabel("mAP@.5:.95")
    ax_time.legend()
    return _save(fig, Path(save_path) if save_path else study_txt.with_name("study.png"))
