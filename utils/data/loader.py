"""Rank-aware dataloaders: a resumable seeded sampler, per-rank and per-worker seeds, persistent workers.

The training order of an epoch depends only on (seed, epoch): a permutation of the whole data set
that every rank computes alike. Rank r of W takes positions ``start + r, start + r + W, ...`` of it,
so after ``set_start(samples_consumed)`` a resumed run - with any world size - sees exactly the
samples the interrupted run had not reached.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from utils.data.batch_memory import BatchRing
from utils.data.datasets import DatasetOptions, YoloDataset
from utils.data.errors import DataError
from utils.data.formats import label_reader, shared_scan_sources
from utils.data.heap import keep_freed_memory
from utils.data.ram_cache import plan_shared_memory, shm_free, size_text
from utils.data.shard_urls import ShardSpec
from utils.data.stream import StreamDataset, load_stream, rank_positions
from utils.device import available_cores, freeze_long_lived
from utils.distributed import comm as dist
from utils.distributed.signals import protect_worker
from utils.log import LOGGER
from utils.tasks.registry import get_task


class ResumableSampler(Sampler):
    """Shards a (seed, epoch)-determined order over ranks; ``set_start`` skips globally consumed samples.

    The remaining positions are padded (by wrapping) to a multiple of the world size so every rank
    yields the same number of samples, as DistributedSampler does, and by one more sample each where a rank's
    last batch of ``batch_size`` would hold one image alone (BatchNorm cannot train on it). With ``sample_seeds`` it
    yields ``(index, (seed, epoch, position))``: the dataset seeds that sample's augmentation from it, so
    augmentations depend on neither rank nor worker (a mosaic's partners come from its batch: the batch per process
    decides which images share one), and a resumed run repeats them exactly.
    """

    def __init__(self, dataset_len: int, *, shuffle: bool = True, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, sample_seeds: bool = False, batch_size: int = 1) -> None:
        self.dataset_len, self.shuffle, self.seed, self.sample_seeds = dataset_len, shuffle, seed, sample_seeds
        self.batch_size = batch_size
        self.rank = dist.get_rank() if rank is None else rank
        self.world_size = dist.get_world_size() if world_size is None else world_size
        self.epoch, self.start = 0, 0
        self.weights: torch.Tensor | None = None  # --image-weights: draw the order by these, with replacement

    def set_weights(self, weights: Sequence[float] | np.ndarray | None) -> None:
        """Sample images in proportion to ``weights`` from now on (None: a plain shuffle). Every rank must set
        the same weights, so that they draw the same order and each takes its shard."""
        self.weights = None if weights is None else torch.as_tensor(np.asarray(weights, np.float64))

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order and rewind to its beginning (call ``set_start`` after it to resume)."""
        self.epoch, self.start = int(epoch), 0

    def set_start(self, samples_consumed: int) -> None:
        """Skip the first ``samples_consumed`` positions of this epoch's global order (summed over ranks)."""
        self.start = max(0, min(int(samples_consumed), self.dataset_len))

    def epoch_order(self) -> list[int]:
        """The whole epoch's global order (the same on every rank)."""
        if not self.shuffle:
            return list(range(self.dataset_len))
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        if self.weights is not None and float(self.weights.sum()) > 0:
            return torch.multinomial(self.weights, self.dataset_len, replacement=True, generator=generator).tolist()
        return torch.randperm(self.dataset_len, generator=generator).tolist()

    def _my_positions(self) -> list[int]:
        """This rank's positions in the epoch order: start + rank, start + rank + W, ... (wrapped padding)."""
        return rank_positions(self.dataset_len, self.start, self.rank, self.world_size, batch=self.batch_size)

    def __iter__(self) -> Iterator:
        order = self.epoch_order()
        if self.sample_seeds:
            return iter([(order[p], (self.seed, self.epoch, p)) for p in self._my_positions()])
        return iter([order[p] for p in self._my_positions()])

    def __len__(self) -> int:
        return len(self._my_positions())


class ShardSampler(Sampler[int]):
    """Rank r gets r, r + W, r + 2W, ... with no padding duplicates (distributed validation)."""

    def __init__(self, dataset_len: int, rank: int | None = None, world_size: int | None = None) -> None:
        self.dataset_len = dataset_len
        self.rank = dist.get_rank() if rank is None else rank
        self.world_size = dist.get_world_size() if world_size is None else world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.dataset_len, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.dataset_len, self.world_size))


