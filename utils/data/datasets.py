"""The YOLO data set: images and their checked labels, letterboxed or mosaicked and augmented, for training
and validation.

The files come from ``utils.data.formats`` (the checked, cached scan of YOLO txt, COCO JSON or VOC XML labels);
data YAMLs from ``utils.data.config``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from utils.boxes import xywhn2xyxy, xyxy2xywhn
from utils.data.annotations import no_regions
from utils.data.augment import (
    apply_hsv,
    flip_lr,
    flip_ud,
    letterbox,
    mixup,
    random_perspective_extras,
    warp_mosaic_extras,
)
from utils.data.batch_memory import BatchRing, new_batch, slots_batch
from utils.data.batch_pool import BatchPool, mosaic_pool_size
from utils.data.colour import COLOUR_KEY, draw_hsv, hsv_gains
from utils.data.errors import DataError
from utils.data.formats import ignore_regions, label_reader, scan_sources
from utils.data.image_io import ImageRefused, read_cached_array, read_image, reduction
from utils.data.label_cache import STATES, copy_name, img2label_paths
from utils.data.ram_cache import SharedImages, build_shared
from utils.data.samples import Batch, BatchSamples, DatasetOptions, Sample, SampleExtras, TaskBatch, TaskSample
from utils.device import available_cores
from utils.distributed import comm as dist
from utils.hyp import load_hyp
from utils.log import LOGGER
from utils.tasks.registry import get_task, task_names


def resized_shape(shape: tuple[int, int], img_size: int) -> tuple[int, int]:
    """(h, w) of an image of ``shape`` (h, w) after YoloDataset.load_image: long side ``img_size``."""
    h0, w0 = shape
    ratio = img_size / max(h0, w0)
    if ratio == 1:
        return h0, w0
    return min(math.ceil(h0 * ratio), img_size), min(math.ceil(w0 * ratio), img_size)


def bgr_to_chw_rgb(img: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
    """HWC BGR -> a (3, h, w) RGB tensor over HWC memory (channels_last strides): one contiguous OpenCV pass, and
    batches of such images are channels_last, the layout the CPU trains in (a float cast of them is one pass).
    ``out``: such a tensor of the same size (a slot of the batch being built) that the pass writes into."""
    if out is not None and tuple(out.shape[1:]) == img.shape[:2]:
        cv2.cvtColor(img, cv2.COLOR_BGR2RGB, dst=out.permute(1, 2, 0).numpy())
        return out
    return torch.from_numpy(cv2.cvtColor(img, cv2.COLOR_BGR2RGB)).permute(2, 0, 1)


def rect_batch_shapes(shapes_wh: np.ndarray, batch_size: int, img_size: int, stride: int,
                      pad: float) -> tuple[np.ndarray, np.ndarray]:
    """For images sorted by aspect ratio: each image's batch index and each batch's (h, w) letterbox shape."""
    batch_index = np.arange(len(shapes_wh)) // batch_size
    aspect = shapes_wh[:, 1] / shapes_wh[:, 0]  # h / w
    shapes = np.ones((int(batch_index[-1]) + 1, 2))
    for b in range(len(shapes)):
        ar = aspect[batch_index == b]
        low, high = ar.min(), ar.max()
        if high < 1:
            shapes[b] = [high, 1]
        elif low > 1:
            shapes[b] = [1, 1 / low]
    return batch_index, (np.ceil(shapes * img_size / stride + pad) * stride).astype(int)


class YoloDataset(torch.utils.data.Dataset):
    """Images and YOLO labels, letterboxed (or mosaicked and augmented) to ``img_size``.

    ``dataset[i]`` -> a Sample (image, targets, path, shapes). For a task whose labels add to the boxes (its
    ``labels`` and ``sample`` parts) a TaskSample, whose ``extras`` every augmentation moves with the boxes
    (``sample_extras``: the task's SampleExtras); ``collate_fn`` then makes a TaskBatch (``collate_extras``).
    """

    pool: BatchPool | None = None  # the batch being built: its images, each decoded once (__getitems__)
    slot: torch.Tensor | None = None  # and the slot of its batch tensor the next sample is written into
    ring: BatchRing | None = None  # shared-memory batches the training loop releases (utils.data.batch_memory)
    later: list | None = None  # with defer_colour, the gains of the batch's samples so far (HsvChange.gains)

    def __init__(self, sources: str | Path | Sequence[str | Path], options: DatasetOptions | None = None,
                 **overrides: Any) -> None:
        """``options`` with any of its fields replaced by ``overrides`` (``YoloDataset(path, img_size=64)``)."""
        opts = replace(options or DatasetOptions(), **overrides)
        self.options = opts
        self.img_size, self.augment, self.rect, self.stride = opts.img_size, opts.augment, opts.rect, opts.stride
        self.hyp = dict(load_hyp() if opts.hyp is None and opts.augment else opts.hyp or {})
        self.mosaic = opts.augment and not opts.rect and self.hyp.get("mosaic", 0) > 0
        self.colour_later = opts.defer_colour and opts.augment and any(hsv_gains(self.hyp))  # batches carry gains
        self.pool_size = mosaic_pool_size(self.hyp)  # 0: mosaic partners from the whole set (utils.data.batch_pool)
        self.names = list(opts.names) if opts.names is not None else None
        self.seed = opts.seed
        self.rng = np.random.default_rng([opts.seed, dist.get_rank()])
        if opts.task not in task_names():
            raise DataError(f"unknown task {str(opts.task)[:40]!r} (one of {', '.join(task_names())})")
        self.sample_extras: SampleExtras = (get_task(opts.task).load("sample") or SampleExtras)(opts)
        result, self.cache_path, self.cache_dir = scan_sources(sources, opts.nc, opts.prefix,
                                                               label_reader(opts.task, opts.task_options))
        self.sources = sources
        self._ignore: dict[str, np.ndarray] | None = None  # ignore regions by path, read when evaluation asks
        self.scan = result.summary()
        keep = np.flatnonzero(result.states != STATES.index("corrupt"))
        if not len(keep):
            raise DataError(f"{opts.prefix}no usable images in {sources}: all {len(result.im_files)} are corrupt "
                            "(see warnings)")
        keep = keep[:max(1, round(len(keep) * opts.fraction))]  # --fraction
        self.im_files = [result.im_files[i] for i in keep]
        self.read_files = [result.read_path(i) for i in keep]  # a repaired copy where the scan made one
        self.labels = [result.labels[i].copy() for i in keep]
        self.shapes = result.shapes[keep].astype(np.float64)  # (n, 2) w, h
        self.extras = None if result.extras is None else [  # per image, per object its extras (normalised)
            self.sample_extras.objects(result.labels[i], result.extras[i]) for i in keep]
        if self.extras is not None:
            self.collate_fn = self.collate_extras
        if opts.single_cls:
            for lab in self.labels:
                lab[:, 0] = 0
        self.batch_index, self.batch_shapes = None, None
        if opts.rect:
            self._sort_for_rect(opts.batch_size, opts.pad)
        self.label_files = img2label_paths(self.im_files)
        self.ram: SharedImages | None = None  # --cache ram: one shared copy per machine
        self.npy_cached = (self.cache_dir / "npy").is_dir()  # a --cache disk folder (of any run) to read from
        if opts.cache:
            self.cache_images("disk" if opts.cache == "disk" else "ram", opts.prefix)

    def _sort_for_rect(self, batch_size: int, pad: float) -> None:
        order = np.argsort(self.shapes[:, 1] / self.shapes[:, 0], kind="stable")
        self.im_files = [self.im_files[i] for i in order]
        self.read_files = [self.read_files[i] for i in order]
        self.labels = [self.labels[i] for i in order]
        if self.extras is not None:
            self.extras = [self.extras[i] for i in order]
        self.shapes = self.shapes[order]
        self.batch_index, self.batch_shapes = rect_batch_shapes(self.shapes, batch_size, self.img_size,
                                                                self.stride, pad)

    def __len__(self) -> int:
        return len(self.im_files)

    def batch_nbytes(self, batch_size: int) -> int:
        """Bytes of the largest batch of ``batch_size`` samples the collate builds: uint8 images of the largest
        letterbox (or mosaic) shape, and float32 targets for the most boxes a sample can carry (a mosaic with mixup
        holds eight images' boxes), plus a page per tensor."""
        h = w = self.img_size
        if self.rect:
            h, w = (int(v) for v in self.batch_shapes[np.argmax(self.batch_shapes.prod(1))])
        boxes = max((len(lab) for lab in self.labels), default=0) * (8 if self.mosaic else 1)
        extras = 0 if self.extras is None else self.sample_extras.sample_bytes(h, w, boxes)
        return batch_size * (3 * h * w + 6 * 4 * boxes + extras) + 2 * 4096

    def ignore_regions(self, path: str) -> np.ndarray:
        """Image ``path``'s crowd boxes / difficult objects, which evaluation ignores and training never sees:
        (r, 6) [cls, x1, y1, x2, y2, crowd] in the image's original pixels; parsed from the annotations on the
        first call (COCO and VOC splits without ``keep_crowd``; none for YOLO txt)."""
        if self._ignore is None:
            self._ignore = ignore_regions(self.sources, self.options.single_cls)
        return self._ignore.get(str(path), no_regions())

    def cache_images(self, kind: str, prefix: str = "") -> None:
        """``ram``: the resized images once per machine in shared memory, read by every local rank and worker
        (utils.data.ram_cache); ``disk``: decoded originals as ``.npy`` in the split's cache folder. All ranks must
        call it."""
        if kind == "ram":
            shapes = np.array([resized_shape((int(h), int(w)), self.img_size) for w, h in self.shapes], np.int64)
            key = hashlib.sha1(f"{self.im_files[0]}{len(self)}{self.img_size}".encode()).hexdigest()[:12]
            self.ram = build_shared(lambda i: self._decode_resized(i, shapes[i]), shapes, key)
            if self.ram is not None:  # None: no room here (build_shared said why), the images come from disk
                LOGGER.info(f"{prefix}Cached images to RAM, one shared copy per machine: "
                            f"{self.ram.nbytes / 1e9:.2f} GB")
            return
        self.npy_cached = True
        indices = list(range(dist.get_local_rank(), len(self), dist.get_local_world_size()))
        with ThreadPool(available_cores()) as pool:
            total = sum(pool.imap(self._save_npy, indices))
        LOGGER.info(f"{prefix}Cached images to disk ({self.cache_dir / 'npy'}): {total / 1e9:.2f} GB")

    def _npy_path(self, i: int) -> Path:
        return self.cache_dir / "npy" / copy_name(self.im_files[i], ".npy")

    def _save_npy(self, i: int) -> int:
        npy = self._npy_path(i)
        npy.parent.mkdir(parents=True, exist_ok=True)
        if not npy.exists() or npy.stat().st_mtime_ns < os.stat(self.im_files[i]).st_mtime_ns:
            img = self._read(i)
            tmp = npy.with_name(f"{npy.stem}.tmp{os.getpid()}.npy")
            np.save(tmp, img)
            os.replace(tmp, npy)
        return npy.stat().st_size

    def _read(self, i: int, reduce: int = 1) -> np.ndarray:
        """The original decoded image (BGR, EXIF orientation applied), from .npy when cached on disk (the folder is
        looked for once: without it no image pays for the path and its stat)."""
        if self.npy_cached:
            npy = self._npy_path(i)
            with contextlib.suppress(OSError):  # missing or older than the image: decode it
                if npy.stat().st_mtime_ns >= os.stat(self.im_files[i]).st_mtime_ns:
                    w, h = (int(v) for v in self.shapes[i])
                    if (cached := read_cached_array(npy, (h, w, 3))) is not None:  # else another array: decode
                        return cached
        try:
            return read_image(self.read_files[i], reduce)
        except ImageRefused as e:
            if self.read_files[i] == self.im_files[i]:
                raise DataError(f"{self.im_files[i]}: {e}") from None
        try:  # the repaired copy is gone: the original
            return read_image(self.im_files[i], reduce)
        except ImageRefused as e:
            raise DataError(f"{self.im_files[i]}: {e}") from None

    def load_image(self, i: int) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
        """Image i resized so its long side is ``img_size`` -> (img, (h0, w0), (h, w)); read-only when it comes
        from the RAM cache. A JPEG at least twice as large as that is decoded at a half, quarter or eighth of its
        sides first (utils.data.image_io.reduction)."""
        w0, h0 = (int(v) for v in self.shapes[i])
        if self.ram is not None:
            img = self.ram[i]
            return img, (h0, w0), img.shape[:2]
        img = self._read(i, reduce := reduction(max(h0, w0), self.img_size))
        if reduce == 1 or img.shape[:2] != (math.ceil(h0 / reduce), math.ceil(w0 / reduce)):
            h0, w0 = img.shape[:2]  # decoded whole (not a JPEG, or the disk cache's original)
        ratio = self.img_size / max(h0, w0)
        if ratio != 1:
            size = (min(math.ceil(w0 * ratio), self.img_size), min(math.ceil(h0 * ratio), self.img_size))
            img = cv2.resize(img, size, interpolation=self._interpolation(ratio))
        return img, (h0, w0), img.shape[:2]

    def _interpolation(self, ratio: float) -> int:
        return cv2.INTER_LINEAR if (self.augment or ratio > 1) else cv2.INTER_AREA

    def _decode_resized(self, i: int, shape_hw: Sequence[int]) -> np.ndarray:
        """Image i decoded and resized to exactly ``shape_hw`` (the RAM cache's slot for it)."""
        img = self._read(i)
        h, w = int(shape_hw[0]), int(shape_hw[1])
        if img.shape[:2] != (h, w):
            img = cv2.resize(img, (w, h), interpolation=self._interpolation(max(h, w) / max(img.shape[:2])))
        return img

    def load_mosaic(self, index: int, hsv: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, Any]:
        """Mosaic of image ``index`` and 3 random others, warped and cropped to img_size in one pass, with the
        colour change ``hsv`` (a utils.data.colour.HsvChange) applied when given: (image, labels (k, 5) [cls, x1,
        y1, x2, y2] pixels, the task's extras in pixels (None for boxes alone))."""
        indices = [index, *self._partners()]
        images, sizes = zip(*(self._mosaic_source(i) for i in indices))
        extras = None if self.extras is None else [self.sample_extras.prepare(self.extras[i]) for i in indices]
        return warp_mosaic_extras(images, [self.labels[i] for i in indices], extras, self.sample_extras,
                                  self.img_size, self.rng, sizes, **self._warp_hyp(), hsv=hsv)

    def __getitems__(self, keys: Sequence) -> list:
        """The samples of a batch (the DataLoader passes a batch's keys): with mosaics and without the RAM cache,
        their partners come from the batch's own images, each decoded once for the batch (utils.data.batch_pool;
        hyp ``mosaic_pool`` 0: from the whole set);
        without --rect each sample's pixels are written into its slot of the batch tensor (shared memory in a
        DataLoader worker), which collate_fn then hands on without a copy; with ``defer_colour`` the colour change
        is drawn but left to the training step (the samples' ``colour``: each image's gains)."""
        if not keys:
            return []
        if self.mosaic and self.ram is None and self.pool_size:
            first = keys[0]
            self.pool = BatchPool([k[0] if isinstance(k, tuple) else k for k in keys], len(self),
                                  first[1] if isinstance(first, tuple) else None, self.pool_size)
        batch = None if self.rect else new_batch((len(keys), 3, self.img_size, self.img_size), self.ring)
        samples = BatchSamples()
        self.later = [] if self.colour_later else None
        try:
            for j, key in enumerate(keys):
                self.slot = None if batch is None else batch[j]
                samples.append(self[key])
            if self.later:
                samples.colour = torch.tensor(self.later, dtype=torch.float32)
            return samples
        finally:
            self.pool = self.slot = self.later = None

    def _partners(self) -> list[int]:
        """A mosaic's 3 other images: from the batch's pool while a batch is built, else from the whole set."""
        if self.pool is None:
            return self.rng.integers(0, len(self), 3).tolist()
        return self.pool.partners(self.rng)

    def _mosaic_source(self, i: int) -> tuple[np.ndarray, tuple[int, int]]:
        """Image i for a mosaic and the (h, w) it takes there (load_image's size): the decoded original when
        load_image would only enlarge it, since the mosaic's warp enlarges it anyway; else load_image's. Kept in
        the batch's pool while a batch is built."""
        if self.pool is not None and (held := self.pool.get(i)) is not None:
            return held
        if self.ram is None and max(self.shapes[i]) < self.img_size:
            img = self._read(i)
            hw = resized_shape(img.shape[:2], self.img_size)
        else:
            img = self.load_image(i)[0]
            hw = img.shape[:2]
        if self.pool is not None:
            self.pool.put(i, img, hw)
        return img, hw

    def _warp_hyp(self) -> dict[str, float]:
        return {k: self.hyp.get(k, 0.0) for k in ("degrees", "translate", "scale", "shear", "perspective")}

    def _letterbox(self, index: int) -> tuple[np.ndarray, tuple[float, float, float, float], tuple]:
        """Image ``index`` letterboxed -> (img, its place (width, height, pad_x, pad_y) of the loaded image in it,
        shapes ((h0, w0), (ratios, pads)) of the load resize times the letterbox)."""
        img, (h0, w0), (h, w) = self.load_image(index)
        shape = self.batch_shapes[self.batch_index[index]] if self.rect else self.img_size
        img, ratio, pad = letterbox(img, tuple(shape) if self.rect else shape, auto=False, scaleup=self.augment)
        return img, (ratio[0] * w, ratio[1] * h, pad[0], pad[1]), ((h0, w0), ((h * ratio[1] / h0, w * ratio[0] / w0),
                                                                              pad))

    def __getitem__(self, index: int | tuple[int, tuple[int, ...]]) -> Sample | TaskSample:
        """Sample ``index``; ``(index, key)`` (from the training sampler) first seeds the augmentation from key. One
        pipeline for every task: each geometric step moves the task's extras with the boxes (``sample_extras``)."""
        if isinstance(index, tuple):
            index, key = index
            self.seed_sample(key)
        hyp, rng, geometry = self.hyp, self.rng, self.sample_extras
        hsv = draw_hsv(rng, *hsv_gains(hyp)) if self.augment else None
        later = self.later is not None  # the batch carries the change to the training step (__getitems__)
        if self.mosaic and rng.random() < hyp.get("mosaic", 0):
            shapes, mix = None, rng.random() < hyp.get("mixup", 0)
            in_tiles = None if mix or later else hsv  # coloured in the mosaic's tiles, where it costs least
            img, labels, extras = self.load_mosaic(index, in_tiles)
            if mix:
                other = int(rng.integers(0, len(self))) if self.pool is None else self.pool.partners(rng, 1)[0]
                img2, labels2, extras2 = self.load_mosaic(other)
                img, labels = mixup(img, labels, img2, labels2, rng)
                extras = geometry.join(extras, extras2)
            hsv = None if in_tiles is not None else hsv
            img, labels, extras = geometry.paste(img, labels, extras, hyp, rng)
        else:
            img, place, shapes = self._letterbox(index)
            labels = self.labels[index].copy()
            labels[:, 1:] = xywhn2xyxy(labels[:, 1:], *place)
            extras = None if self.extras is None else geometry.place(geometry.prepare(self.extras[index]), *place)
            if self.augment:
                img, labels, extras = random_perspective_extras(img, labels, extras, geometry, rng,
                                                                **self._warp_hyp())
        if hsv is not None and later:
            self.later.append(hsv.gains)  # the training step applies it (utils.data.colour.recolour)
        elif hsv is not None:
            apply_hsv(img, hsv)
        labels[:, 1:] = xyxy2xywhn(labels[:, 1:], img.shape[1], img.shape[0], clip=True)
        extras = geometry.normalize(extras, img.shape[1], img.shape[0])
        if self.augment:
            if rng.random() < hyp.get("flipud", 0):
                (img, labels), extras = flip_ud(img, labels), geometry.flip_ud(extras)
            if rng.random() < hyp.get("fliplr", 0):
                (img, labels), extras = flip_lr(img, labels), geometry.flip_lr(extras)
        targets = np.zeros((len(labels), 6), np.float32)  # numpy, then one tensor: 4x faster than torch's ops here
        targets[:, 1:] = labels
        sample = (bgr_to_chw_rgb(img, self.slot), torch.from_numpy(targets), self.im_files[index], shapes)
        return Sample(*sample) if self.extras is None else TaskSample(*sample, extras)

    def collate_extras(self, batch: Sequence[tuple]) -> TaskBatch:
        """``collate_fn`` of TaskSamples: the task's SampleExtras collates their extras (for the batch's size) and
        may reorder each sample's targets; then the plain collate, with the extras by name as a fifth item."""
        height, width = max(s[0].shape[1] for s in batch), max(s[0].shape[2] for s in batch)
        samples, extras = self.sample_extras.collate(batch, height, width, self.augment)
        if (colour := getattr(batch, "colour", None)) is not None:
            extras[COLOUR_KEY] = colour
        return TaskBatch(*YoloDataset.collate_fn(samples), extras)

    def seed_sample(self, key: Sequence[int]) -> None:
        """Seed the augmentation of the next sample from (seed, epoch, position in the epoch)."""
        self.rng = np.random.default_rng([self.seed, *key])

    def reseed(self, seed: int) -> None:
        """A fresh augmentation stream (called per worker with a seed unique to rank and worker)."""
        self.rng = np.random.default_rng(seed)

    def collate_quad(self, batch: Sequence[tuple]) -> Batch:
        """--quad: every 4 samples become one image of twice the size: the first one upscaled 2x, or the four
        tiled 2 x 2 (by a draw from the last sample's seeded stream, so a resumed run repeats it)."""
        if self.extras is not None:
            raise DataError(f"--quad is for detection data; a {self.options.task} data set's batches keep their size")
        if getattr(batch, "colour", None) is not None:
            raise DataError("--quad tiles 4 images into one: their colour change cannot wait for the training step "
                            "(--colour-on loader)")
        imgs, targets, paths, shapes = self.collate_fn(batch)
        imgs = imgs.contiguous()  # NCHW: the 2x upscale below then rounds exactly as it always did
        if len(imgs) % 4:
            raise DataError(f"--quad needs a batch per rank divisible by 4, got {len(imgs)}")
        out, labels = [], []
        for q in range(len(imgs) // 4):
            group = targets[(targets[:, 0] >= 4 * q) & (targets[:, 0] < 4 * q + 4)].clone()
            if self.rng.random() < 0.5:
                big = torch.nn.functional.interpolate(imgs[4 * q:4 * q + 1].float(), scale_factor=2.0,
                                                      mode="bilinear", align_corners=False).round().to(torch.uint8)
                group = group[group[:, 0] == 4 * q]
            else:
                top = torch.cat((imgs[4 * q], imgs[4 * q + 1]), 2)
                big = torch.cat((top, torch.cat((imgs[4 * q + 2], imgs[4 * q + 3]), 2)), 1)[None]
                slot = group[:, 0] - 4 * q  # 0 1 / 2 3
                group[:, 2] = group[:, 2] / 2 + (slot % 2) * 0.5
                group[:, 3] = group[:, 3] / 2 + (slot // 2) * 0.5
                group[:, 4:6] /= 2
            group[:, 0] = q
            out.append(big[0])
            labels.append(group)
        return Batch(torch.stack(out), torch.cat(labels, 0), paths[::4], shapes[::4])

    @staticmethod
    def collate_fn(batch: Sequence[tuple]) -> Batch | TaskBatch:
        """Stack images (padding to the largest h, w when they differ) and index targets by image; samples whose
        colour change waits for the training step (BatchSamples.colour) make a TaskBatch carrying it."""
        imgs, targets, paths, shapes = zip(*batch)
        height, width = max(i.shape[1] for i in imgs), max(i.shape[2] for i in imgs)
        out = slots_batch(imgs)
        if out is None:
            out = new_batch((len(imgs), 3, height, width))
            if any(i.shape[1:] != (height, width) for i in imgs):
                out.fill_(114)
            # numpy's single-threaded copy (torch's threads only slow it), through (h, w, c) views of the NHWC
            # memory: a copy in memory order, 2x faster than through the (c, h, w) views
            pixels = out.permute(0, 2, 3, 1).numpy()
            for i, img in enumerate(imgs):
                pixels[i, :img.shape[1], :img.shape[2]] = img.permute(1, 2, 0).numpy()
        for i, (img, t) in enumerate(zip(imgs, targets)):
            t[:, 0] = i
            if img.shape[1:] != (height, width):  # padding on the right/bottom keeps pixel positions
                t[:, [2, 4]] *= img.shape[2] / width
                t[:, [3, 5]] *= img.shape[1] / height
        if (colour := getattr(batch, "colour", None)) is not None:
            return TaskBatch(out, torch.cat(targets, 0), paths, shapes, {COLOUR_KEY: colour})
        return Batch(out, torch.cat(targets, 0), paths, shapes)
