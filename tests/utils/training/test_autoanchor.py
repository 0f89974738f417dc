"""Autoanchor: BPR of known cases, k-means + evolution re-fit when BPR < 0.98, logged, written into the model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from utils.training.autoanchor import anchor_metric, check_anchors, kmean_anchors, kmeans, label_sizes


def _dataset(sizes: list[tuple[float, float]], count: int = 60) -> SimpleNamespace:
    """Square 640 px images, one box each, cycling through the given normalised (w, h) sizes."""
    labels = [np.array([[0, 0.5, 0.5, *sizes[i % len(sizes)]]], np.float32) for i in range(count)]
    return SimpleNamespace(shapes=np.full((count, 2), 640.0), labels=labels)


class _Detect(torch.nn.Module):
    """The parts of models.yolo.Detect that autoanchor touches (yolov5's default anchors, strides 8/16/32)."""

    def __init__(self) -> None:
        super().__init__()
        default = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]
        self.register_buffer("anchors", torch.tensor(default, dtype=torch.float32).view(3, 3, 2))
        self.register_buffer("stride", torch.tensor([8.0, 16.0, 32.0]))
        self.cleared = 0

    def clear_grid_cache(self) -> None:
        self.cleared += 1


def _model() -> SimpleNamespace:
    return SimpleNamespace(head=_Detect())


def test_anchor_metric_hand_computed() -> None:
    anchors = np.array([[10.0, 10.0], [100.0, 50.0]])
    wh = np.array([[10.0, 10.0], [50.0, 50.0], [100.0, 10.0]])
    # box 1 fits anchor 1 (ratio 1); box 2: worst ratios 1/5 and 1/2 -> fits only anchor 2; box 3: 1/10, 1/5 -> none
    bpr, aat = anchor_metric(anchors, wh, thr=4.0)
    assert bpr == pytest.approx(2 / 3) and aat == pytest.approx(2 / 3)


def test_label_sizes_scale_to_the_long_side() -> None:
    data = SimpleNamespace(shapes=np.array([[200.0, 100.0]]), labels=[np.array([[0, 0.5, 0.5, 0.5, 0.5]])])
    assert label_sizes(data, 640).tolist() == [[320.0, 160.0]]


def test_kmeans_finds_separated_clusters() -> None:
    rng = np.random.default_rng(0)
    points = np.concatenate([rng.normal(c, 0.05, (30, 2)) for c in (0, 5, 10)])
    centres = np.sort(kmeans(points, 3, rng)[:, 0])
    np.testing.assert_allclose(centres, [0, 5, 10], atol=0.1)


def test_bad_anchors_are_replaced_and_logged(yolo_log: list[str]) -> None:
    model = _model()
    data = _dataset([(0.9, 0.05), (0.05, 0.9), (0.3, 0.02)])  # long thin boxes no default anchor fits
    before = model.head.anchors.clone()
    assert check_anchors(data, model, thr=4.0, img_size=640)
    after = model.head.anchors
    assert not torch.equal(before, after) and after.shape == before.shape
    bpr, _ = anchor_metric(after.view(-1, 2), label_sizes(data, 640), 4.0)
    assert bpr >= 0.98
    areas = after.prod(-1).mean(-1)
    assert areas[0] <= areas[1] <= areas[2]  # smallest anchors on the stride-8 level
    assert any(line.startswith("autoanchor: Analyzing anchors... anchors/target =") and "BPR" in line
               for line in yolo_log)
    assert any("New anchors saved to model" in line for line in yolo_log)
    assert model.head.cleared == 1  # the decoded grid is rebuilt with the new anchors


def test_good_anchors_are_kept() -> None:
    model = _model()
    anchors = model.head.anchors.view(-1, 2) / 640
    data = _dataset([tuple(a) for a in anchors.tolist()])
    before = model.head.anchors.clone()
    assert not check_anchors(data, model, thr=4.0, img_size=640)
    assert torch.equal(model.head.anchors, before) and model.head.cleared == 0


def test_kmean_anchors_returns_sorted_pixels() -> None:
    anchors = kmean_anchors(_dataset([(0.1, 0.1), (0.3, 0.2), (0.6, 0.7)]), n=3, img_size=320, gen=50)
    assert anchors.shape == (3, 2) and (np.diff(anchors.prod(1)) >= 0).all()
    np.testing.assert_allclose(anchors, [[32, 32], [96, 64], [192, 224]], rtol=0.15)
