"""The pose losses: the OKS term, the visibility term and the residual log-likelihood by hand, a perfect keypoint
prediction, gradients that reach every parameter (with and without objects, as DDP needs), the YOLO26 schedule,
and tiny YOLO11-pose and YOLO26-pose models that fit one synthetic batch."""

from __future__ import annotations

import math
import types

import pytest
import torch
from torch import nn

from models.yolo import Model, load_model_config
from tests.utils.training.test_loss_anchor_free import HYP, perfect_predictions
from utils.tasks.pose.head import RealNVP
from utils.tasks.pose.labels import COCO_SIGMAS
from utils.tasks.pose.loss import (
    AnchorFreePoseLoss,
    EndToEndPoseLoss,
    oks_keypoint_loss,
    residual_log_likelihood,
)

POSE_HYP = {**HYP, "pose": 12.0, "kobj": 1.0}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fake_pose_model(kpt_shape: tuple[int, int] = (2, 3), scale: float = 2.0, shift: float = -0.5,
                    flow: nn.Module | None = None) -> nn.Module:
    """What the pose loss reads of a model: its head's classes, bins, strides, keypoint shape and decode."""
    model = nn.Module()
    model.head = types.SimpleNamespace(nc=2, reg_max=16, stride=torch.tensor([8.0]), kpt_shape=list(kpt_shape),
                                       KEYPOINT_SCALE=scale, KEYPOINT_SHIFT=shift)
    if flow is not None:
        model.head.flow_model = flow
    return model


def with_keypoints(preds: dict, target_px: torch.Tensor, scale: float, shift: float, logit: float = 5.0) -> dict:
    """``preds`` whose every cell decodes its keypoints to ``target_px`` (K, 2) pixels exactly, visibility logit
    ``logit``: raw = (target / stride - centre - shift) / scale."""
    points = preds["anchor_points"]  # (16, 2)
    raw = (target_px.view(1, -1, 2) / 8.0 - points.view(-1, 1, 2) - shift) / scale  # (16, K, 2)
    values = torch.cat((raw, torch.full((*raw.shape[:2], 1), logit)), 2)  # (16, K, 3)
    return {**preds, "keypoints": values.reshape(16, -1).T.unsqueeze(0).contiguous()}


TARGETS = torch.tensor([[0.0, 1.0, 0.5, 0.5, 0.75, 0.75]])  # a 24 x 24 px box centred in a 32 px image
KEYPOINTS_PX = torch.tensor([[10.0, 12.0], [20.0, 22.0]])
LABELS = torch.tensor([[[10 / 32, 12 / 32, 2.0], [20 / 32, 22 / 32, 1.0]]])


@pytest.mark.parametrize("scale, shift", [(2.0, -0.5), (1.0, 0.0)])  # YOLOv8/YOLO11's decode and YOLO26's
def test_a_perfect_keypoint_prediction_has_no_pose_loss(scale: float, shift: float) -> None:
    loss = AnchorFreePoseLoss(fake_pose_model(scale=scale, shift=shift), POSE_HYP)
    preds = with_keypoints(perfect_predictions([0.5, 0.5, 3.5, 3.5], 16), KEYPOINTS_PX, scale, shift)
    total, items = loss(preds, TARGETS, LABELS)
    assert loss.names == ("box", "pose", "kobj", "cls", "dfl")
    assert items[1].item() == pytest.approx(0.0, abs=1e-6)
    bce = nn.functional.binary_cross_entropy_with_logits(torch.tensor(5.0), torch.tensor(1.0)).item()
    assert items[2].item() == pytest.approx(bce * 1.0, rel=1e-5)  # both keypoints labelled, logit 5
    assert total.item() == pytest.approx(items.sum().item())


def test_the_pose_term_by_hand() -> None:
    """Keypoint 0 predicted 4 px to the right on every positive cell (stride 8: 0.5 cell); keypoint 1 exact. The
    box is 3 x 3 cells, COCO-like sigmas 0.05 and 0.1: pose = 12 * mean over (object, keypoint) of
    (1 - exp(-d^2 / (2 (2 sigma)^2 area))) = 12 * (1 - exp(-0.25 / (8 * 0.0025 * 9))) / 2."""
    loss = AnchorFreePoseLoss(fake_pose_model(), POSE_HYP, sigmas=[0.05, 0.1])
    preds = with_keypoints(perfect_predictions([0.5, 0.5, 3.5, 3.5], 16), KEYPOINTS_PX + torch.tensor([[4.0, 0.0],
                                                                                                    [0.0, 0.0]]),
                           2.0, -0.5, logit=-2.0)
    _, items = loss(preds, TARGETS, LABELS)
    expected = 12.0 * (1 - math.exp(-0.25 / (8 * 0.05 ** 2 * 9))) / 2
    assert items[1].item() == pytest.approx(expected, rel=1e-5)
    bce = nn.functional.binary_cross_entropy_with_logits(torch.tensor(-2.0), torch.tensor(1.0)).item()
    assert items[2].item() == pytest.approx(bce, rel=1e-5)


