"""utils/training/optim.py: parameter groups, decay scaling, schedules with warmup, accumulation, clipping, EMA."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from utils.training.optim import (
    BatchScaling,
    LRSchedule,
    ModelEMA,
    WeightUpdater,
    accumulate_steps,
    batch_scaling,
    build_optimizer,
    freeze_layers,
    lr_lambda,
    parameter_groups,
    scaled_weight_decay,
)

HYP = {"lr0": 0.01, "lrf": 0.1, "momentum": 0.937, "weight_decay": 5e-4, "warmup_epochs": 1.0,
       "warmup_momentum": 0.8, "warmup_bias_lr": 0.1}


def small_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))


def test_parameter_groups_split_decay_norm_and_bias():
    decayed, norm, biases = parameter_groups(small_net())
    assert [p.shape for p in decayed] == [torch.Size((4, 3, 3, 3)), torch.Size((2, 4, 1, 1))]
    assert [p.shape for p in norm] == [torch.Size((4,))]  # BN weight
    assert sorted(p.shape[0] for p in biases) == [2, 4]  # conv bias and BN bias


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_build_optimizer_decays_only_weights(name):
    opt = build_optimizer(small_net(), name, lr=0.01, momentum=0.9, weight_decay=1e-3)
    decays = {g["group"]: g["weight_decay"] for g in opt.param_groups}
    assert decays == {"bias": 0.0, "weight": 1e-3, "norm": 0.0}
    if name == "SGD":
        assert opt.defaults["nesterov"] and opt.defaults["momentum"] == 0.9
    else:
        assert opt.defaults["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError):
        build_optimizer(small_net(), "RMSprop")


def test_accumulation_keeps_the_nominal_batch_of_64():
    assert [accumulate_steps(b) for b in (1, 6, 16, 32, 64, 128)] == [64, 11, 4, 2, 1, 1]
    assert scaled_weight_decay(5e-4, 16, 4) == pytest.approx(5e-4)
    assert scaled_weight_decay(5e-4, 128, 1) == pytest.approx(1e-3)


def test_linear_and_cosine_schedules():
    linear, cosine = lr_lambda(10, 0.1), lr_lambda(10, 0.1, cosine=True)
    assert linear(0) == pytest.approx(1.0) and linear(10) == pytest.approx(0.1) and linear(5) == pytest.approx(0.55)
    assert cosine(0) == pytest.approx(1.0) and cosine(10) == pytest.approx(0.1) and cosine(5) == pytest.approx(0.55)
    assert cosine(2) == pytest.approx(0.914058, abs=1e-6)  # (1 - cos(0.2 pi)) / 2 * (0.1 - 1) + 1, by hand


def test_warmup_interpolates_lr_momentum_and_accumulation():
    opt = build_optimizer(small_net(), "SGD", lr=HYP["lr0"], momentum=HYP["momentum"])
    schedule = LRSchedule(HYP, epochs=100, batches_per_epoch=200, accumulate=4)
    assert schedule.warmup_iters == 200
    schedule.apply(opt, epoch=0, iteration=0)
    lrs = {g["group"]: g["lr"] for g in opt.param_groups}
    assert lrs == {"bias": pytest.approx(0.1), "weight": 0.0, "norm": 0.0}
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.8)
    schedule.apply(opt, epoch=0, iteration=100)  # half way
    assert opt.param_groups[1]["lr"] == pytest.approx(0.005) and opt.param_groups[0]["lr"] == pytest.approx(0.055)
    assert opt.param_groups[1]["momentum"] == pytest.approx((0.8 + 0.937) / 2)
    schedule.apply(opt, epoch=50, iteration=10000)
    assert all(g["lr"] == pytest.approx(0.01 * (0.5 * 0.9 + 0.1)) for g in opt.param_groups)
    assert [schedule.accumulate_at(i) for i in (0, 100, 199, 200, 5000)] == [1, 2, 4, 4, 4]


def test_warmup_is_at_least_100_iterations_but_at_most_half_the_run():
    assert LRSchedule(HYP, epochs=100, batches_per_epoch=10).warmup_iters == 100
    assert LRSchedule(HYP, epochs=4, batches_per_epoch=10).warmup_iters == 20
    assert LRSchedule({**HYP, "warmup_epochs": 0}, epochs=4, batches_per_epoch=10).warmup_iters == 0


def test_ema_decay_ramp_and_update():
    model = nn.Linear(2, 1)
    ema = ModelEMA(model, decay=0.9999, tau=2000)
    before = ema.ema.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    d = 4.99825e-4  # 0.9999 * (1 - exp(-1 / 2000)), by hand: the first update barely trusts the EMA
    assert ema.updates == 1 and ema.current_decay() == pytest.approx(d, rel=1e-5)
    assert torch.allclose(ema.ema.weight, d * before + (1 - d) * model.weight.detach())
    assert not any(p.requires_grad for p in ema.ema.parameters())
    restored = ModelEMA(nn.Linear(2, 1))
    restored.load_state_dict(ema.state_dict())
    assert restored.updates == 1 and torch.equal(restored.ema.weight, ema.ema.weight)


def test_ema_shares_its_batchnorm_statistics_not_its_weights():
    ema = ModelEMA(nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2)))
    sent: list[torch.Tensor] = []
    ema.share_buffers(lambda t: sent.append(t) or t.fill_(7.0))  # stands in for rank 0's values arriving
    bn = ema.ema[1]
    assert [t.data_ptr() for t in sent] == [bn.running_mean.data_ptr(), bn.running_var.data_ptr()]  # in place
    assert (bn.running_mean == 7).all() and (bn.running_var == 7).all() and bn.num_batches_tracked == 0
    assert not (ema.ema[0].weight == 7).any()


def _updater(model: nn.Module, accumulate: int, lr: float = 0.1) -> WeightUpdater:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for g in opt.param_groups:
        g["initial_lr"] = lr
    schedule = LRSchedule({**HYP, "warmup_epochs": 0, "lrf": 1.0}, epochs=10, batches_per_epoch=10,
                          accumulate=accumulate)
    return WeightUpdater(model, opt, schedule, ema=ModelEMA(model))


def test_updater_accumulates_then_steps_and_resumes():
    model = nn.Linear(2, 1, bias=False)
    updater = _updater(model, accumulate=2)
    stepped, will, pending = [], [], []
    for _ in range(5):
        updater.begin_batch(epoch=0)
        will.append(updater.will_step())
        stepped.append(updater.backward(model(torch.ones(1, 2)).sum()))
        pending.append(updater.pending)
    assert stepped == will == [False, True, False, True, False]  # a step after every 2 batches
    assert pending == [True, False, True, False, True]  # gradients wait in .grad between steps
    assert updater.steps == 2 and updater.ema.updates == 2 and updater.iteration == 5
    other = _updater(nn.Linear(2, 1, bias=False), accumulate=2)
    other.load_state_dict(updater.state_dict())
    assert (other.iteration, other.last_step, other.steps, other.ema.updates) == (5, 3, 2, 2)
    assert model.weight.grad is not None
    updater.forget_pending()  # a fresh accumulation: the next batch is its first
    assert not updater.pending and model.weight.grad is None and updater.will_step() is False


def test_gradients_are_clipped_to_norm_10():
    model = nn.Linear(4, 1, bias=False)
    start = model.weight.detach().clone()
    updater = _updater(model, accumulate=1, lr=1.0)
    updater.begin_batch(epoch=0)
    updater.backward(model(torch.full((1, 4), 1000.0)).sum())  # gradient norm 2000
    assert (model.weight.detach() - start).norm().item() == pytest.approx(10.0, rel=1e-4)


def test_freeze_a_count_or_a_list_of_layers() -> None:
    """--freeze N freezes layers 0..N-1 of a YAML model ("model.<i>." names); --freeze i j freezes those."""
    def model() -> nn.Module:
        wrapper = nn.Module()
        wrapper.model = nn.Sequential(*(nn.Conv2d(2, 2, 1) for _ in range(4)))
        return wrapper

    def frozen(m: nn.Module) -> list[str]:
        return [name for name, p in m.named_parameters() if not p.requires_grad]

    first_two, picked, none = model(), model(), model()
    freeze_layers(first_two, [2])
    freeze_layers(picked, [1, 3])
    freeze_layers(none, [0])
    assert frozen(first_two) == ["model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias"]
    assert frozen(picked) == ["model.1.weight", "model.1.bias", "model.3.weight", "model.3.bias"]
    assert frozen(none) == []


@pytest.mark.parametrize("optimizer, batch, enabled, k, factor", [
    ("SGD", 128, True, 2.0, 1.0), ("SGD", 512, True, 8.0, 1.0), ("AdamW", 256, True, 4.0, 2.0),
    ("Adam", 96, True, 1.5, 1.5 ** 0.5), ("SGD", 64, True, 1.0, 1.0), ("AdamW", 16, True, 1.0, 1.0),
    ("AdamW", 512, False, 1.0, 1.0)])
def test_the_large_batch_rule(optimizer: str, batch: int, enabled: bool, k: float, factor: float) -> None:
    rule = batch_scaling(optimizer, batch, enabled)
    assert rule.k == pytest.approx(k) and rule.lr_factor == pytest.approx(factor)
    assert (rule.text(batch, optimizer) == "") == (k == 1.0)


def test_the_warmup_keeps_its_length_in_images_at_a_large_batch():
    hyp = {**HYP, "warmup_epochs": 3.0}
    assert LRSchedule(hyp, 100, 4).warmup_iters == 100  # 3 epochs are 12 batches: the minimum, 100 batches
    assert LRSchedule(hyp, 100, 4, batch_scale=2.0).warmup_iters == 12  # 3 epochs, no minimum above batch 64
    assert LRSchedule(hyp, 100, 40, batch_scale=8.0).warmup_iters == 120
    assert LRSchedule(hyp, 2, 4, batch_scale=2.0).warmup_iters == 4  # at most half the run, as at any batch


def test_the_updater_scales_lr0_warmup_and_ema_by_the_rule_unless_turned_off(tiny_cfg: dict) -> None:
    from models.yolo import Model
    from utils.training.builder import build_updater
    from utils.training.config import RunConfig
    from utils.training.optim import OptimizerChoice

    model = Model(tiny_cfg)
    runs = [("AdamW", 16, True, 0.01, 100, 2000), ("AdamW", 256, True, 0.02, 10, 500),  # lr0 x sqrt(4) for AdamW
            ("AdamW", 256, False, 0.01, 100, 2000), ("SGD", 256, True, 0.01, 10, 500)]  # SGD's loss scales already
    for name, batch, rule, lr0, warmup, tau in runs:
        choice = OptimizerChoice(name, {**HYP, "lr0": 0.01})
        config = RunConfig(batch_size=batch, epochs=300, batch_scaling=rule)
        updater = build_updater(model, config, choice, 10, ModelEMA(model), scaler=False)
        assert updater.optimizer.param_groups[0]["initial_lr"] == pytest.approx(lr0)
        assert updater.schedule.warmup_iters == warmup
        assert updater.ema.tau == tau and updater.ema.decay == pytest.approx(0.9999 ** (2000 / tau))
        assert choice.hyp["lr0"] == 0.01  # the hyp keeps the file's lr0 (a resumed run scales it once)
    assert BatchScaling().text(16, "SGD") == ""
