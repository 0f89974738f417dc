"""A loss's normalisers shared by the ranks, so that one DDP step trains exactly as one process would on the
concatenated batch (the algebra is in utils/training/families.py, the LossFn protocol).

A loss divides by counts that depend on the batch: matched targets, positives, the sum of target scores. Under DDP
each rank sees its own share of the batch, and a rank that divides by its own count weighs its items differently
from one process dividing by the whole batch's. ``LossShare`` all-reduces a loss call's counts once and gives each
rank the divisor ``global count / world size``: the ranks' normalised terms then average to the whole batch's term,
and DDP's averaged gradient equals one process's. For one process nothing is reduced and every value is the one the
loss computed before (the same floating-point operations).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from utils.distributed import comm


class LossShare:
    """The divisors of one loss call. ``counts`` are this rank's (target counts, sums of target scores, element
    counts of a mean), one tensor or number each; building it runs one all-reduce, so every rank must build it at the
    same point of every call, whatever its counts (a rank with no targets too), or the job deadlocks."""

    def __init__(self, counts: Sequence[torch.Tensor | float]) -> None:
        device = next((c.device for c in counts if isinstance(c, torch.Tensor)), torch.device("cpu"))
        self.local = torch.stack([torch.as_tensor(c, dtype=torch.float32, device=device).detach().reshape(())
                                  for c in counts])
        self.world = comm.get_world_size()
        self.total: torch.Tensor | None = None  # the counts summed over the ranks (None for one process)
        if self.world > 1:
            summed = comm.all_reduce_sum(self.local.to(comm.collective_device(), copy=True))  # in place: a copy
            self.total = summed.to(device)

    @property
    def shared(self) -> bool:
        """Whether the counts were reduced over several ranks."""
        return self.total is not None

    def divisor(self, index: int, floor: float | None = None) -> torch.Tensor:
        """What a sum over this rank's items divides by: count ``index`` summed over the ranks (at least ``floor``,
        applied to the sum as one process applies it to its count) over the world size; one process: its count."""
        count = self.local[index] if self.total is None else self.total[index]
        if floor is not None:
            count = count.clamp(min=floor)
        return count if self.total is None else count / self.world

    def mean(self, local_mean: torch.Tensor, index: int) -> torch.Tensor:
        """A mean over this rank's count ``index`` of items as its share of the mean over every rank's items:
        ``local_mean * count / divisor`` (0 where the rank has none); one process: ``local_mean`` itself."""
        if self.total is None:
            return local_mean
        return local_mean * self.local[index] / self.divisor(index).clamp(min=torch.finfo(torch.float32).tiny)
