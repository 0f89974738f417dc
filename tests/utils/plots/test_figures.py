"""Every plot renders from tiny inputs into a non-empty image of the expected size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from utils.evaluation.metrics import ConfusionMatrix, ap_per_class
from utils.plots.figures import plot_confusion_matrix, plot_images, plot_labels, plot_metric_curves, plot_results

NAMES = ["circle", "square", "triangle"]
cv2 = pytest.importorskip("cv2")


def _read(path) -> np.ndarray:
    img = cv2.imread(str(path))
    assert img is not None, f"{path} is not an image"
    return img


def _assert_drawn(img: np.ndarray) -> None:
    assert img.size and img.std() > 1.0  # not a blank canvas


def test_plot_results(tmp_path):
    csv_path = tmp_path / "results.csv"
    header = "epoch,train/box_loss,train/obj_loss,train/cls_loss,metrics/precision,metrics/recall," \
             "metrics/mAP_0.5,metrics/mAP_0.5:0.95,x/lr0"
    rows = [f"{e},{0.1 - e / 100},{0.05},{0.02},{e / 10},{e / 12},{e / 11},{e / 20},0.01" for e in range(4)]
    csv_path.write_text("\n".join([header, *rows]) + "\n")
    img = _read(plot_results(csv_path))
    assert img.shape[:2] == (6 * 150, 3 * 4 * 150)  # 2 x 4 panels at 3 inches each, 150 dpi
    _assert_drawn(img)


def test_plot_labels(tmp_path):
    rng = np.random.default_rng(0)
    labels = [np.concatenate((rng.integers(0, 3, (5, 1)), rng.uniform(0.1, 0.9, (5, 4))), 1) for _ in range(4)]
    img = _read(plot_labels(labels, NAMES, tmp_path))
    assert img.shape[:2] == (4 * 150, 12 * 150)
    _assert_drawn(img)


def test_plot_images_labels_and_predictions(tmp_path):
    imgs = torch.full((5, 3, 64, 96), 90, dtype=torch.uint8)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.4, 0.4], [3, 2, 0.3, 0.3, 0.2, 0.2]])
    paths = [f"im{i}.jpg" for i in range(5)]
    labels_img = _read(plot_images(imgs, targets, paths, tmp_path / "val_batch0_labels.jpg", NAMES))
    assert labels_img.shape == (2 * 64, 3 * 96, 3)  # 5 images -> 3 columns x 2 rows
    _assert_drawn(labels_img)
    preds = [torch.tensor([[10.0, 10, 50, 50, 0.9, 1]])] + [torch.zeros(0, 6)] * 4
    pred_img = _read(plot_images(imgs, None, paths, tmp_path / "val_batch0_pred.jpg", NAMES, preds=preds))
    assert pred_img.shape == labels_img.shape
    assert not np.array_equal(pred_img, labels_img)


def test_metric_curves_and_confusion_matrix(tmp_path):
    tp = np.array([[True], [False], [True], [True]]).repeat(10, 1)
    metrics = ap_per_class(tp, np.array([0.9, 0.8, 0.6, 0.3]), np.array([0, 0, 1, 2]), np.array([0, 1, 2, 2]))
    paths = plot_metric_curves(metrics, NAMES, tmp_path)
    assert [p.name for p in paths] == ["PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png"]
    for path in paths:
        img = _read(path)
        assert img.shape[:2] == (6 * 150, 9 * 150)
        _assert_drawn(img)
    cm = ConfusionMatrix(3)
    cm.process_batch(torch.tensor([[0, 0, 10, 10, 0.9, 0]]), torch.tensor([[1, 0, 0, 10, 10]]))
    img = _read(plot_confusion_matrix(cm.matrix, NAMES, tmp_path / "confusion_matrix.png"))
    assert img.shape[0] > 400 and img.shape[1] > 400
    _assert_drawn(img)
    raw = _read(plot_confusion_matrix(cm.matrix, NAMES, tmp_path / "raw.png", normalize=False))
    assert raw.shape == img.shape
