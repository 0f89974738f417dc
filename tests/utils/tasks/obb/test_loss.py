"""utils/tasks/obb/loss.py: the rotated assigner's candidates, the rotated side distances, the angle term by hand,
a prediction equal to its target costing (almost) nothing, and both families' losses training an OBB model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from models.head_anchor_free import make_anchors
from models.yolo import Model
from utils.tasks.obb.head import dist2rbox
from utils.tasks.obb.loss import (
    AnchorFreeObbLoss,
    EndToEndObbLoss,
    RotatedTaskAlignedAssigner,
    angle_loss,
    rbox2dist,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HYP = {"box": 7.5, "cls": 0.5, "dfl": 1.5, "angle": 1.0}


def test_rbox2dist_inverts_dist2rbox() -> None:
    generator = torch.Generator().manual_seed(0)
    sides = torch.rand(50, 4, generator=generator) * 5 + 0.1
    angles = (torch.rand(50, 1, generator=generator) - 0.5) * 3
    points = torch.rand(50, 2, generator=generator) * 20
    boxes = torch.cat((dist2rbox(sides, angles, points, dim=-1), angles), -1)
    assert torch.allclose(rbox2dist(points, boxes), sides, atol=1e-4)
    assert rbox2dist(points, boxes, reg_max=2).max() <= 2 - 0.01 + 1e-6


def test_rotated_candidates_by_hand() -> None:
    assigner = RotatedTaskAlignedAssigner(strides=None)
    box = torch.tensor([[[8.0, 8.0, 12.0, 2.0, math.pi / 4]]])  # a thin box along the diagonal
    points = torch.tensor([[8.0, 8.0], [11.0, 11.0], [11.0, 5.0], [12.5, 12.5], [2.0, 2.0]])
    inside = assigner.candidates(points, box, torch.ones(1, 1, 1))
    assert inside[0, 0].tolist() == [True, True, False, False, False]  # 12.5 is 6.36 along: past the half length
    widened = RotatedTaskAlignedAssigner(strides=(8.0, 16.0)).candidates(points, box, torch.ones(1, 1, 1))
    assert widened[0, 0].tolist() == [True, True, True, True, False]  # sides below 16 px widened to 16


def test_angle_term_by_hand() -> None:
    square = torch.tensor([[0.0, 0.0, 4.0, 4.0, 0.3]])
    assert angle_loss(torch.tensor([0.3]), square).item() == pytest.approx(0.0, abs=1e-12)
    assert angle_loss(torch.tensor([0.3 + math.pi]), square).item() == pytest.approx(0.0, abs=1e-9)
    assert angle_loss(torch.tensor([0.3 + math.pi / 4]), square).item() == pytest.approx(1.0)
    long = torch.tensor([[0.0, 0.0, 4.0 * math.e ** 3, 4.0, 0.3]])  # log(w / h) = 3: weight 1/e
    assert angle_loss(torch.tensor([0.3 + math.pi / 4]), long).item() == pytest.approx(math.exp(-1))


def fake_head(nc: int, reg_max: int) -> SimpleNamespace:
    return SimpleNamespace(head=SimpleNamespace(nc=nc, reg_max=reg_max, stride=torch.tensor([8.0, 16.0, 32.0])))


def exact_predictions(targets: torch.Tensor, size: int, nc: int, score: float) -> dict:
    """Train-mode predictions of a reg_max-1 head whose every cell inside the (one) target box predicts it exactly,
    with class logit ``score`` there and -score elsewhere."""
    sizes = [(size // s, size // s) for s in (8, 16, 32)]
    points, strides = make_anchors(sizes, [8.0, 16.0, 32.0])
    box = torch.cat((targets[0, 2:6] * size, targets[0, 6:7]))
    grid_box = torch.cat((box[:2].expand(len(points), 2) / strides, box[2:4].expand(len(points), 2) / strides,
                          box[4:].expand(len(points), 1)), 1)
    sides = rbox2dist(points, grid_box)  # (n, 4) grid units
    inside = (sides > 0).all(1)
    scores = torch.full((1, nc, len(points)), -score)
    scores[0, int(targets[0, 1]), inside] = score
    return {"boxes": sides.t().unsqueeze(0), "scores": scores, "angles": box[4].expand(1, 1, len(points)).clone(),
            "anchor_points": points, "stride_tensor": strides, "feature_sizes": sizes}


def test_a_prediction_equal_to_its_target_costs_almost_nothing() -> None:
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.6, 0.2, 0.5]])  # 76.8 x 25.6 px at 128, turned 0.5 rad
    loss = AnchorFreeObbLoss(fake_head(2, 1), HYP)
    assert loss.names == ("box", "cls", "l1", "angle")
    exact = exact_predictions(targets, 128, 2, 8.0)
    terms = loss.terms(exact, targets)
    assert terms[0] < 0.01 and terms[2] < 1e-5 and terms[3] < 1e-9, terms
    off = exact_predictions(targets, 128, 2, 8.0)
    off["angles"] = off["angles"] + 0.4
    off["boxes"] = off["boxes"] * 1.3
    worse = loss.terms(off, targets)
    assert worse[0] > 10 * terms[0] and worse[2] > 1e-3 and worse[3] > 0.05
    tiny = torch.tensor([[0, 1, 0.5, 0.5, 0.6, 0.01, 0.5]])  # 1.3 px high: left out, only background remains
    assert loss.terms(exact_predictions(targets, 128, 2, 8.0), tiny)[[0, 2, 3]].abs().sum() == 0


@pytest.mark.parametrize("cfg, loss_class", [("yolo11n-obb.yaml", AnchorFreeObbLoss),
                                             ("yolo26n-obb.yaml", EndToEndObbLoss)])
def test_both_families_train_an_obb_model(cfg: str, loss_class: type) -> None:
    torch.manual_seed(0)
    model = Model(cfg, nc=2)
    loss_fn = loss_class(model, HYP)
    assert loss_fn.names[-1] == "angle" and len(loss_fn.names) == 4
    if hasattr(loss_fn, "set_epoch"):
        loss_fn.set_epoch(0, 10)
    images = torch.rand(2, 3, 64, 64)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.5, 0.25, 0.3], [1, 1, 0.3, 0.6, 0.3, 0.4, 1.2],
                            [1, 0, 0.7, 0.3, 0.2, 0.2, 0.0]])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    totals = []
    for _ in range(4):
        total, items = loss_fn(model(images), targets[:, :6], targets[:, 2:])
        assert items.shape == (4,) and torch.isfinite(items).all() and not items.requires_grad
        optimizer.zero_grad()
        total.backward()
        totals.append(total.item())
        optimizer.step()
    angle_branch = model.head.one2one_cv4 if cfg.startswith("yolo26") else model.head.cv4
    assert angle_branch[0][2].weight.grad.abs().sum() > 0  # the angle branch learns
    assert totals[-1] < totals[0], totals