def test_unlabelled_keypoints_count_for_visibility_only() -> None:
    """An unlabelled keypoint (v 0) adds no pose term, doubles the other's weight (K / labelled), and its visibility
    target is 0."""
    pred = torch.tensor([[[1.0, 0.0], [7.0, 7.0]]])
    target = torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])
    labelled = torch.tensor([[True, False]])
    sigmas = torch.tensor([0.5, 0.5])
    value = oks_keypoint_loss(pred, target, labelled, torch.tensor([[1.0]]), sigmas).item()
    assert value == pytest.approx(2 * (1 - math.exp(-1 / (2 * 1.0 * 1.0))) / 2, rel=1e-6)
    loss = AnchorFreePoseLoss(fake_pose_model(), POSE_HYP)
    preds = with_keypoints(perfect_predictions([0.5, 0.5, 3.5, 3.5], 16), KEYPOINTS_PX, 2.0, -0.5, logit=0.0)
    hidden = LABELS.clone()
    hidden[0, 1] = 0.0
    _, items = loss(preds, TARGETS, hidden)
    assert items[1].item() == pytest.approx(0.0, abs=1e-6)
    assert items[2].item() == pytest.approx(math.log(2), rel=1e-5)  # BCE of logit 0 against 1 and against 0


def test_sigmas_default_to_coco_for_17_keypoints_and_one_over_k_otherwise() -> None:
    assert torch.allclose(AnchorFreePoseLoss(fake_pose_model((17, 3)), POSE_HYP).sigmas,
                          torch.tensor(COCO_SIGMAS, dtype=torch.float32))
    assert AnchorFreePoseLoss(fake_pose_model((4, 2)), POSE_HYP).sigmas.tolist() == [0.25] * 4
    loss = AnchorFreePoseLoss(fake_pose_model((2, 2)), {**HYP}, sigmas=[0.3, 0.4])
    assert loss.sigmas.tolist() == pytest.approx([0.3, 0.4]) and loss.pose_gains == {"pose": 12.0, "kobj": 1.0,
                                                                                       "rle": 1.0}


def test_residual_log_likelihood_by_hand() -> None:
    """An identity flow (all weights 0) is the standard normal: for one keypoint with error (0.5, -1) grid units and
    raw sigmas 0 (sigma 0.5) the term is sum over x, y of log s - log N(e / s) + log 2s + |e / s| with e / s =
    (1, -2), weighted 1.5."""
    flow = RealNVP()
    for module in flow.modules():
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)
    pred, target = torch.tensor([[[1.5, 1.0]]]), torch.tensor([[[1.0, 2.0]]])
    value = residual_log_likelihood(flow, pred, target, torch.zeros(1, 1, 2), torch.tensor([[True]]),
                                    torch.tensor([1.5]))
    log_normal = -0.5 * (1 + 4) - math.log(2 * math.pi)
    per_coordinate = [math.log(0.5) - log_normal + math.log(1.0) + abs(e) for e in (1.0, -2.0)]
    assert value.item() == pytest.approx(1.5 * sum(per_coordinate), rel=1e-5)
    nothing = residual_log_likelihood(flow, pred, target, torch.zeros(1, 1, 2), torch.tensor([[False]]),
                                      torch.tensor([1.0]))
    assert nothing.item() == 0.0


def tiny(name: str) -> Model:
    """The n scale of a pose family at a sixteenth of its width, 2 classes and 3 keypoints (x, y, v)."""
    cfg, _ = load_model_config(f"{name}.yaml")
    cfg["scales"]["n"][1] = 0.0625
    cfg["kpt_shape"] = [3, 3]
    torch.manual_seed(0)
    return Model(cfg, nc=2)


