"""``--batch-size -1`` (AutoBatch): the total batch from what every rank's GPU holds.

Each rank measures its own device: the peak memory of a training step (forward and backward of a copy of the model,
float32) at a few batch sizes, a line fitted through them, and the largest batch whose step fits MEMORY_FRACTION of
the memory free before measuring. The ranks then agree on the smallest, so every rank gets the same share, and the
total (that share times the world size) is what ``--batch-size`` would have been. On the CPU it refuses in one line:
there is no device memory to measure, and the machine's RAM says nothing about a good batch.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from utils.distributed import comm as dist
from utils.errors import UserError
from utils.log import LOGGER

AUTO_BATCH = -1  # --batch-size -1
MEMORY_FRACTION = 0.8  # of the memory free before measuring
PROBE_BATCHES = (1, 2, 4, 8, 16)
MAX_BATCH_PER_RANK = 1024


class AutoBatchError(UserError):
    """AutoBatch cannot run here (the CPU)."""


def agreed_total(per_rank: list[int]) -> tuple[int, int]:
    """Every rank's measured batch -> (the batch each rank trains with: the smallest, the total over ranks)."""
    share = max(min(per_rank), 1)
    return share, share * len(per_rank)


def _tensors(outputs: object) -> list[torch.Tensor]:
    """The tensors of a head's training output (a tensor, or lists, tuples and dicts of them)."""
    if torch.is_tensor(outputs):
        return [outputs]
    items = outputs.values() if isinstance(outputs, dict) else outputs if isinstance(outputs, list | tuple) else []
    return [t for item in items for t in _tensors(item)]


def _step_peak(model: nn.Module, device: torch.device, batch: int, img_size: int) -> int:
    """Peak bytes allocated on ``device`` by one forward and backward of ``model`` on ``batch`` images."""
    torch.cuda.reset_peak_memory_stats(device)
    images = torch.zeros(batch, 3, img_size, img_size, device=device)
    sum(out.float().mean() for out in _tensors(model(images))).backward()
    model.zero_grad(set_to_none=True)
    return torch.cuda.max_memory_allocated(device)


def fitting_batch(model: nn.Module, device: torch.device, img_size: int, fraction: float = MEMORY_FRACTION) -> int:
    """The largest batch whose training step fits ``fraction`` of ``device``'s free memory (CUDA; the model itself
    is not changed: a copy is measured)."""
    free, _ = torch.cuda.mem_get_info(device)
    start = torch.cuda.memory_allocated(device)
    probe = copy.deepcopy(model).to(device).train()
    sizes, peaks = [], []
    try:
        for batch in PROBE_BATCHES:
            try:
                peaks.append(_step_peak(probe, device, batch, img_size))
                sizes.append(batch)
            except torch.cuda.OutOfMemoryError:
                break
    finally:
        del probe
        torch.cuda.empty_cache()
    if len(sizes) < 2:
        return 1
    slope, intercept = np.polyfit(sizes, peaks, 1)
    batch = int((start + free * fraction - intercept) / max(slope, 1.0))
    return int(min(max(batch, 1), MAX_BATCH_PER_RANK))


def auto_batch(model: nn.Module, device: torch.device, img_size: int) -> int:
    """The total batch for ``--batch-size -1``: each rank measures its GPU, the ranks agree on the smallest.
    AutoBatchError on the CPU. All ranks must call it."""
    if device.type != "cuda":
        raise AutoBatchError("--batch-size -1 (AutoBatch) measures GPU memory; on the CPU give the total batch, "
                             "e.g. --batch-size 16")
    measured = dist.all_gather_object(fitting_batch(model, device, img_size))
    share, total = agreed_total(measured)
    LOGGER.info(f"AutoBatch: {share} images per rank fit {MEMORY_FRACTION:.0%} of the free GPU memory of every rank "
                f"(measured {', '.join(map(str, measured))} at {img_size} px): total batch {total}")
    return total
