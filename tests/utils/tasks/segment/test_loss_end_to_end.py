"""utils/tasks/segment/loss.py, YOLO26-seg's EndToEndSegmentLoss: the semantic targets from both mask layouts, the
semantic term (0.5 BCE + 0.5 Dice) by hand, gradients that reach every parameter with and without objects (DDP), and
the two branch sets weighed by the YOLO26 schedule."""

from __future__ import annotations

import math

import pytest
import torch

from models.yolo import Model, load_model_config
from tests.utils.training.test_loss_anchor_free import HYP
from utils.tasks.segment.loss import EndToEndSegmentLoss, semantic_loss, semantic_targets

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NAMES = ("box", "seg", "cls", "l1", "semseg")


def tiny_seg26() -> Model:
    cfg, _ = load_model_config("yolo26-seg.yaml")
    cfg.update(nc=2, scales={"n": [0.33, 0.125, 1024]}, scale="n")
    torch.manual_seed(0)
    return Model(cfg).train()


def two_objects() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Image 0 holds a class-1 square, image 1 a class-0 square; (targets, overlap index masks, stacked masks,
    the semantic targets by hand (2, 2, 16, 16))."""
    targets = torch.tensor([[0, 1, 0.25, 0.25, 0.25, 0.25], [1, 0, 0.625, 0.625, 0.25, 0.25]])
    stacked = torch.zeros(2, 16, 16)
    stacked[0, 2:6, 2:6] = 1
    stacked[1, 8:12, 8:12] = 1
    index = torch.zeros(2, 16, 16)
    index[0], index[1] = stacked[0], stacked[1]  # each image's first (only) object is 1
    expected = torch.zeros(2, 2, 16, 16)
    expected[0, 1], expected[1, 0] = stacked[0], stacked[1]
    return targets, index, stacked, expected


def test_semantic_targets_are_each_class_union_in_both_layouts() -> None:
    targets, index, stacked, expected = two_objects()
    assert torch.equal(semantic_targets(index, targets, 2, 2, overlap=True), expected)
    assert torch.equal(semantic_targets(stacked, targets, 2, 2, overlap=False), expected)
    both = torch.tensor([[0, 0, 0.5, 0.5, 1, 1], [0, 0, 0.5, 0.5, 1, 1]])  # two class-0 objects of one image
    masks = torch.zeros(2, 4, 4)
    masks[0, :2], masks[1, 1:3] = 1, 1
    union = semantic_targets(masks, both, 1, 2, overlap=False)
    assert union[0, 0].sum() == 12 and union.max() == 1 and union[0, 1].sum() == 0


def test_semantic_loss_by_hand() -> None:
    """One class, 2x2 logits 0 against a target with one pixel set: BCE log 2, Dice 1 - (2 * 0.5 + 1) / (2 + 1 + 1);
    a 4x4 target is sampled down to the logits' size first; confident right logits cost ~nothing."""
    logits = torch.zeros(1, 1, 2, 2)
    target = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]]])
    expected = 0.5 * math.log(2) + 0.5 * (1 - 2.0 / 4.0)
    assert semantic_loss(logits, target).item() == pytest.approx(expected, rel=1e-6)
    large = target.repeat_interleave(2, 2).repeat_interleave(2, 3)
    assert semantic_loss(logits, large).item() == pytest.approx(expected, rel=1e-6)
    assert semantic_loss((target * 2 - 1) * 30, target).item() < 1e-6


def test_gradients_reach_every_parameter_with_and_without_objects() -> None:
    """Every trained parameter, Proto26's semantic branch included, gets a finite gradient, also from a batch
    without objects (its seg and semseg terms then zero)."""
    model = tiny_seg26()
    targets, index, _, _ = two_objects()
    images = torch.rand(2, 3, 64, 64)
    loss = EndToEndSegmentLoss(model, HYP)
    assert loss.names == NAMES
    for rows, masks in ((targets, index), (torch.zeros(0, 6), torch.zeros(2, 16, 16))):
        model.zero_grad(set_to_none=True)
        total, items = loss(model(images), rows, masks=masks)
        total.backward()
        assert items.shape == (5,) and torch.isfinite(items).all()
        missing = [k for k, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert missing == [] and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    assert items[1] == 0 and items[4] == 0


def test_both_branch_sets_are_weighed_and_the_semantic_term_is_the_maps() -> None:
    model = tiny_seg26()
    targets, index, _, expected = two_objects()
    loss = EndToEndSegmentLoss(model, HYP)
    loss.set_epoch(3, 10)
    preds = model(torch.rand(2, 3, 64, 64))
    total, items = loss(preds, targets, masks=index)
    many = loss.one2many.terms(preds["one2many"], targets, index)
    one = loss.one2one.terms(preds["one2one"], targets, index)
    assert torch.allclose(items, one.detach())
    assert total.item() == pytest.approx(((many.sum() * loss.o2m + one.sum() * loss.o2o) * 2).item(), rel=1e-5)
    semantic = semantic_loss(preds["one2many"]["semantic"].float(), expected) * HYP["box"]
    assert many[4].item() == pytest.approx(semantic.item(), rel=1e-5) and many[1] > 0