def synthetic_batch(n: int = 4, size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images with one or two bright squares, their boxes and three keypoints each: two corners (visible) and the
    centre (labelled as occluded) of each square, and in image 1 an unlabelled third keypoint."""
    generator = torch.Generator().manual_seed(1)
    images = torch.zeros(n, 3, size, size)
    rows, points = [], []
    for i in range(n):
        for cls in range(1 + i % 2):
            w = h = 0.25 + 0.1 * cls
            cx, cy = (0.3 + 0.4 * cls + 0.05 * float(torch.rand(1, generator=generator))), 0.5
            x1, y1 = int((cx - w / 2) * size), int((cy - h / 2) * size)
            images[i, cls, y1:y1 + int(h * size), x1:x1 + int(w * size)] = 0.9
            rows.append([i, cls, cx, cy, w, h])
            centre_v = 0.0 if i == 1 else 1.0
            points.append([[cx - w / 2, cy - h / 2, 2.0], [cx + w / 2, cy + h / 2, 2.0],
                           [cx * (centre_v > 0), cy * (centre_v > 0), centre_v]])
    return images, torch.tensor(rows), torch.tensor(points)


@pytest.mark.parametrize("name, loss_class, names", [
    ("yolo11n-pose", AnchorFreePoseLoss, ("box", "pose", "kobj", "cls", "dfl")),
    ("yolo26n-pose", EndToEndPoseLoss, ("box", "pose", "kobj", "cls", "l1", "rle"))])
def test_gradients_reach_every_parameter_with_and_without_objects(name: str, loss_class: type,
                                                                   names: tuple[str, ...]) -> None:
    """Every trained parameter gets a finite gradient, also from a batch without a single object (DDP's all-reduce
    waits for every gradient); YOLO26's flow and sigma branches included."""
    model = tiny(name).train()
    images, targets, keypoints = synthetic_batch(2)
    loss = loss_class(model, POSE_HYP)
    assert loss.names == names
    for rows, points in ((targets, keypoints), (torch.zeros(0, 6), torch.zeros(0, 3, 3))):
        model.zero_grad(set_to_none=True)
        total, items = loss(model(images), rows, keypoints=points)
        total.backward()
        assert items.shape == (len(names),) and torch.isfinite(items).all()
        missing = [k for k, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert missing == [] and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    assert items[1] == 0 and items[2] == 0  # no objects: no keypoint terms


def test_the_yolo26_pose_loss_weighs_both_branch_sets() -> None:
    model = tiny("yolo26n-pose").train()
    images, targets, keypoints = synthetic_batch(2)
    loss = EndToEndPoseLoss(model, POSE_HYP)
    loss.set_epoch(3, 10)
    preds = model(images)
    total, items = loss(preds, targets, keypoints=keypoints)
    many = loss.one2many.terms(preds["one2many"], targets, keypoints)
    one = loss.one2one.terms(preds["one2one"], targets, keypoints)
    assert loss.one2one.assigner.topk2 == 1 and loss.one2many.assigner.topk == 10
    assert torch.allclose(items, one.detach())
    assert total.item() == pytest.approx(((many.sum() * loss.o2m + one.sum() * loss.o2o) * 2).item(), rel=1e-5)
    assert items[5] > 0  # the residual log-likelihood of the labelled keypoints


def test_a_tiny_yolo26_pose_model_fits_one_batch() -> None:
    """25 Adam steps on one batch of 4 images (both branch sets, the flow too): the total of the non-negative terms
    ends under 0.6 of its early peak and the pose term falls (the anchor-free pose loss shares its terms)."""
    name = "yolo26n-pose"
    model = tiny(name).train()
    images, targets, keypoints = synthetic_batch()
    loss = EndToEndPoseLoss(model, POSE_HYP)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    history = []
    for _ in range(25):
        total, items = loss(model(images), targets, keypoints=keypoints)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        history.append(items)
    steps = torch.stack(history)
    early, last = steps[:8].max(0).values, steps[-3:].mean(0)
    print(f"{name}: early peak {dict(zip(loss.names, early.tolist()))} -> {dict(zip(loss.names, last.tolist()))}")
    positive = steps[:, :-1].sum(1)  # rle (last) is a log-likelihood, clamped at 0
    assert positive[-3:].mean() < 0.6 * positive[:8].max(), (early, last)
    assert last[1] < early[1] and math.isfinite(last.sum().item())


def test_keypoints_follow_their_targets_into_the_padding() -> None:
    loss = AnchorFreePoseLoss(fake_pose_model((1, 3)), POSE_HYP)
    targets = torch.tensor([[1.0, 0, 0.5, 0.5, 0.2, 0.2], [0.0, 0, 0.5, 0.5, 0.2, 0.2], [1.0, 1, 0.2, 0.2, 0.1, 0.1]])
    keypoints = torch.tensor([[[0.5, 0.25, 2.0]], [[0.1, 0.2, 1.0]], [[0.25, 1.0, 0.0]]])
    padded = loss.keypoints_by_image(keypoints, targets, 2, [32.0, 64.0])  # 32 high, 64 wide
    assert padded.shape == (2, 2, 1, 3)
    assert padded[0, 0, 0].tolist() == pytest.approx([6.4, 6.4, 1.0]) and padded[1, 0, 0].tolist() == [32.0, 8.0, 2.0]
    assert padded[1, 1, 0].tolist() == [16.0, 32.0, 0.0] and padded[0, 1].abs().sum() == 0
