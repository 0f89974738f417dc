"""utils.training.amp: the mixed-precision decision - the closeness probe accepts or refuses, auto follows the device,
rank 0 decides for every rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import utils.device
from tests.helpers import free_port, gloo_rank
from utils.training import amp

CPU = torch.device("cpu")


class Cancelling(torch.nn.Module):
    """Output a @ b: 256 - 255.5 = 0.5 in float32, but 0 in bfloat16 (255.5 rounds to 256): autocast must be
    refused. With ``exact`` the operands are small integers, the same in both precisions."""

    def __init__(self, exact: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([[2.0, 3.0]] if exact else [[256.0, -255.5]]))
        self.b = torch.nn.Parameter(torch.ones(2, 1))
        self.calls = 0

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.mm(self.a, self.b) + 0 * image.mean()


class Untouchable(torch.nn.Module):
    """A model that must not be run (the probe happens on rank 0 only)."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the probe ran on a rank other than 0")


def test_probe_accepts_close_output_and_refuses_a_cancellation() -> None:
    exact, cancelling = Cancelling(exact=True), Cancelling()
    assert amp.autocast_matches(exact, CPU) is True
    assert amp.autocast_matches(cancelling, CPU) is False
    assert amp.decide_amp(exact, CPU, "on") is True
    assert amp.decide_amp(cancelling, CPU, "on") is False
    assert exact.training and cancelling.training  # the probe puts the model back in training mode


def test_a_real_model_passes_the_bfloat16_probe(tiny_cfg: dict) -> None:
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model(tiny_cfg)
    state = torch.get_rng_state()
    assert amp.autocast_matches(model, CPU) is True
    assert torch.equal(torch.get_rng_state(), state)  # the probe's image does not use the global stream


SAPPHIRE_RAPIDS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
EPYC_GENOA = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2_ONLY = frozenset({"avx2", "fma"})


def test_auto_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch, yolo_log: list[str]) -> None:
    model = Cancelling(exact=True)
    probes: list[int] = []
    monkeypatch.setattr(amp, "bf16_step_gain", lambda: probes.append(1) or 1.0)
    monkeypatch.setattr(utils.device, "cpu_flags", lambda: AVX2_ONLY)
    assert amp.decide_amp(model, CPU, "auto") is False and model.calls == 0  # not even probed
    assert "neither AMX nor AVX-512 BF16" in yolo_log[-1] and not probes
    monkeypatch.setattr(utils.device, "cpu_flags", lambda: SAPPHIRE_RAPIDS)
    assert amp.decide_amp(model, CPU, "auto") is True and model.calls == 2  # fp32 and bf16 forwards
    assert yolo_log[-1] == "AMP: bfloat16 autocast (CPU with AMX)" and not probes  # AMX: no timing needed
    assert amp.decide_amp(model, CPU, "off") is False and model.calls == 2
    assert amp.mixed_precision_is_fast(torch.device("cuda", 0))[0] is True


@pytest.mark.parametrize(("gain", "expected"), [(1.67, True), (1.05, False), (0.3, False)])
def test_avx512_bf16_without_amx_is_decided_by_the_measured_step(monkeypatch: pytest.MonkeyPatch, gain: float,
                                                                  expected: bool, yolo_log: list[str]) -> None:
    monkeypatch.setattr(utils.device, "cpu_flags", lambda: EPYC_GENOA)
    monkeypatch.setattr(amp, "bf16_step_gain", lambda: gain)
    assert amp.decide_amp(Cancelling(exact=True), CPU, "auto") is expected
    assert f"a probe step ran {gain:.2f}x float32's speed" in yolo_log[-1]


def test_the_step_probe_and_the_flags_are_real() -> None:
    gain = amp.bf16_step_gain(repeats=1)
    assert 0.01 < gain < 100  # a ratio of two measured times, whatever this CPU does
    flags = utils.device.cpu_flags()
    assert isinstance(flags, frozenset)
    if Path("/proc/cpuinfo").is_file():
        assert "fpu" in flags or "fp" in flags or "asimd" in flags  # x86 or arm: the flags line was found


def _rank_decides(rank: int, port: int, out_dir: str) -> None:
    with gloo_rank(rank, port):
        accepted = Cancelling(exact=True) if rank == 0 else Untouchable()
        refused = Cancelling() if rank == 0 else Untouchable()
        result = {"on": amp.decide_amp(accepted, CPU, "on"), "refused": amp.decide_amp(refused, CPU, "on")}
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.ddp
def test_rank0_decides_amp_for_every_rank(tmp_path: Path) -> None:
    mp.start_processes(_rank_decides, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1] == {"on": True, "refused": False}
