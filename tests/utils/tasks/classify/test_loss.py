"""utils/tasks/classify/loss.py: the cross-entropy with label smoothing by hand, both target forms, one-line
refusals, and a classifier that learns from it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from models.yolo import Model
from utils.tasks.classify.loss import ClassifyLoss, ClassifyTargetError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def loss_for(nc: int, label_smoothing: float = 0.0) -> ClassifyLoss:
    return ClassifyLoss(SimpleNamespace(head=SimpleNamespace(nc=nc)), {}, label_smoothing=label_smoothing)


def test_cross_entropy_with_label_smoothing_by_hand() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    labels = torch.tensor([0, 2])
    log_probs = logits.log_softmax(1)
    plain = -(log_probs[0, 0] + log_probs[1, 2]) / 2
    total, items = loss_for(3)(logits, labels)
    assert total.item() == pytest.approx(plain.item()) and items.tolist() == pytest.approx([plain.item()])
    eps = 0.1  # 0.9 on the label plus 0.1 / 3 on every class
    smoothed = -(((1 - eps) * log_probs[0, 0] + eps / 3 * log_probs[0].sum())
                 + ((1 - eps) * log_probs[1, 2] + eps / 3 * log_probs[1].sum())) / 2
    assert loss_for(3, eps)(logits, labels)[0].item() == pytest.approx(smoothed.item())
    assert loss_for(3).names == ("cls",)
    uniform = torch.zeros(4, 5)
    assert loss_for(5)(uniform, torch.arange(4))[0].item() == pytest.approx(math.log(5))


def test_label_rows_in_any_image_order_and_refusals() -> None:
    logits = torch.randn(3, 4)
    labels = torch.tensor([3, 0, 2])
    rows = torch.tensor([[2, 2.0, 0.5], [0, 3.0, 0.1], [1, 0.0, 0.2]])  # [image, class, ...], shuffled
    assert torch.equal(loss_for(4)(logits, rows)[0], loss_for(4)(logits, labels)[0])
    with pytest.raises(ClassifyTargetError, match="one label row per image: 2 rows for 3 images"):
        loss_for(4)(logits, rows[:2])
    with pytest.raises(ClassifyTargetError, match="one class per image"):
        loss_for(4)(logits, labels[:2])
    with pytest.raises(ClassifyTargetError, match="must lie in 0..3, got 0..7"):
        loss_for(4)(logits, torch.tensor([7, 0, 1]))


def test_a_classifier_learns_two_classes() -> None:
    torch.manual_seed(0)
    model = Model("yolov8n-cls.yaml", nc=2)
    loss_fn = ClassifyLoss(model, {}, label_smoothing=0.1)
    images = torch.cat((torch.zeros(4, 3, 32, 32), torch.ones(4, 3, 32, 32)))  # dark: class 0, bright: class 1
    labels = torch.tensor([0] * 4 + [1] * 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    first = None
    for _ in range(6):
        total, _ = loss_fn(model(images), labels)
        first = first if first is not None else total.item()
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    assert total.item() < first
    with torch.no_grad():  # the batch's statistics, as in training (six steps leave BatchNorm's running ones behind)
        assert torch.equal(model(images).argmax(1), labels)
