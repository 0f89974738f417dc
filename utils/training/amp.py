"""Mixed precision for training: float16 autocast on CUDA, bfloat16 on the CPU, decided once (rank 0 probes that
autocast output matches float32's, and whether it is fast here) and broadcast."""

from __future__ import annotations

import time

import torch
import torch.nn as nn

import utils.device as device_info
import utils.distributed.comm as dist
from utils.device import autocast
from utils.log import LOGGER

MIN_BF16_GAIN = 1.1  # a bfloat16 probe step must be this many times faster than float32's for --amp auto


def decide_amp(model: nn.Module, device: torch.device, mode: str = "auto") -> bool:
    """Mixed precision (float16 on CUDA, bfloat16 on the CPU) as ``--amp`` asks: off never; on when autocast output
    matches float32's; auto also needs it to be faster here. Decided on rank 0, broadcast. All ranks must call it."""
    def decide() -> tuple[bool, str]:
        if mode == "off":
            return False, "off (--amp off)"
        fast, why = mixed_precision_is_fast(device)
        if mode == "auto" and not fast:
            return False, f"off (--amp auto: {why}; --amp on forces it)"
        if not autocast_matches(model, device):
            return False, "off (autocast output differs from float32's)"
        return True, f"{'float16' if device.type == 'cuda' else 'bfloat16'} autocast ({why})"

    usable, text = dist.main_decides(decide)
    LOGGER.info(f"AMP: {text}")
    return usable


def mixed_precision_is_fast(device: torch.device) -> tuple[bool, str]:
    """Whether autocast should beat float32 on ``device``, and why. CUDA float16: yes. A CPU with AMX (amx_bf16):
    yes. AVX-512 BF16 without AMX: a short bf16-vs-fp32 step decides (on AMD EPYC it measured 1.7x, but the gain
    depends on the cores). Neither: no (bf16 convolutions measured 0.07-0.14x float32; docs/performance.md)."""
    if device.type == "cuda":
        return True, "CUDA float16"
    flags = device_info.cpu_flags()
    if "amx_bf16" in flags or (not flags and _torch_sees_amx()):
        return True, "CPU with AMX"
    if "avx512_bf16" in flags:
        gain = bf16_step_gain()
        verdict = "faster" if gain >= MIN_BF16_GAIN else f"not {MIN_BF16_GAIN}x faster"
        return gain >= MIN_BF16_GAIN, f"AVX-512 BF16 without AMX: a probe step ran {gain:.2f}x float32's speed, " \
                                      f"{verdict}"
    return False, "this CPU has neither AMX nor AVX-512 BF16, and bfloat16 there measured slower than float32"


def _torch_sees_amx() -> bool:
    """torch's own AMX check, for systems without /proc/cpuinfo."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False


def bf16_step_gain(repeats: int = 3) -> float:
    """float32 time / bfloat16-autocast time of a small convolution training step (forward and backward, batch 4,
    32 channels, 64 px), best of ``repeats`` each, timed in turns on this process's CPU clock (~0.5 s)."""
    gen = torch.Generator().manual_seed(0)
    layers = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.SiLU(), nn.Conv2d(64, 32, 3, padding=1), nn.SiLU())
    image = torch.rand(4, 32, 64, 64, generator=gen)

    def step(enabled: bool) -> float:
        start = time.process_time()
        with autocast(torch.device("cpu"), enabled):
            loss = layers(image).float().square().mean()
        loss.backward()
        return time.process_time() - start

    for enabled in (False, True):  # warm-up: oneDNN builds its kernels on first use
        step(enabled)
    fp32, bf16 = [], []
    for _ in range(repeats):
        fp32.append(step(False))
        bf16.append(step(True))
    return min(fp32) / max(min(bf16), 1e-9)


def autocast_matches(model: nn.Module, device: torch.device, tolerance: float = 0.1) -> bool:
    """Whether ``model``'s eval output under autocast is within ``tolerance`` (absolute and relative) of its float32
    output, on a fixed random image (its own generator: the global RNG streams stay as they were)."""
    image = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            reference = model(image)
            with autocast(device, enabled=True):
                low = model(image)
    finally:
        model.train(was_training)
    pairs = zip(reference, low) if isinstance(reference, tuple) else [(reference, low)]  # a segmenter: + prototypes
    return all(bool(torch.allclose(a.float(), b.float(), atol=tolerance, rtol=tolerance)) for a, b in pairs)