def worker_count(requested: int, batch_size: int, reserved: int = 0) -> int:
    """Workers per rank: min(requested, this rank's share of the usable cores less the ``reserved`` ones (the
    rank's own torch threads when it trains on the CPU; at least 1 left), batch size); 0 for batch 1."""
    share = available_cores() // max(dist.get_local_world_size(), 1)
    cores = max(share - reserved, 1)
    return max(0, min(requested, cores, batch_size if batch_size > 1 else 0))


def setup_worker_process() -> None:
    """What a DataLoader worker process needs for speed: OpenCV on one thread (the workers are the parallelism; its
    own threads would oversubscribe the cores), freed memory kept for the next batches (utils.data.heap), and the
    objects inherited from the parent out of the garbage collector's passes (utils.device.freeze_long_lived)."""
    cv2.setNumThreads(0)
    keep_freed_memory()
    freeze_long_lived()


def _seed_worker(worker_id: int) -> None:
    """Leave stop signals to the rank (signals.protect_worker), and give each worker its own augmentation
    stream: torch seeds workers with base_seed + worker_id."""
    protect_worker()
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    setup_worker_process()
    info = torch.utils.data.get_worker_info()
    if info is not None and hasattr(info.dataset, "reseed"):
        info.dataset.reseed(seed)


def build_dataloader(dataset: Dataset, batch_size: int, *, shuffle: bool, workers: int, seed: int = 0,
                     shard_eval: bool = False, resumable: bool | None = None, collate: Any = None,
                     reserved_cores: int = 0, prefix: str = "", recycle: bool = False) -> DataLoader:
    """A DataLoader for this rank; ``batch_size`` is the per-rank batch.

    ``resumable`` (default: ``shuffle`` or world > 1) uses ResumableSampler, the training sampler;
    ``shard_eval`` shards without padding; otherwise a plain sequential order. Augmentation seeds
    differ per rank (the generator) and per worker (torch adds the worker id). ``reserved_cores``: see worker_count;
    the workers are fewer where /dev/shm has no room for their batches (shm_workers). ``recycle``: the workers write
    later batches into the same shared memory once a batch is handed back, by its copy into pinned memory (CUDA) or
    by the caller with utils.data.batch_memory.hand_back once it has its own copy of the pixels (BatchRing there;
    where the dataset supports it).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if resumable is None:
        resumable = shuffle or world > 1
    if shard_eval:
        sampler: Sampler = ShardSampler(len(dataset), rank, world)
    elif resumable:
        sampler = ResumableSampler(len(dataset), shuffle=shuffle, seed=seed, rank=rank, world_size=world,
                                   sample_seeds=hasattr(dataset, "seed_sample"), batch_size=batch_size)
    else:
        sampler = torch.utils.data.SequentialSampler(dataset)
    batch_nbytes = dataset.batch_nbytes(batch_size) if hasattr(dataset, "batch_nbytes") else 0
    pin = torch.cuda.is_available()
    ring = recycle and hasattr(dataset, "ring") and collate is None
    num_workers = shm_workers(worker_count(workers, batch_size, reserved_cores), batch_nbytes, prefix, ring)
    if hasattr(dataset, "ring"):
        dataset.ring = BatchRing(num_workers, PREFETCH + RING_SPARE) if ring and num_workers else None
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    if num_workers == 0 and hasattr(dataset, "reseed"):
        dataset.reseed(seed * 1000 + rank)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                        pin_memory=pin, collate_fn=collate or getattr(dataset, "collate_fn", None),
                        worker_init_fn=_seed_worker, generator=generator, persistent_workers=num_workers > 0,
                        prefetch_factor=PREFETCH if num_workers > 0 else None)
    plan_shared_memory(loader, in_flight_bytes(num_workers, batch_nbytes, ring))
    return loader


PREFETCH = 4  # batches each worker prepares ahead
RING_SPARE = 2  # a recycling worker's segments beyond PREFETCH: the batch in use and the one being built
_SHM_WARNED: set[str] = set()  # warnings shown once per process, not once per loader or epoch


def in_flight_bytes(workers: int, batch_nbytes: int, ring: bool = False) -> int:
    """Shared memory the batches of ``workers`` workers take at most: each worker's prefetched batches and the
    one the rank is using, or with ``ring`` each worker's segments (0 without workers: batches are then made in the
    rank's own memory)."""
    if not workers:
        return 0
    return workers * (PREFETCH + RING_SPARE) * batch_nbytes if ring else (workers * PREFETCH + 1) * batch_nbytes


