"""The images a process decoded last, kept for the mosaics that follow: a mosaic's three partner images are drawn
from them, so building a mosaic usually decodes one JPEG (its own image) instead of four.

Each process (a DataLoader worker) keeps its own buffer, bounded by a count and by bytes; the oldest image leaves
first. Partners are drawn uniformly from the images held once the buffer holds a quarter of its count, and from the
whole data set before that (those are decoded and kept too), with the sample's own random stream: the same seed,
sampler order and worker count give the same mosaics.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

RECENT_IMAGES = 128  # images a process keeps (ultralytics keeps 8 batches' worth: 128 at its default batch of 16)
RECENT_BYTES = 256 << 20  # and at most this many bytes of pixels (128 images of 640 x 480 take 118 MB)


class RecentImages:
    """A bounded first-in first-out buffer of decoded images by data set index, each with the (h, w) it takes on a
    mosaic's canvas; the images are read-only."""

    def __init__(self, capacity: int = RECENT_IMAGES, max_bytes: int = RECENT_BYTES) -> None:
        if capacity < 1 or max_bytes < 1:
            raise ValueError(f"a buffer of recent images needs room: capacity {capacity}, max_bytes {max_bytes}")
        self.capacity, self.max_bytes = capacity, max_bytes
        self.nbytes = 0
        self._images: OrderedDict[int, tuple[np.ndarray, tuple[int, int]]] = OrderedDict()
        self._keys: list[int] | None = []  # the held indices in order, rebuilt after a change

    def __len__(self) -> int:
        return len(self._images)

    def get(self, index: int) -> tuple[np.ndarray, tuple[int, int]] | None:
        """Image ``index`` and its canvas size when held, else None."""
        return self._images.get(index)

    def put(self, index: int, image: np.ndarray, canvas_hw: tuple[int, int]) -> None:
        """Keep ``image`` (made read-only) as ``index``; the oldest leave while over the count or the bytes. An
        image larger than all the bytes is not kept."""
        if index in self._images or image.nbytes > self.max_bytes:
            return
        image.flags.writeable = False
        self._images[index] = (image, (int(canvas_hw[0]), int(canvas_hw[1])))
        self.nbytes += image.nbytes
        while len(self._images) > self.capacity or self.nbytes > self.max_bytes:
            self.nbytes -= self._images.popitem(last=False)[1][0].nbytes
        self._keys = None

    def partners(self, rng: np.random.Generator, k: int, n: int) -> list[int]:
        """``k`` indices of a data set of ``n`` images for a mosaic's other tiles: uniform over the images held once
        a quarter of the capacity is held, else uniform over the data set."""
        if len(self._images) < max(1, min(self.capacity, n) // 4):
            return rng.integers(0, n, k).tolist()
        if self._keys is None:
            self._keys = list(self._images)
        return [self._keys[j] for j in rng.integers(0, len(self._keys), k).tolist()]
