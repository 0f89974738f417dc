"""Where a batch's pixels live: one channels_last uint8 tensor that the samples are written into (``new_batch``,
``slots_batch``), in shared memory in a DataLoader worker, and a ring of such shared-memory batches that a worker
writes again once the training loop is done with them (``BatchRing``).

A worker hands each batch to the training process in shared memory, and a fresh segment costs a page fault the
kernel zeroes for each 4 kB of it: about 300 and 0.6 ms of kernel time per 640-px image, an eighth of building it
(``benchmarks/bench_data.py --anchor ultralytics``). With a ring, each worker keeps up to ``depth`` segments and
writes a later batch into one the training process has released, which it does once nothing there reads the
batch any more: on the CPU after the training loop's float copy (``release``), for CUDA after the copy into pinned
memory (``pinned``, the batches' ``pin_memory``, which torch's loader calls). A loader iterated anywhere else
without pinned memory (a user's loop, ``list(loader)``) gets a fresh segment for every batch, as without the ring:
a batch that someone keeps is never written again. A worker whose segments are all in use takes a fresh one too;
it never waits.

The marks: a shared (workers, depth) table of int64, 0 where a segment is free. A worker marks a segment with a
serial (its process's generation in the high bits, so a restarted worker's segments are new ones and an old
batch's release cannot free them), writes MAGIC, the ring's token, the segment's place and the serial after the
pixels (the tail),
and sends the batch; ``release`` reads the tail of the batch's memory and clears the mark if it still holds that
serial. Marking and clearing happen under one lock. The training process keeps its mapping of each released
segment, so receiving it again maps nothing new.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import secrets
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

MAGIC = 0x59_4F_4C_4F_52_49_4E_47  # "YOLORING"
TAIL = 32  # bytes after the pixels: MAGIC, the ring's token, the segment's place (worker * depth + slot), the serial
_RINGS: weakref.WeakValueDictionary[int, BatchRing] = weakref.WeakValueDictionary()  # this process's, by token


def new_batch(shape: tuple[int, int, int, int], ring: BatchRing | None = None) -> torch.Tensor:
    """An uninitialised uint8 (b, c, h, w) tensor in channels_last memory; in a DataLoader worker, in shared memory
    (as torch's default_collate makes it), so sending the batch to the main process does not copy it once more: a
    free segment of ``ring`` where it has one, else a fresh segment."""
    b, c, h, w = shape
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8, memory_format=torch.channels_last)
    if ring is not None and (batch := ring.batch(shape)) is not None:
        return batch
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (b, h, w, c)).permute(0, 3, 1, 2)


def slots_batch(imgs: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The (b, 3, h, w) batch whose slots ``imgs`` are, in order and filling it (YoloDataset.__getitems__ writes
    each sample into its slot of a new_batch; a ring's segment has its tail after them), so collating copies
    nothing; None when they are not."""
    first = imgs[0]
    (c, h, w), storage = first.shape, first.untyped_storage()
    size = c * h * w
    if storage.nbytes() - len(imgs) * size not in (0, TAIL) or any(
            img.shape != first.shape or img.stride() != (1, w * c, c) or img.storage_offset() != n * size
            or img.untyped_storage().data_ptr() != storage.data_ptr() for n, img in enumerate(imgs)):
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (len(imgs), h, w, c)).permute(0, 3, 1, 2)


def _tail(imgs: torch.Tensor) -> tuple[int, int, int] | None:
    """(ring token, place, serial) from the tail of the memory of a whole ring batch; None for any other tensor."""
    if imgs.device.type != "cpu" or imgs.dtype != torch.uint8 or imgs.storage_offset():
        return None
    segment = imgs.untyped_storage()
    nbytes = segment.nbytes() - TAIL
    if nbytes != imgs.numel():
        return None
    tail = torch.empty(0, dtype=torch.uint8).set_(segment, nbytes, (TAIL,)).numpy().copy().view(np.int64)
    return (int(tail[1]), int(tail[2]), int(tail[3])) if int(tail[0]) == MAGIC else None


