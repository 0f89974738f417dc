"""The anchor-free and YOLO26 losses: hand-computed terms, a perfect prediction, finite gradients, the one-to-many /
one-to-one schedule, and tiny YOLOv8 and YOLO26 models that fit one synthetic batch."""

from __future__ import annotations

import math
import types

import pytest
import torch
from torch import nn

from models.head_anchor_free import make_anchors
from models.yolo import Model, load_model_config
from utils.training.loss_anchor_free import AnchorFreeLoss, EndToEndLoss, distribution_focal_loss

HYP = {"box": 7.5, "cls": 0.5, "dfl": 1.5}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fake_model(nc: int = 2, reg_max: int = 16, strides: tuple[float, ...] = (8.0,)) -> nn.Module:
    """What a loss reads of a model: its head's class count, bins and strides."""
    model = nn.Module()
    model.head = types.SimpleNamespace(nc=nc, reg_max=reg_max, stride=torch.tensor(strides))
    return model


def perfect_predictions(gt_grid: list[float], reg_max: int, nc: int = 2) -> dict:
    """A one-level (4 x 4 cells, stride 8) head output whose every cell predicts ``gt_grid`` (xyxy, grid units)
    exactly: one-hot side distributions (or the sides themselves for reg_max 1)."""
    points, strides = make_anchors([(4, 4)], [8.0])
    sides = torch.cat((points - torch.tensor(gt_grid[:2]), torch.tensor(gt_grid[2:]) - points), 1)  # (16, 4)
    if reg_max > 1:
        bins = sides.clamp(0, reg_max - 1).round().long()
        raw = torch.full((16, 4, reg_max), -60.0).scatter_(2, bins.unsqueeze(-1), 60.0).view(16, 4 * reg_max)
    else:
        raw = sides
    return {"boxes": raw.T.unsqueeze(0).contiguous(), "scores": torch.full((1, nc, 16), -3.0),
            "anchor_points": points, "stride_tensor": strides, "feature_sizes": [(4, 4)]}


@pytest.mark.parametrize("reg_max, names", [(16, ("box", "cls", "dfl")), (1, ("box", "cls", "l1"))])
def test_a_perfect_box_prediction_has_no_box_or_side_loss(reg_max: int, names: tuple[str, ...]) -> None:
    """The box [4, 4, 28, 28] px (0.5 .. 3.5 cells) holds cells 5, 6, 9, 10, each 1 and 2 cells from its sides."""
    loss = AnchorFreeLoss(fake_model(reg_max=reg_max), HYP)
    targets = torch.tensor([[0.0, 1.0, 0.5, 0.5, 0.75, 0.75]])  # image 0, class 1, centred, 24 px of 32
    total, items = loss(perfect_predictions([0.5, 0.5, 3.5, 3.5], reg_max), targets)
    assert loss.names == names
    assert items[0].item() == pytest.approx(0.0, abs=1e-6) and items[2].item() == pytest.approx(0.0, abs=1e-6)
    assert items[1].item() > 0 and total.item() == pytest.approx(items.sum().item())


def test_the_terms_by_hand_for_one_assigned_cell() -> None:
    """One cell predicts the box exactly but its distribution is spread; cls BCE over all cells and classes."""
    preds = perfect_predictions([0.5, 0.5, 3.5, 3.5], 16)
    loss = AnchorFreeLoss(fake_model(), HYP, topk=1)
    targets = torch.tensor([[0.0, 0.0, 0.5, 0.5, 0.75, 0.75]])
    _, items = loss(preds, targets)
    # cell 5 (centre 1.5, 1.5) is the first of four exact predictions: it alone is assigned, with target score 1
    bce_all = nn.functional.binary_cross_entropy_with_logits(torch.tensor(-3.0), torch.tensor(0.0)).item() * 32
    bce_fg = nn.functional.binary_cross_entropy_with_logits(torch.tensor(-3.0), torch.tensor(1.0)).item()
    expected_cls = (bce_all - nn.functional.binary_cross_entropy_with_logits(torch.tensor(-3.0), torch.tensor(0.0))
                    .item() + bce_fg) * 0.5
    assert items[1].item() == pytest.approx(expected_cls, rel=1e-5)


def test_distribution_focal_loss_by_hand() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.5]])
    log_p = torch.log_softmax(logits[0], 0)
    expected = -(0.7 * log_p[1] + 0.3 * log_p[2])
    assert distribution_focal_loss(logits, torch.tensor([1.3])).item() == pytest.approx(expected.item(), rel=1e-6)
    assert distribution_focal_loss(logits, torch.tensor([9.0])).item() == pytest.approx(
        -(0.01 * log_p[2] + 0.99 * log_p[3]).item(), rel=1e-5)  # clamped just below the last bin


def test_targets_are_padded_per_image() -> None:
    targets = torch.tensor([[2, 1, 0.5, 0.5, 0.5, 0.25], [0, 0, 0.25, 0.25, 0.5, 0.5], [2, 3, 0.1, 0.2, 0.2, 0.2]])
    labels, boxes, mask = AnchorFreeLoss.targets_by_image(targets, 3, [32.0, 64.0])  # images 32 high, 64 wide
    assert labels.shape == (3, 2, 1) and mask[:, :, 0].tolist() == [[True, False], [False, False], [True, True]]
    assert labels[2, :, 0].tolist() == [1, 3] and boxes[0, 0].tolist() == [0.0, 0.0, 32.0, 16.0]
    assert boxes[2, 0].tolist() == [16.0, 12.0, 48.0, 20.0]
    empty = AnchorFreeLoss.targets_by_image(torch.zeros(0, 6), 2, [32.0, 32.0])
    assert empty[0].shape == (2, 0, 1)