def shm_workers(workers: int, batch_nbytes: int, prefix: str = "", ring: bool = False) -> int:
    """At most ``workers``: as many as /dev/shm has room for. DataLoader workers hand every batch to the rank
    through shared memory, and a full /dev/shm (Docker's and Kubernetes' default is 64 MB) ends the run in the
    collate; so the free space the machine reports (less what this process's other loaders and the ranks of the
    machine will take) decides, with one warning when it is fewer."""
    free = shm_free()
    if not workers or not batch_nbytes or free is None:
        return workers
    ranks = max(dist.get_local_world_size(), 1)
    fitting = workers
    while fitting and in_flight_bytes(fitting, batch_nbytes, ring) > free // ranks:
        fitting -= 1
    if fitting < workers and "shm" not in _SHM_WARNED:
        _SHM_WARNED.add("shm")
        stats = os.statvfs("/dev/shm")
        needed = in_flight_bytes(workers, batch_nbytes, ring) * ranks
        size = stats.f_blocks * stats.f_frsize + max(needed - free, 0)
        instead = f"{fitting} worker{'s' if fitting > 1 else ''}" if fitting else \
            "no workers (batches made in the training process)"
        LOGGER.warning(f"{prefix}WARNING: /dev/shm has {size_text(max(free, 0))} free and the batches of {workers} "
                       f"dataloader workers per rank need about {size_text(needed)} of it; using {instead}. Start "
                       f"the container with --ipc=host or --shm-size larger than {size_text(size)}")
    return fitting


def _ordered(loader: DataLoader) -> Any:
    """What orders the loader's samples: its sampler, or a streamed dataset (utils.data.stream)."""
    return loader.dataset if isinstance(getattr(loader, "dataset", None), StreamDataset) else loader.sampler


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Select the epoch's sample order (no-op for samplers without epochs)."""
    if hasattr(_ordered(loader), "set_epoch"):
        _ordered(loader).set_epoch(epoch)


def close_mosaic(loader: DataLoader) -> bool:
    """Train on single images from now on (the last epochs of a recipe's ``close_mosaic``): the dataset's mosaic is
    switched off and persistent workers, which hold their own copy of the dataset, are restarted with the next
    epoch. True when mosaic was on (a no-op otherwise, and for batches given in code)."""
    dataset = getattr(loader, "dataset", None)
    if not getattr(dataset, "mosaic", False):
        return False
    dataset.mosaic = False
    workers = getattr(loader, "_iterator", None)  # torch keeps persistent workers' iterator here
    if workers is not None:
        workers._shutdown_workers()
        loader._iterator = None
    return True


def set_weights(loader: DataLoader, weights: np.ndarray | None) -> None:
    """--image-weights: draw the epoch's order in proportion to per-image ``weights`` (no-op for other samplers;
    streamed shards keep their plan, with one warning)."""
    if hasattr(loader.sampler, "set_weights"):
        loader.sampler.set_weights(weights)
    elif weights is not None and isinstance(getattr(loader, "dataset", None), StreamDataset) and \
            "image-weights" not in _SHM_WARNED:
        _SHM_WARNED.add("image-weights")
        LOGGER.warning("WARNING: --image-weights does not apply to streamed shards: every image is trained once "
                       "an epoch")


def image_weights(labels: Sequence[np.ndarray], nc: int, maps: np.ndarray) -> np.ndarray:
    """Per-image sampling weights that balance the classes, as --image-weights uses them: each class weighs its
    inverse frequency (normalised) times (1 - its last mAP)^2 / nc, and an image the sum over its labels."""
    classes = [lab[:, 0].astype(int) for lab in labels]
    counts = np.bincount(np.concatenate(classes), minlength=nc)[:nc] if any(len(c) for c in classes) else \
        np.zeros(nc)
    class_weights = 1 / np.where(counts == 0, 1, counts)
    class_weights = class_weights / class_weights.sum() * (1 - np.asarray(maps, np.float64)) ** 2 / nc
    return np.array([class_weights[c].sum() for c in classes], np.float64)