def hand_back(imgs: torch.Tensor) -> bool:
    """Release ``imgs`` to its worker when it is a batch of one of this process's rings (``BatchRing.release``);
    False for any other tensor."""
    found = _tail(imgs)
    ring = _RINGS.get(found[0]) if found else None
    return ring is not None and ring.release(imgs)


def pinned(value: Any, pin: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Any:
    """A batch as torch's DataLoader pins it for CUDA: every tensor copied into page-locked memory by ``pin``
    (default: Tensor.pin_memory), through mappings, named and plain tuples and lists; each ring batch is handed back
    to its worker once copied, since nothing in the training process reads it after the copy. The ``pin_memory`` of
    utils.data.samples' batches."""
    if isinstance(value, torch.Tensor):
        copy = value.pin_memory() if pin is None else pin(value)
        hand_back(value)
        return copy
    if isinstance(value, Mapping):
        return {key: pinned(item, pin) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(pinned(item, pin) for item in value))
    if isinstance(value, tuple | list):
        return type(value)(pinned(item, pin) for item in value)
    return value


class BatchRing:
    """The segments of ``workers`` DataLoader workers, ``depth`` each: made in the training process before the
    workers start (they share its marks and lock), used by the workers (``batch``) and released by the training
    loop (``release``)."""

    def __init__(self, workers: int, depth: int, context: Any = None) -> None:
        """``context``: the multiprocessing context the workers start in (default: the default one), whose lock
        they can share."""
        self.depth, self.token = depth, secrets.randbits(62) + 1
        self.marks = torch.zeros((workers, depth), dtype=torch.int64).share_memory_()
        self.lock = (context or multiprocessing).Lock()
        self._pid = -1  # the process the fields below belong to
        self._segments: dict[int, torch.UntypedStorage] = {}  # a worker's: slot -> segment
        self._generation = self._count = 0
        self._held: dict[int, torch.UntypedStorage] = {}  # the training process's: place -> mapped segment
        _RINGS[self.token] = self

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pid": -1, "_segments": {}, "_held": {}}  # a spawned worker starts empty

    def batch(self, shape: tuple[int, int, int, int]) -> torch.Tensor | None:
        """In a DataLoader worker: an uninitialised uint8 (b, c, h, w) channels_last batch in a free segment of
        this worker's ring, marked in use; None outside a worker or when every segment is in use."""
        info = torch.utils.data.get_worker_info()
        if info is None or info.id >= self.marks.shape[0]:
            return None
        if self._pid != os.getpid():  # a new worker process: no segments yet, a generation of its own
            self._pid, self._segments, self._held, self._count = os.getpid(), {}, {}, 0
            self._generation = secrets.randbits(30) + 1
        row = self.marks[info.id]
        with self.lock:
            free = [j for j, mark in enumerate(row.tolist()) if mark >> 32 != self._generation]
            if not free:
                return None
            slot, self._count = free[0], self._count + 1
            serial = self._generation << 32 | self._count
            row[slot] = serial
        nbytes = math.prod(shape)
        segment = self._segments.get(slot)
        if segment is None or segment.nbytes() != nbytes + TAIL:
            segment = self._segments[slot] = torch.UntypedStorage._new_shared(nbytes + TAIL)
        tail = np.array([MAGIC, self.token, info.id * self.depth + slot, serial], np.int64)
        torch.empty(0, dtype=torch.uint8).set_(segment, nbytes, (TAIL,)).numpy()[:] = tail.view(np.uint8)
        b, c, h, w = shape
        return torch.empty(0, dtype=torch.uint8).set_(segment, 0, (b, h, w, c)).permute(0, 3, 1, 2)

    def release(self, imgs: torch.Tensor) -> bool:
        """In the training process: the worker may write ``imgs``' segment again, so nothing may read ``imgs``
        after this (nor release it again: by then its memory may hold a later batch). False (nothing done) for a
        batch that is not one of this ring's, or one released already while the worker has not written again."""
        found = _tail(imgs)
        if found is None or found[0] != self.token or not 0 <= found[1] < self.marks.numel():
            return False
        _, place, serial = found
        marks = self.marks.view(-1)
        with self.lock:
            if int(marks[place]) != serial:
                return False
            marks[place] = 0
        self._held[place] = imgs.untyped_storage()  # kept mapped: torch finds it again when the segment comes back
        return True
