"""``--cache ram``: one copy of the decoded images per machine, in shared memory, read by every local rank and
every DataLoader worker.

The local ranks of a machine decode the images together (each its share) into one file in /dev/shm; every rank
maps it, and as soon as all have, local rank 0 removes its name: the memory lives while any process maps it and
is freed with the last one, so nothing is left behind, even after a SIGKILL. A file left by a build that was
killed midway (its creator's pid is gone) is removed by the next build on the machine.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np

from utils.atomic_files import pid_alive
from utils.device import available_cores
from utils.distributed import comm as dist

PREFIX = "yolo-ram-"


def shm_dir() -> Path:
    """Where shared-memory files live: /dev/shm on Linux, the temp folder elsewhere."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


class SharedImages:
    """Images of known (h, w) shapes, uint8 with 3 channels, packed in one shared mapping; ``[i]`` is a read-only
    view (no copy)."""

    def __init__(self, buffer: np.ndarray, shapes_hw: np.ndarray, offsets: np.ndarray) -> None:
        self.buffer, self.shapes, self.offsets = buffer, shapes_hw, offsets

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int) -> np.ndarray:
        h, w = (int(v) for v in self.shapes[i])
        view = self.buffer[self.offsets[i]:self.offsets[i] + h * w * 3].reshape(h, w, 3)
        view.flags.writeable = False
        return view

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0


def remove_stale(folder: Path) -> int:
    """Delete cache files whose creating process is gone (a build killed midway); returns how many."""
    removed = 0
    for path in folder.glob(f"{PREFIX}*"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(path.name[len(PREFIX):].split("-")[0])
            if not pid_alive(pid):
                path.unlink()
                removed += 1
    return removed


def build_shared(load: Callable[[int], np.ndarray], shapes_hw: np.ndarray, key: str) -> SharedImages:
    """Decode every image (``load(i)`` gives it resized to ``shapes_hw[i]``) once per machine into shared memory;
    the local ranks share the work. All ranks must call it."""
    sizes = shapes_hw[:, 0] * shapes_hw[:, 1] * 3
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    local_rank, local_world = dist.get_local_rank(), dist.get_local_world_size()
    name = None
    if local_rank == 0:
        remove_stale(shm_dir())
        path = shm_dir() / f"{PREFIX}{os.getpid()}-{key}"
        with open(path, "wb") as f:
            f.truncate(max(int(offsets[-1]), 1))
        name = str(path)
    node_of = dist.all_gather_object((dist.node_rank(), name), long=True)  # every rank learns its node's file
    path = Path(next(n for node, n in node_of if node == dist.node_rank() and n is not None))
    buffer = np.memmap(path, dtype=np.uint8, mode="r+", shape=(max(int(offsets[-1]), 1),))

    def fill(i: int) -> None:
        h, w = (int(v) for v in shapes_hw[i])
        buffer[offsets[i]:offsets[i + 1]] = np.ascontiguousarray(load(i)).reshape(-1)[:h * w * 3]

    with ThreadPool(max(available_cores() // max(local_world, 1), 1)) as pool:
        pool.map(fill, range(local_rank, len(shapes_hw), local_world))
    buffer.flush()
    dist.barrier(long=True)  # every local rank has mapped and filled its share
    if local_rank == 0:
        path.unlink(missing_ok=True)  # the mappings keep the memory; nothing is left in /dev/shm
    return SharedImages(buffer, shapes_hw, offsets)
