"""Mixed precision for training: float16 autocast on CUDA, bfloat16 on the CPU, decided once (rank 0 probes that
autocast output matches float32's, and whether it is fast here) and broadcast."""

from __future__ import annotations

import torch
import torch.nn as nn

import utils.distributed.comm as dist
from utils.device import autocast, mixed_precision_is_fast
from utils.log import LOGGER


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
    return bool(torch.allclose(reference.float(), low.float(), atol=tolerance, rtol=tolerance))