def set_start(loader: DataLoader, samples_consumed: int) -> None:
    """Resume mid-epoch: skip the first ``samples_consumed`` samples (global, all ranks) of this epoch."""
    if hasattr(_ordered(loader), "set_start"):
        _ordered(loader).set_start(samples_consumed)


def create_dataloader(sources: str | Path | Sequence[str | Path], options: DatasetOptions, *, workers: int = 8,
                      shuffle: bool = False, shard_eval: bool = False, quad: bool = False,
                      reserved_cores: int = 0, recycle: bool = False) -> tuple[DataLoader, YoloDataset]:
    """Scan the labels with every rank (utils.data.formats.shared_scan_sources), build the dataset zero-first (the
    disk cache written once per machine), then its loader;
    ``options.batch_size`` is the batch per rank.

    With ``rect``, batch shapes are grouped over ``batch_size * world`` images, so each rank's batches
    (positions r, r + W, ...) still share one shape. ``reserved_cores`` and ``recycle``: see worker_count and
    build_dataloader. All ranks must call it.
    """
    world, batch_size = dist.get_world_size(), options.batch_size
    items = list(sources) if isinstance(sources, list | tuple) else [sources]
    if any(isinstance(s, ShardSpec) for s in items):
        return stream_loader(items, options, workers, training=(shuffle or options.augment) and not shard_eval,
                             reserved_cores=reserved_cores)
    if options.rect and shuffle:
        LOGGER.warning(f"{options.prefix}WARNING: --rect keeps images sorted by aspect ratio; shuffle is turned off")
    dataset_class = get_task(options.task).load("dataset") or YoloDataset  # a task may read its own data
    if dataset_class is YoloDataset:  # every rank scans its share of the labels when a cache is stale
        shared_scan_sources(sources, options.nc, options.prefix, label_reader(options.task, options.task_options))
    with dist.zero_first(local=True):  # then the cache is read (or, unwritable, scanned by local rank 0 first)
        dataset = dataset_class(sources, options, batch_size=batch_size * world if options.rect else batch_size,
                                cache=None)
    if options.cache:  # every rank takes part (a shared RAM cache, or a share of the disk cache)
        dataset.cache_images(options.cache, options.prefix)
    training = shuffle or options.augment  # a training loader resumes exactly, even with --rect (kept order)
    loader = build_dataloader(dataset, batch_size, shuffle=shuffle and not options.rect, workers=workers,
                              seed=options.seed, shard_eval=shard_eval, resumable=training and not shard_eval,
                              collate=dataset.collate_quad if quad else None, reserved_cores=reserved_cores,
                              prefix=options.prefix, recycle=recycle)
    return loader, dataset


def stream_loader(items: list, options: DatasetOptions, workers: int, *, training: bool,
                  reserved_cores: int = 0) -> tuple[DataLoader, Any]:
    """The loader of a split in tar shards (utils.data.stream): batches made in persistent workers, which read
    each epoch's position from the dataset's shared memory. All ranks must call it."""
    if len(items) != 1:
        raise DataError(f"{options.prefix}a split in shards names one shard pattern (got {len(items)} entries)")
    if options.fraction < 1:
        raise DataError(f"{options.prefix}--fraction keeps a share of a split's image files; a split in shards "
                        "streams whole shards: name fewer shards in the data YAML instead")
    reader = label_reader(options.task, options.task_options)
    if reader.kind:
        raise DataError(f"{options.prefix}tar shards hold boxes only; a {options.task} model reads {reader.sources}")
    if options.rect and training:
        LOGGER.warning(f"{options.prefix}WARNING: --rect does not apply to streamed shards; square batches are used")
    dataset, split = load_stream(items[0], options, training=training)
    num_workers = shm_workers(worker_count(workers, options.batch_size, reserved_cores),
                              dataset.batch_nbytes(options.batch_size), options.prefix)
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, pin_memory=torch.cuda.is_available(),
                        worker_init_fn=_seed_worker, persistent_workers=num_workers > 0,
                        prefetch_factor=PREFETCH if num_workers > 0 else None)
    return loader, split