def test_without_targets_only_the_class_loss_remains() -> None:
    loss = AnchorFreeLoss(fake_model(), HYP)
    total, items = loss(perfect_predictions([0.5, 0.5, 3.5, 3.5], 16), torch.zeros(0, 6))
    assert items[0] == 0 and items[2] == 0 and items[1] > 0 and torch.isfinite(total)


def test_label_smoothing_spreads_a_share_of_each_foreground_target() -> None:
    loss = AnchorFreeLoss(fake_model(nc=4), HYP, label_smoothing=0.2)
    scores = torch.zeros(1, 2, 4)
    scores[0, 0, 2] = 0.8
    smoothed = loss.smoothed(types.SimpleNamespace(scores=scores))
    assert smoothed[0, 0].tolist() == pytest.approx([0.04, 0.04, 0.68, 0.04]) and smoothed[0, 1].sum() == 0


def test_end_to_end_weights_follow_the_epochs() -> None:
    loss = EndToEndLoss(fake_model(reg_max=1), HYP)
    assert (loss.o2m, loss.o2o) == (0.8, pytest.approx(0.2))
    loss.set_epoch(0, 10)
    assert loss.o2m == pytest.approx(0.8)
    loss.set_epoch(3, 10)
    assert loss.o2m == pytest.approx(0.1 + 0.7 * (1 - 3 / 9)) and loss.o2o == pytest.approx(1 - loss.o2m)
    loss.set_epoch(9, 10)
    assert (loss.o2m, loss.o2o) == (pytest.approx(0.1), pytest.approx(0.9))


def test_end_to_end_total_is_the_weighted_sum_and_items_are_the_one_to_one_terms() -> None:
    loss = EndToEndLoss(fake_model(reg_max=1), HYP)
    loss.set_epoch(2, 5)
    many = perfect_predictions([0.5, 0.5, 3.5, 3.5], 1)
    one = {**many, "boxes": many["boxes"] + 0.3, "scores": many["scores"] + 1}
    targets = torch.tensor([[0.0, 1.0, 0.5, 0.5, 0.75, 0.75]])
    total, items = loss({"one2many": many, "one2one": one}, targets)
    terms_many, terms_one = loss.one2many.terms(many, targets), loss.one2one.terms(one, targets)
    assert total.item() == pytest.approx(terms_many.sum().item() * loss.o2m + terms_one.sum().item() * loss.o2o)
    torch.testing.assert_close(items, terms_one)
    assert loss.one2one.assigner.topk == 7 and loss.one2one.assigner.topk2 == 1 and loss.one2many.assigner.topk == 10


# ------------------------------------------------------------------------------------------ with real models
def synthetic_batch(n: int = 4, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Bright rectangles of two kinds (class 0 wide, class 1 tall) on a dark background, and their targets."""
    generator = torch.Generator().manual_seed(0)
    images = torch.full((n, 3, size, size), 0.1)
    rows = []
    for i in range(n):
        for cls in (0, 1):
            w, h = (0.5, 0.25) if cls == 0 else (0.2, 0.45)
            cx = 0.3 + 0.4 * torch.rand(1, generator=generator).item()
            cy = 0.3 + 0.4 * torch.rand(1, generator=generator).item()
            x1, y1 = int((cx - w / 2) * size), int((cy - h / 2) * size)
            images[i, cls, y1:y1 + int(h * size), x1:x1 + int(w * size)] = 0.9
            rows.append([i, cls, cx, cy, w, h])
    return images, torch.tensor(rows)


def tiny(name: str) -> Model:
    """The n scale of a family at 1/2 its width: the same head and rows, a few hundred thousand parameters."""
    cfg, _ = load_model_config(f"{name}.yaml")
    cfg["scales"]["n"][1] = 0.0625
    torch.manual_seed(0)
    return Model(cfg, nc=2)


@pytest.mark.parametrize("name, loss_class", [("yolov8n", AnchorFreeLoss), ("yolo26n", EndToEndLoss)])
def test_gradients_are_finite_and_reach_every_trained_parameter(name: str, loss_class: type) -> None:
    model = tiny(name).train()
    images, targets = synthetic_batch(2)
    total, items = loss_class(model, HYP)(model(images), targets)
    total.backward()
    assert items.shape == (3,) and torch.isfinite(items).all() and (items > 0).all()
    grads = {k: p.grad for k, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    # the class loss reaches every cell; box terms only the assigned cells (all on P3 for these small boxes)
    head = [k for k in grads if k.startswith(f"model.{len(model.model) - 1}.")]
    assert all(grads[k].abs().sum() > 0 for k in grads if k not in head or "cv3." in k or ".cv2.0." in k)


@pytest.mark.parametrize("name, loss_class", [("yolov8n", AnchorFreeLoss), ("yolo26n", EndToEndLoss)])
def test_a_tiny_model_fits_one_batch(name: str, loss_class: type) -> None:
    """25 Adam steps on one batch of 4 images: the loss ends under 0.6 of its early peak, and so does every term.

    The early peak, not the first value: the task-aligned targets start near 0 (an untrained head's boxes barely
    overlap), so the first steps raise the terms before they fall."""
    model = tiny(name).train()
    images, targets = synthetic_batch()
    loss = loss_class(model, HYP)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    history = []
    for _ in range(25):
        total, items = loss(model(images), targets)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        history.append(items)
    steps = torch.stack(history)
    early, last = steps[:8].max(0).values, steps[-3:].mean(0)
    print(f"{name}: early peak {dict(zip(loss.names, early.tolist()))} -> {dict(zip(loss.names, last.tolist()))}")
    assert last.sum() < 0.6 * steps[:8].sum(1).max() and (last < early).all(), (early, last)
    assert math.isfinite(last.sum().item())
