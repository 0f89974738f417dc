"""A batch's images, each decoded once for the batch: the batch's mosaics draw their three partner images from
them, so building a mosaic decodes one JPEG (its own image), not four.

The DataLoader hands a data set the keys of a whole batch (``YoloDataset.__getitems__``); the pool is the batch's
images, topped up to min(POOL_MIN, 4 x the batch) images drawn from the whole data set by a stream seeded from the
batch's first key, so a small batch draws from as many images as a batch of POOL_MIN and never decodes more than
the four images a mosaic took before. The pool depends on the seed, the epoch and the batch's positions alone: a
resumed run and any number of DataLoader workers build the same batches (the batch per process, which the world
size sets, decides which images share a pool). It holds one batch's decoded images at a time.

The hyperparameter ``mosaic_pool`` sets POOL_MIN's place (``mosaic_pool_size``): 0 draws every mosaic's partners
from the whole data set, each decoded for its mosaic (four decodes per mosaic, as before the pool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from utils.hyp import HypError

POOL_MIN = 16  # images a batch's mosaics draw their partners from, at least (where 4 x the batch allows)


def mosaic_pool_size(hyp: Mapping[str, Any]) -> int:
    """The hyp's ``mosaic_pool`` (default POOL_MIN): the images a batch's mosaics draw their partners from, at least;
    0: from the whole data set. A one-line HypError unless it is a whole number >= 0."""
    value = hyp.get("mosaic_pool", POOL_MIN)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != int(value):
        raise HypError(f"hyperparameter mosaic_pool must be a whole number >= 0 (0: partners from the whole data "
                       f"set), got {str(value)[:40]!r}")
    return int(value)


class BatchPool:
    """The data set indices a batch's mosaics draw partners from, and their decoded images (read-only) with the
    (h, w) each takes on a mosaic's canvas, kept until the batch is built."""

    def __init__(self, indices: Sequence[int], n: int, key: Sequence[int] | None = None, size: int = POOL_MIN) -> None:
        """``indices``: the batch's images of a data set of ``n``; ``key``: the first sample's seed key (seed,
        epoch, position), which seeds the top-up (drawn from a stream of its own: the samples' draws are kept) to
        min(``size``, 4 x the batch, ``n``) images."""
        self.indices = [int(i) for i in indices]
        extra = min(size, 4 * len(self.indices), n) - len(self.indices)
        if extra > 0:
            rng = np.random.default_rng([*(int(k) for k in key or ()), 0x9E3779B9])
            self.indices += rng.integers(0, n, extra).tolist()
        self._images: dict[int, tuple[np.ndarray, tuple[int, int]]] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def partners(self, rng: np.random.Generator, k: int = 3) -> list[int]:
        """``k`` indices drawn uniformly from the pool with the sample's own stream."""
        return [self.indices[j] for j in rng.integers(0, len(self.indices), k).tolist()]

    def get(self, index: int) -> tuple[np.ndarray, tuple[int, int]] | None:
        return self._images.get(index)

    def put(self, index: int, image: np.ndarray, canvas_hw: tuple[int, int]) -> None:
        """Keep image ``index`` (made read-only: every mosaic of the batch reads the same pixels)."""
        image.flags.writeable = False
        self._images[index] = (image, (int(canvas_hw[0]), int(canvas_hw[1])))
