"""Training and validation from tar shards (utils.data.shards), streamed: the epoch's plan and the iterable
dataset each rank's dataloader workers read it with.

The plan makes the epoch's global order depend only on (seed, epoch, the index, the total batch B), never on the
world size: the shards are permuted, their samples concatenated and cut into C = k * B contiguous parts (k in 1..8,
from the sample count), each part's samples permuted by a shuffle buffer simulated on their indices, and the parts
interleaved (global position p -> part p mod C, item p div C). Rank r of W takes positions start + r, start + r + W,
... as the file-based sampler does (utils.data.loader.ResumableSampler), so a resumed epoch - at any world size
dividing B - skips exactly the ``start`` samples trained, and every sample is trained once per epoch (the last
positions padded by wrapping, as DistributedSampler pads). Since W divides C, a rank reads only its own parts, and a
worker of it reads only its own when its worker count divides k; each part is read front to back in byte ranges,
holding at most a shuffle buffer's samples.

Mosaic and mixup draw their partners from the worker's last POOL_SIZE decoded samples; each sample's augmentation
is seeded from (seed, epoch, position).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
import queue
import shutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from utils.atomic_files import remove_dead_writers_files
from utils.data.datasets import DatasetOptions, YoloDataset
from utils.data.image_io import ImageRefused, decode_image
from utils.data.regular_files import size_text
from utils.data.samples import SampleExtras
from utils.data.shard_urls import ShardSpec
from utils.data.shards import SHARD_REASON, Opener, ShardIndex, ShardRefused, opener, read_index, read_samples
from utils.distributed import comm as dist
from utils.hyp import load_hyp
from utils.log import LOGGER
from utils.paths import data_home

PARTS_PER_BATCH = 8  # at most: C = k * B parts, k in 1..PARTS_PER_BATCH
MIN_PART = 64  # samples a part should hold before k grows
SHUFFLE_BUFFER = 16  # samples per part's shuffle buffer
POOL_SIZE = 64  # decoded samples a worker keeps for mosaic and mixup partners


def rank_positions(n: int, start: int, rank: int, world: int, pad: bool = True, batch: int = 1) -> list[int]:
    """Rank ``rank``'s positions of an epoch of ``n`` (global order) after ``start`` consumed: start + rank,
    start + rank + world, ...; with ``pad`` wrapped to a multiple of ``world`` so every rank gets as many (as
    DistributedSampler pads), and one more each when a rank's last batch of ``batch`` would hold one image alone
    (BatchNorm cannot train on one value per channel: a 32 px image's last map is 1 x 1)."""
    remaining = n - start
    if remaining <= 0:
        return []
    if not pad:
        return list(range(start + rank, n, world))
    per_rank = math.ceil(remaining / world)
    per_rank += batch > 1 and per_rank % batch == 1
    return [start + (p % remaining) for p in range(rank, per_rank * world, world)]


def buffer_order(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """The order a shuffle buffer of ``size`` emits ``n`` items read in order 0..n-1 (item m is emitted at some
    position >= m - size + 1, so a reader holds at most ``size`` items)."""
    buffer, out = [], []
    for i in range(n + size - 1):
        if i < n:
            buffer.append(i)
        if buffer and (len(buffer) >= size or i >= n):
            j = int(rng.integers(len(buffer)))
            out.append(buffer[j])
            buffer[j] = buffer[-1]
            buffer.pop()
    return np.array(out + buffer, np.int64)


def part_count(n: int, total_batch: int) -> int:
    """C = k * B parts for ``n`` samples and total batch B: k = n // (MIN_PART * B) in 1..PARTS_PER_BATCH."""
    return total_batch * min(max(n // (MIN_PART * total_batch), 1), PARTS_PER_BATCH)


class EpochPlan:
    """The global order of one epoch (see the module docstring): ``sample(p)`` is the index id at position p."""

    def __init__(self, shard_of: np.ndarray, parts: int, seed: int, epoch: int, shuffle: bool,
                 buffer: int = SHUFFLE_BUFFER) -> None:
        self.n, self.parts, self.shuffle, self.buffer = len(shard_of), parts, shuffle, buffer
        self.key = (seed, epoch)
        shards = np.unique(shard_of)
        if shuffle:
            shards = np.random.default_rng([seed, epoch, 1]).permutation(shards)
        ids = np.argsort(shard_of, kind="stable")  # index order within each shard kept
        starts = np.searchsorted(shard_of[ids], shards)
        ends = np.searchsorted(shard_of[ids], shards, side="right")
        self.stored = np.concatenate([ids[a:b] for a, b in zip(starts, ends)]) if len(ids) else ids
        self.q, self.rem = divmod(self.n, parts)

    def locate(self, p: int) -> tuple[int, int]:
        """(part, item in the part's emitted order) of global position ``p``."""
        return (p % self.parts, p // self.parts) if p < self.q * self.parts else (p - self.q * self.parts, self.q)

    def part_range(self, c: int) -> tuple[int, int]:
        """(first stored position, size) of part ``c``."""
        return c * self.q + min(c, self.rem), self.q + (c < self.rem)

    @lru_cache(maxsize=4096)  # noqa: B019 (one plan per epoch, dropped with it)
    def part_order(self, c: int) -> np.ndarray:
        size = self.part_range(c)[1]
        if not self.shuffle:
            return np.arange(size)
        return buffer_order(size, self.buffer, np.random.default_rng([*self.key, 2, c]))

    def where(self, p: int) -> tuple[int, int, int]:
        """(part, stored position within the part, index id) of global position ``p``."""
        c, m = self.locate(p)
        local = int(self.part_order(c)[m])
        return c, local, int(self.stored[self.part_range(c)[0] + local])

    def sample(self, p: int) -> int:
        return self.where(p)[2]


class SamplePool(YoloDataset):
    """The worker's last POOL_SIZE decoded samples as a YoloDataset (letterbox, mosaic, mixup and the colour and
    flip augmentations as for files); ``add`` puts a decoded sample in and returns its index."""

    def __init__(self, options: DatasetOptions) -> None:  # not super().__init__: it scans files, a pool has none
        self.options = opts = options
        self.img_size, self.augment, self.rect, self.stride = opts.img_size, opts.augment, False, opts.stride
        self.hyp = dict(load_hyp() if opts.hyp is None and opts.augment else opts.hyp or {})  # as YoloDataset's
        self.mosaic = opts.augment and self.hyp.get("mosaic", 0) > 0
        self.names, self.seed = list(opts.names or []), opts.seed
        self.rng = np.random.default_rng(opts.seed)
        self.im_files, self.read_files, self.labels, self.images = [], [], [], []
        self.shapes = np.zeros((0, 2))
        self.batch_index = self.batch_shapes = self.ram = self.extras = None  # boxes only (no task extras yet)
        self.sample_extras = SampleExtras(opts)
        self.npy_cached, self.next_slot = False, 0

    def add(self, name: str, image: np.ndarray, labels: np.ndarray) -> int:
        entry = (name, image, labels.copy())
        if len(self.images) < POOL_SIZE:
            self.im_files.append(name)
            self.images.append(image)
            self.labels.append(entry[2])
            slot = len(self.images) - 1
        else:
            slot = self.next_slot
            self.im_files[slot], self.images[slot], self.labels[slot] = entry
        self.next_slot = (slot + 1) % POOL_SIZE
        self.shapes = np.array([(img.shape[1], img.shape[0]) for img in self.images], np.float64)
        return slot

    def _read(self, i: int, reduce: int = 1) -> np.ndarray:  # decoded whole already: load_image resizes it
        return self.images[i]


class ShardCache:
    """``--cache disk`` for shards in object storage: each shard fetched whole, once per machine (a file lock), into
    ``folder``; the least recently used ones removed to stay under ``cap`` bytes. Only files it wrote are removed.
    A shard is copied up to the cap and no further, whatever size the server gave: a larger one, or one the disk
    has no room for, is refused (its samples counted as refused by the reader) and its temporary file removed."""

    SUFFIX = ".shard"
    TMP = ".tmp"

    def __init__(self, folder: Path, cap: int, open_url: Opener) -> None:
        self.folder, self.cap, self.open_url = folder, cap, open_url
        folder.mkdir(parents=True, exist_ok=True)
        remove_dead_writers_files(folder, f"*{self.SUFFIX}{self.TMP}*", self.TMP)  # writers killed mid-copy

    def _path(self, url: str) -> Path:
        return self.folder / f"{hashlib.sha1(url.encode()).hexdigest()[:20]}{self.SUFFIX}"

    def __call__(self, url: str, start: int = 0, end: int | None = None) -> BinaryIO:
        path = self._path(url)
        with open(self.folder / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.is_file():
                tmp = path.with_name(f"{path.name}{self.TMP}{os.getpid()}")
                try:
                    with self.open_url(url) as source, open(tmp, "wb") as target:
                        self._copy(source, target, Path(url).name)
                    os.replace(tmp, path)
                finally:
                    tmp.unlink(missing_ok=True)
                self._evict(keep=path)
            os.utime(path)
        return open(path, "rb")  # an open file stays readable when a later eviction removes its name

    def _copy(self, source: BinaryIO, target: BinaryIO, name: str) -> None:
        """Copy up to ``cap`` bytes; ShardRefused past it."""
        copied = 0
        while chunk := source.read(min(1 << 20, self.cap + 1 - copied)):
            copied += len(chunk)
            if copied > self.cap:
                raise ShardRefused(f"it is larger than --cache disk's cap of {size_text(self.cap)}")
            target.write(chunk)

    def _evict(self, keep: Path) -> None:
        files = sorted(self.folder.glob(f"*{self.SUFFIX}"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for path in files:
            if total <= self.cap or path == keep:
                continue
            total -= path.stat().st_size
            with contextlib.suppress(OSError):
                path.unlink()

def shard_cache_folder(spec: ShardSpec) -> Path:
    """Where ``--cache disk`` keeps a pattern's shards: the data home's ``shards/<hash of the pattern>``."""
    return data_home() / "shards" / hashlib.sha1(spec.pattern.encode()).hexdigest()[:16]


class ShardSplit:
    """A split in shards as the trainer sees it before streaming: its length, names, sizes and labels (from the
    index: autoanchor, the label plots and the start-up fingerprint read these)."""

    def __init__(self, index: ShardIndex, single_cls: bool = False) -> None:
        self.index = index
        self.im_files = index.member_names()
        self.shapes = index.shapes
        self.labels = list(index.labels)  # the index's arrays (many share one empty one): replaced, never edited
        if single_cls:
            self.labels = [np.concatenate([np.zeros((len(lab), 1), np.float32), lab[:, 1:]], 1) for lab in self.labels]
        self.scan = index.summary

    def __len__(self) -> int:
        return len(self.im_files)


class StreamDataset(torch.utils.data.IterableDataset):
    """This rank's batches of a split in shards: each dataloader worker takes every num_workers-th batch of the
    rank's positions and yields it collated. ``len()`` is the rank's batch count from the current start."""

    def __init__(self, split: ShardSplit, options: DatasetOptions, *, training: bool, cache_disk: bool = False,
                 rank: int | None = None, world_size: int | None = None) -> None:
        self.split, self.options, self.training = split, options, training
        self.rank = dist.get_rank() if rank is None else rank
        self.world = dist.get_world_size() if world_size is None else world_size
        self.batch, self.seed = options.batch_size, options.seed
        self.position = torch.zeros(2, dtype=torch.int64).share_memory_()  # (epoch, start), seen by live workers
        self._open: tuple[int, Opener] | None = None  # (pid, opener) of this process
        self.warned: set[str] = set()  # shards whose refusal this process said
        if options.augment and options.hyp is None:  # the scratch hyps, as YoloDataset augments without any
            self.options = options = replace(options, hyp=load_hyp())
        self.mosaic = options.augment and options.hyp.get("mosaic", 0) > 0
        spec = split.index.spec
        self.cache_folder = shard_cache_folder(spec) if cache_disk and not spec.local else None
        if self.cache_folder is not None:
            self.cache_folder.mkdir(parents=True, exist_ok=True)
            self.cache_cap = shutil.disk_usage(self.cache_folder).free // 2

    @property
    def parts(self) -> int:
        """C: k parts per sample of the total batch for training (every rank's dataset the same), one per rank
        for evaluation (each rank reads a contiguous run)."""
        return part_count(len(self.split), self.batch * self.world) if self.training else self.world

    @property
    def labels(self) -> list[np.ndarray]:
        return self.split.labels

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order and rewind to its beginning."""
        self.position[0], self.position[1] = int(epoch), 0

    def set_start(self, samples_consumed: int) -> None:
        """Skip the first ``samples_consumed`` positions of this epoch's global order (summed over ranks)."""
        self.position[1] = max(0, min(int(samples_consumed), len(self.split)))

    @property
    def epoch(self) -> int:
        return int(self.position[0])

    @property
    def start(self) -> int:
        return int(self.position[1])

    def positions(self) -> list[int]:
        return rank_positions(len(self.split), self.start, self.rank, self.world, pad=self.training,
                              batch=self.batch)

    def __len__(self) -> int:
        return math.ceil(len(self.positions()) / self.batch)

    def batch_nbytes(self, batch_size: int) -> int:
        boxes = max((len(lab) for lab in self.split.labels), default=0) * (8 if self.mosaic else 1)
        return batch_size * (3 * self.options.img_size ** 2 + 6 * 4 * boxes) + 2 * 4096

    def _opener(self) -> Opener:
        """This process's opener of the shards (a worker keeps its client from epoch to epoch)."""
        if self._open is None or self._open[0] != os.getpid():
            open_url = opener(self.split.index.spec)
            self._open = os.getpid(), ShardCache(self.cache_folder, self.cache_cap, open_url) if self.cache_folder \
                else open_url
        return self._open[1]

    def __iter__(self) -> Iterator[tuple]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        plan = EpochPlan(self.split.index.shard, self.parts, self.seed, self.epoch, shuffle=self.training)
        positions = self.positions()
        mine = [positions[i:i + self.batch] for i in range(worker * self.batch, len(positions),
                                                          workers * self.batch)]
        pool = SamplePool(replace(self.options, names=self.split.index.names))
        pool.mosaic = self.mosaic  # off for the last epochs of a recipe's close_mosaic (utils.data.loader)
        samples = Samples(self.split.index, plan, [p for batch in mine for p in batch], self._opener())
        try:
            for batch in mine:
                items = [self._item(pool, p, *samples.take(p)) for p in batch]
                yield YoloDataset.collate_fn(items)
        finally:
            samples.close()

    def _item(self, pool: SamplePool, position: int, sid: int, data: bytes | str) -> tuple:
        """Sample ``sid`` decoded into the pool and augmented; a sample refused here (a damaged member or image, a
        shard that cannot be read) becomes a grey background of the run's image size (never a size from the index)
        without boxes, with a warning, so the batch keeps its size."""
        name, labels = self.split.im_files[sid], self.split.labels[sid]
        try:
            if isinstance(data, str):
                raise ImageRefused(data)
            image = decode_image(data)
        except ImageRefused as e:
            self._warn_refused(name, str(e))
            side = self.options.img_size
            image, labels = np.full((side, side, 3), 114, np.uint8), labels[:0]
        return pool[(pool.add(name, image, labels), (self.epoch, position))]

    def _warn_refused(self, name: str, reason: str) -> None:
        """One warning per refused sample; a shard that cannot be read is one warning for its samples (counted in
        it), said once per process."""
        if not reason.startswith(SHARD_REASON):
            LOGGER.warning(f"WARNING: {name}: ignoring corrupt image: {reason}; a grey background without boxes is "
                           "trained in its place")
        elif reason not in self.warned:
            self.warned.add(reason)
            LOGGER.warning(f"WARNING: {reason}")


class PartReader(threading.Thread):
    """Reads one part's samples ahead of use (object storage answers each request after a delay: the parts' reads
    overlap), into a queue of at most ``depth``; stops when ``stop`` is set. Errors reach the consumer."""

    END = object()

    def __init__(self, items: Iterator[tuple[int, bytes | str]], stop: threading.Event, depth: int) -> None:
        super().__init__(daemon=True)
        self.items, self.stop, self.queue = items, stop, queue.Queue(maxsize=depth)

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            with contextlib.suppress(queue.Full):
                self.queue.put(item, timeout=0.1)
                return True
        return False

    def run(self) -> None:
        try:
            for item in self.items:
                if not self._put(item):
                    return
            self._put(self.END)
        except BaseException as e:  # noqa: BLE001 (handed to the consumer, which raises it)
            self._put(e)

    def __next__(self) -> tuple[int, bytes | str]:
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        if item is self.END:
            raise StopIteration
        return item


class Samples:
    """The encoded samples a worker needs, read part by part front to back (utils.data.shards.read_samples; ahead of
    use on threads for shards in object storage) and held until taken; a sample needed twice (padding) is held until
    its last use. ``close()`` stops the readers."""

    def __init__(self, index: ShardIndex, plan: EpochPlan, positions: Sequence[int], open_url: Opener) -> None:
        self.plan, self.stop = plan, threading.Event()
        wanted: dict[int, set[tuple[int, int]]] = {}
        self.uses: dict[int, int] = {}
        for p in positions:
            c, local, sid = plan.where(p)
            wanted.setdefault(c, set()).add((local, sid))
            self.uses[sid] = self.uses.get(sid, 0) + 1
        self.readers: dict[int, Iterator] = {c: read_samples(index, [sid for _, sid in sorted(items)], open_url)
                                             for c, items in wanted.items()}
        if not index.spec.local:
            self.readers = {c: PartReader(items, self.stop, SHUFFLE_BUFFER) for c, items in self.readers.items()}
            for reader in self.readers.values():
                reader.start()
        self.held: dict[int, bytes | str] = {}

    def take(self, p: int) -> tuple[int, bytes | str]:
        c, _, sid = self.plan.where(p)
        while sid not in self.held:
            i, data = next(self.readers[c])
            self.held[i] = data
        self.uses[sid] -= 1
        return sid, self.held[sid] if self.uses[sid] else self.held.pop(sid)

    def close(self) -> None:
        self.stop.set()


def load_stream(spec: ShardSpec, options: DatasetOptions, *, training: bool) -> tuple[StreamDataset, ShardSplit]:
    """The index of ``spec`` read once per rank (no scan), and the rank's stream of it."""
    split = ShardSplit(read_index(spec, options.nc, options.prefix), options.single_cls)
    if options.cache == "ram":
        LOGGER.warning(f"{options.prefix}WARNING: --cache ram does not apply to streamed shards; use --cache disk to "
                       "keep fetched shards on local disk")
    return StreamDataset(split, options, training=training, cache_disk=options.cache == "disk"), split
