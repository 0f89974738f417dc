"""``--cache ram``: one copy of the decoded images per machine, in shared memory, read by every local rank and
every DataLoader worker.

The local ranks of a machine decode the images together (each its share) into one file in /dev/shm; every rank
maps it, and as soon as all have, local rank 0 removes its name: the memory lives while any process maps it and
is freed with the last one, so nothing is left behind, even after a SIGKILL. A file left by a build that was
killed midway (its creator's pid is gone) is removed by the next build on the machine.

The memory is reserved before anything is written (the machine's available memory checked, then the file's pages
allocated), so a small /dev/shm (Docker's and Kubernetes' default is 64 MB) means one warning and training
without the RAM cache, never a SIGBUS on a page the file system cannot back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import weakref
from collections.abc import Callable
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np

from utils.atomic_files import pid_alive
from utils.device import available_cores
from utils.distributed import comm as dist
from utils.log import LOGGER

PREFIX = "yolo-ram-"
RAM_MARGIN = 0.1  # leave this share of the machine's available memory to everything else


def shm_dir() -> Path:
    """Where shared-memory files live: /dev/shm on Linux, the temp folder elsewhere."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


# Shared memory this process's dataloaders will take once their workers run (they start with the first batch, so
# the file system does not show it yet), by loader; kept for as long as each loader lives.
_PLANNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plan_shared_memory(owner: object, nbytes: int) -> None:
    """Record that ``owner`` (a dataloader) will take ``nbytes`` of /dev/shm while it lives."""
    _PLANNED[owner] = int(nbytes)


def planned_shared_memory() -> int:
    """Bytes of /dev/shm this process's live dataloaders will take (recorded by plan_shared_memory)."""
    return sum(_PLANNED.values())


def shm_free() -> int | None:
    """Free bytes in /dev/shm as the file system reports them, less what this process's dataloaders will take;
    None where there is no /dev/shm (batches and caches then live in ordinary files)."""
    if not Path("/dev/shm").is_dir():
        return None
    stats = os.statvfs("/dev/shm")
    return stats.f_bavail * stats.f_frsize - planned_shared_memory() * max(dist.get_local_world_size(), 1)


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


def available_memory() -> int | None:
    """The machine's available memory in bytes (MemAvailable of /proc/meminfo), None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def size_text(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def reserve(path: Path, nbytes: int) -> str:
    """Create ``path`` with ``nbytes`` whose memory is reserved now; returns '' or why it cannot be (nothing is
    left behind then)."""
    available = available_memory()
    if available is not None and nbytes > available * (1 - RAM_MARGIN):
        return (f"the images need {size_text(nbytes)} and the machine has {size_text(available)} of memory "
                "available; use --cache disk (or fewer, smaller images)")
    stats = os.statvfs(path.parent)
    free = stats.f_bavail * stats.f_frsize
    if path.parent == Path("/dev/shm"):  # leave the dataloaders of this machine's ranks what they will need
        free -= planned_shared_memory() * max(dist.get_local_world_size(), 1)
    advice = (f"{path.parent} has {size_text(free)} free (Docker's and Kubernetes' default is 64 MB): start the "
              f"container with --ipc=host or --shm-size larger than {size_text(nbytes)}, or use --cache disk")
    if nbytes > free:
        return f"the images need {size_text(nbytes)} of shared memory and {advice}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, nbytes)  # every page now, so a write can never meet a full file system
        else:
            os.ftruncate(fd, nbytes)
    except OSError as e:
        path.unlink(missing_ok=True)
        if e.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        return f"the images need {size_text(nbytes)} of shared memory and {advice}"
    finally:
        os.close(fd)
    return ""


def build_shared(load: Callable[[int], np.ndarray], shapes_hw: np.ndarray, key: str) -> SharedImages | None:
    """Decode every image (``load(i)`` gives it resized to ``shapes_hw[i]``) once per machine into shared memory;
    the local ranks share the work. None, after one warning saying why and what to do, when a machine lacks the
    memory: every rank of that machine then reads its images from disk. All ranks must call it."""
    sizes = shapes_hw[:, 0] * shapes_hw[:, 1] * 3
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    nbytes = max(int(offsets[-1]), 1)
    local_rank, local_world = dist.get_local_rank(), dist.get_local_world_size()
    name, why = None, ""
    if local_rank == 0:
        remove_stale(shm_dir())
        path = shm_dir() / f"{PREFIX}{os.getpid()}-{key}"
        why = reserve(path, nbytes)
        name = None if why else str(path)
    nodes = dist.all_gather_object((dist.node_rank(), name, why), long=True)  # every rank learns its node's file
    refused = [(node, reason) for node, _, reason in nodes if reason]
    if refused:
        where = f" on machine {refused[0][0]}" if dist.get_world_size() > dist.get_local_world_size() else ""
        LOGGER.warning(f"WARNING: --cache ram{where}: {refused[0][1]}; training without the RAM cache")
    path_name = next((n for node, n, reason in nodes if node == dist.node_rank() and (n or reason)), None)
    if path_name is None:
        return None
    path = Path(path_name)
    buffer = np.memmap(path, dtype=np.uint8, mode="r+", shape=(nbytes,))

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
