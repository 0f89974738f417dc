"""The epoch loop's helpers: the model validation runs on."""

from __future__ import annotations

import torch

from models.common import Conv
from models.yolo import Model
from utils.training.loop import validation_model
from utils.training.optim import ModelEMA


def test_validation_runs_a_fused_copy_of_the_ema_with_the_same_outputs(tiny_cfg: dict) -> None:
    torch.manual_seed(0)
    model = Model(tiny_cfg, nc=3)
    ema = ModelEMA(model)
    for m in ema.ema.modules():  # BatchNorm statistics that are not the identity, so that folding them matters
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    fused = validation_model(ema.ema)
    assert fused is not ema.ema
    convs = [m for m in fused.modules() if isinstance(m, Conv)]
    assert convs and all(isinstance(m.bn, torch.nn.Identity) for m in convs)
    assert all(isinstance(m.bn, torch.nn.BatchNorm2d) for m in ema.ema.modules() if isinstance(m, Conv))  # untouched
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        expected, got = ema.ema.eval()(x)[0], fused.eval()(x)[0]
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_model_without_fuse_is_validated_as_it_is() -> None:
    plain = torch.nn.Linear(2, 2)
    assert validation_model(plain) is plain
