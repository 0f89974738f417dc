"""Batches in shared memory that a worker writes again only once the training loop has released them
(utils.data.batch_memory), and the workers' heap kept between batches (utils.data.heap)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.helpers import ROOT
from utils.data.batch_memory import BatchRing, hand_back, new_batch, pinned
from utils.data.loader import (
    PREFETCH,
    RING_SPARE,
    build_dataloader,
    close_mosaic,
    create_dataloader,
    in_flight_bytes,
)
from utils.data.samples import Batch, TaskBatch

BATCHES = 12


class Numbered(torch.utils.data.Dataset):
    """Batch k's pixels all hold k (its first key // 4): whether a batch was written again shows in its pixels."""

    ring: BatchRing | None = None

    def __len__(self) -> int:
        return 4 * BATCHES

    def __getitems__(self, keys: list) -> list:
        batch = new_batch((len(keys), 3, 8, 8), self.ring)
        batch.fill_(keys[0] // 4)
        return [batch]

    @staticmethod
    def collate_fn(samples: list) -> torch.Tensor:
        return samples[0]


def numbered_loader(recycle: bool) -> torch.utils.data.DataLoader:
    return build_dataloader(Numbered(), 4, shuffle=False, workers=1, resumable=False, recycle=recycle)


def test_a_released_batch_is_written_again_and_nothing_else_is() -> None:
    loader = numbered_loader(recycle=True)
    assert loader.num_workers == 1 and loader.dataset.ring is not None
    segments, ring = set(), loader.dataset.ring
    for k, batch in enumerate(loader):
        assert (batch == k).all()  # never written while the loop held it
        segments.add(batch.untyped_storage().data_ptr())
        assert ring.release(batch)
    assert k == BATCHES - 1 and len(segments) <= PREFETCH + RING_SPARE < BATCHES  # the same memory again
    assert int(ring.marks.count_nonzero()) == 0  # every segment free: the worker, idle now, writes none
    assert not ring.release(batch)  # once only

    kept = list(numbered_loader(recycle=True))  # nobody releases: every batch keeps its own memory
    assert [int(b.unique()) for b in kept] == list(range(BATCHES))
    assert len({b.untyped_storage().data_ptr() for b in kept}) == BATCHES

    plain = numbered_loader(recycle=False)
    assert plain.dataset.ring is None
    for batch in plain:
        assert not hand_back(batch)  # nothing to release: no ring
    assert not BatchRing(1, 2).release(torch.zeros(4, 3, 8, 8, dtype=torch.uint8))  # not a ring's batch
    # /dev/shm is planned for what the workers keep: 6 batches each with the ring, else 4 each and the one in use
    assert (in_flight_bytes(2, 100, ring=True), in_flight_bytes(2, 100), in_flight_bytes(0, 100, ring=True)) == \
        (1200, 900, 0)


def test_a_batch_pinned_for_cuda_hands_its_memory_back_once_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torch's loader does with a batch for CUDA (its pin function, which calls the batch's pin_memory; here
    Tensor.pin_memory copies with clone: no GPU), then the training loop's release of the copy (no ring's)."""
    from torch.utils.data._utils.pin_memory import pin_memory as torch_pins

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *_: t.clone())
    loader = numbered_loader(recycle=True)
    segments, copies = set(), []
    for batch in loader:
        segments.add(batch.untyped_storage().data_ptr())
        both = Batch(batch, torch.zeros(2, 6), ("a.jpg",), (None,))
        del batch  # as torch's pin thread drops it: after the copy the worker may write it again
        copy = torch_pins(both)
        del both
        assert type(copy) is Batch and copy.paths == ("a.jpg",) and copy.targets.shape == (2, 6)
        assert not hand_back(copy.images)  # what the loop does next: nothing, the copy is no ring's
        copies.append(copy.images)
    assert [int(c.unique()) for c in copies] == list(range(BATCHES))  # every copy intact
    assert len(segments) <= PREFETCH + RING_SPARE
    assert int(loader.dataset.ring.marks.count_nonzero()) == 0  # each handed back by its copy
    extras = torch_pins(TaskBatch(torch.ones(1), torch.ones(1), (), (), {"masks": torch.ones(2)}))
    assert type(extras) is TaskBatch and torch.equal(extras.extras["masks"], torch.ones(2))
    assert pinned([torch.ones(1), "x"], pin=torch.clone)[1] == "x"


def test_workers_started_by_spawn_share_the_ring() -> None:
    """macOS's default start method, and CUDA users' choice: the ring (marks, lock) pickled into the worker."""
    import multiprocessing

    dataset = Numbered()
    dataset.ring = BatchRing(1, PREFETCH + RING_SPARE, multiprocessing.get_context("spawn"))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=1, collate_fn=Numbered.collate_fn,
                                         multiprocessing_context="spawn")
    segments = set()
    for k, batch in enumerate(loader):
        assert (batch == k).all() and dataset.ring.release(batch)
        segments.add(batch.untyped_storage().data_ptr())
    assert k == BATCHES - 1 and len(segments) <= PREFETCH + RING_SPARE


def test_a_restarted_worker_takes_new_memory_and_an_old_release_frees_none_of_it() -> None:
    loader = numbered_loader(recycle=True)
    batches = iter(loader)
    old = next(batches)  # held across the restart, released after it
    del batches
    loader.dataset.mosaic = True  # close_mosaic restarts the persistent worker, as at the recipe's last epochs
    assert close_mosaic(loader)
    for k, batch in enumerate(loader):
        if k == 1:
            assert not loader.dataset.ring.release(old)  # the old worker's batch: no segment of the new one freed
            assert (old == 0).all()
        assert (batch == k).all() and loader.dataset.ring.release(batch)


def test_training_batches_are_the_same_with_the_ring(tiny_dataset) -> None:
    from utils.data.config import load_data_config
    from utils.data.datasets import DatasetOptions

    options = DatasetOptions(img_size=64, batch_size=4, augment=True, hyp={"mosaic": 1.0, "fliplr": 0.5}, nc=3)
    source = load_data_config(tiny_dataset).train
    runs = {}
    for recycle in (False, True):
        loader, dataset = create_dataloader(source, options, workers=1, shuffle=True, recycle=recycle)
        assert (dataset.ring is not None) == recycle
        runs[recycle] = []
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            for imgs, targets, _, _ in loader:
                runs[recycle].append((imgs.clone(), targets))
                hand_back(imgs)
    assert len(runs[True]) == len(runs[False]) > 2
    for (a, ta), (b, tb) in zip(runs[False], runs[True]):
        assert torch.equal(a, b) and torch.equal(ta, tb)


HEAP_PROBE = textwrap.dedent("""
    import ctypes, resource, sys
    sys.path.insert(0, sys.argv[1])
    from utils.data.heap import keep_freed_memory
    kept = sys.argv[2] == "1" and keep_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def round_trip():  # 8 MB in 2 MB blocks, each page written, then freed
        blocks = [libc.malloc(2 << 20) for _ in range(4)]
        for block in blocks:
            ctypes.memset(block, 1, 2 << 20)
        for block in blocks:
            libc.free(block)
    round_trip()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        round_trip()
    print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or __import__("platform").libc_ver()[0] != "glibc",
                    reason="the heap settings are glibc's")
def test_a_worker_keeps_freed_memory_so_its_pages_fault_once() -> None:
    faults = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}  # the defaults
    for keep in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", HEAP_PROBE, str(ROOT), keep], capture_output=True, text=True,
                             check=True, env=env).stdout.split()
        assert out[0] == str(keep == "1")
        faults[keep] = int(out[1])
    assert faults["0"] >= 5 * 2048 * 0.9  # glibc's defaults: every round trip maps its 8 MB again
    assert faults["1"] < 100  # kept: the pages were faulted in once, before the rounds
