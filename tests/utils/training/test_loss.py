"""utils/training/loss.py: target assignment by hand, gain scaling, label smoothing, and the loss's behaviour."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from models.yolo import Model
from utils.training.loss import ComputeLoss, LossGains, smooth_bce_targets

HYP = {"box": 0.05, "obj": 1.0, "cls": 0.5, "anchor_t": 4.0, "cls_pw": 1.0, "obj_pw": 1.0}


def one_level_model(anchor_px: float = 16.0, stride: float = 8.0, nc: int = 2) -> SimpleNamespace:
    """A stand-in with only what ComputeLoss reads: one level, one anchor (pixels), stride 8."""
    detect = SimpleNamespace(nl=1, na=1, nc=nc, anchors=torch.tensor([[[anchor_px, anchor_px]]]),
                             stride=torch.tensor([stride]))
    return SimpleNamespace(head=detect)


def test_smooth_bce_targets():
    assert smooth_bce_targets(0.0) == (1.0, 0.0)
    assert smooth_bce_targets(0.1) == pytest.approx((0.95, 0.05))


def test_gains_scaled_for_levels_classes_and_size():
    same = LossGains.from_hyp(HYP, num_levels=3, num_classes=80, img_size=640)
    assert (same.box, same.obj, same.cls) == pytest.approx((0.05, 1.0, 0.5))
    small = LossGains.from_hyp(HYP, num_levels=3, num_classes=3, img_size=320)
    assert small.obj == pytest.approx(0.25) and small.cls == pytest.approx(0.5 * 3 / 80)
    four = LossGains.from_hyp(HYP, num_levels=4, num_classes=80, img_size=640)
    assert four.box == pytest.approx(0.05 * 3 / 4)


def test_target_gets_its_cell_and_two_nearest_neighbours():
    loss = ComputeLoss(one_level_model(), HYP, img_size=64)
    # 64 px image, stride 8 -> 8x8 grid; centre (2.4, 5.6) in cells, box 2x2 cells = the anchor
    targets = torch.tensor([[0, 1, 0.3, 0.7, 0.25, 0.25]])
    match = loss.build_targets(0, torch.Size((1, 1, 8, 8, 7)), targets)
    cells = sorted(zip(match.grid_x.tolist(), match.grid_y.tolist()))
    assert cells == [(1, 5), (2, 5), (2, 6)]  # own cell, the left neighbour (x frac .4), the lower one (y frac .6)
    assert match.cls.tolist() == [1, 1, 1]
    own = [i for i, c in enumerate(zip(match.grid_x.tolist(), match.grid_y.tolist())) if c == (2, 5)][0]
    assert match.box[own].tolist() == pytest.approx([0.4, 0.6, 2.0, 2.0], abs=1e-5)  # xy within the cell, wh cells
    assert match.anchor_wh.tolist() == [[2.0, 2.0]] * 3  # anchors in grid units (pixels / stride)


def test_targets_too_far_from_the_anchor_shape_are_not_matched():
    loss = ComputeLoss(one_level_model(anchor_px=16.0), HYP, img_size=64)
    wide = torch.tensor([[0, 0, 0.5, 0.5, 1.0, 0.25]])  # 64x16 px vs a 16x16 anchor: ratio 4.0, not < 4
    assert loss.build_targets(0, torch.Size((1, 1, 8, 8, 7)), wide).image.numel() == 0
    ok = torch.tensor([[0, 0, 0.5, 0.5, 0.9, 0.25]])  # ratio 3.6
    assert loss.build_targets(0, torch.Size((1, 1, 8, 8, 7)), ok).image.numel() >= 1


def test_empty_targets_give_objectness_loss_only():
    loss = ComputeLoss(one_level_model(), HYP, img_size=64)
    preds = [torch.zeros(2, 1, 8, 8, 7)]
    total, items = loss(preds, torch.zeros(0, 6))
    assert items[0] == 0 and items[2] == 0 and items[1] > 0
    assert total.item() == pytest.approx(items.sum().item() * 2, rel=1e-6)  # scaled by the batch size


def _perfect_logits(loss: ComputeLoss, targets: torch.Tensor, shape: tuple) -> torch.Tensor:
    """Raw maps whose decoded boxes equal the targets at the matched cells, objectness high there."""
    pred = torch.full(shape, -8.0)
    match = loss.build_targets(0, torch.Size(shape), targets)
    xy = ((match.box[:, :2] + 0.5) / 2).clamp(1e-4, 1 - 1e-4)
    wh = ((match.box[:, 2:] / match.anchor_wh).sqrt() / 2).clamp(1e-4, 1 - 1e-4)
    cell = torch.cat((torch.logit(xy), torch.logit(wh)), 1)
    pred[match.image, match.anchor, match.grid_y, match.grid_x, :4] = cell
    pred[match.image, match.anchor, match.grid_y, match.grid_x, 4] = 8.0
    pred[match.image, match.anchor, match.grid_y, match.grid_x, 5 + match.cls] = 8.0
    return pred


def test_perfect_prediction_has_near_zero_box_loss_and_beats_random():
    loss = ComputeLoss(one_level_model(), HYP, img_size=64)
    targets = torch.tensor([[0, 1, 0.3, 0.7, 0.25, 0.25], [1, 0, 0.55, 0.45, 0.2, 0.3]])
    shape = (2, 1, 8, 8, 7)
    _, good = loss([_perfect_logits(loss, targets, shape)], targets)
    torch.manual_seed(0)
    _, bad = loss([torch.randn(shape)], targets)
    assert good[0] < 1e-3 * HYP["box"]
    assert (good < bad).all()


def test_label_smoothing_raises_the_floor_of_the_class_loss():
    plain = ComputeLoss(one_level_model(), HYP, img_size=64)
    smooth = ComputeLoss(one_level_model(), HYP, img_size=64, label_smoothing=0.2)
    targets = torch.tensor([[0, 1, 0.3, 0.7, 0.25, 0.25]])
    pred = _perfect_logits(plain, targets, (1, 1, 8, 8, 7))
    assert smooth([pred], targets)[1][2] > 10 * plain([pred], targets)[1][2]


def test_loss_on_the_real_model_is_finite_and_differentiable(tiny_cfg):
    model = Model(tiny_cfg).train()
    loss = ComputeLoss(model, {**HYP}, img_size=64)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.2, 0.3, 0.1, 0.1]])
    total, items = loss(model(torch.rand(2, 3, 64, 64)), targets)
    total.backward()
    assert torch.isfinite(total) and items.shape == (3,) and (items > 0).all()
    assert model.head.m[0].weight.grad.abs().sum() > 0


def test_focal_loss_equals_the_formula_on_a_hand_case() -> None:
    from utils.training.loss import FocalLoss

    logits, target = torch.tensor([2.0, -1.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    focal = FocalLoss(torch.nn.BCEWithLogitsLoss(), gamma=2.0, alpha=0.25)(logits, target)
    expected = []
    for x, y in zip(logits.tolist(), target.tolist()):
        p = 1 / (1 + math.exp(-x))
        bce = -(y * math.log(p) + (1 - y) * math.log(1 - p))
        p_t, a_t = (p, 0.25) if y == 1 else (1 - p, 0.75)
        expected.append(bce * a_t * (1 - p_t) ** 2)
    assert focal.item() == pytest.approx(sum(expected) / 3, rel=1e-6)
    assert focal.item() == pytest.approx(0.101961, abs=1e-6)  # the same by hand


def test_fl_gamma_in_the_hyps_switches_the_class_and_objectness_losses_to_focal(tiny_cfg) -> None:
    from models.yolo import Model
    from utils.training.loss import ComputeLoss, FocalLoss

    hyp = {"box": 0.05, "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}
    model = Model(tiny_cfg)
    plain, focal = ComputeLoss(model, hyp), ComputeLoss(model, {**hyp, "fl_gamma": 1.5})
    assert not isinstance(plain.bce_cls, FocalLoss) and isinstance(focal.bce_cls, FocalLoss)
    assert isinstance(focal.bce_obj, FocalLoss) and focal.bce_obj.gamma == 1.5
    preds = [torch.randn(1, 3, 8, 8, 8), torch.randn(1, 3, 4, 4, 8), torch.randn(1, 3, 2, 2, 8)]
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.3]])
    assert focal(preds, targets)[1][1] < plain(preds, targets)[1][1]  # easy negatives weigh less
