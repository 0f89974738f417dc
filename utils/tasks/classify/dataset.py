"""The classify task's data set (its ``dataset`` part, built as utils.data.datasets.YoloDataset is): ImageNet-style
class folders (utils/tasks/classify/folders.py) made into samples the shared loader, trainer and evaluation take.

Each image is one sample of the shared form (utils.data.samples.Sample): the image, RGB uint8 (3, size, size) after
the classification augmentation (random resized crop, flips, colour jitter) or, without augmentation, after the
resize and centre crop (utils/tasks/classify/augment.py); its target one row [0, class, 0.5, 0.5, 1, 1] (the class
of the whole image), so the shared collate, the training-batch plots and --image-weights read it as they read boxes;
its path; no letterbox (``shapes`` None). The classes are the data YAML's names, in its order; a split's class
folder that is not among them is refused in one line. Sources may also be image files (a sample of a split): each
is of the class its folder is named after. ``--fraction`` keeps the first share of each class's images (every class
stays, as the validation split has them all). Every image's header is checked once when the set is built:
an unreadable one is left out and counted (``N found, C corrupt``), as the label scan counts boxes' images.

``--cache ram`` keeps every image decoded (its shorter side at the training size, as the crops need) once per
machine in shared memory (utils/data/ram_cache.py); ``--cache disk`` is read as ``ram`` here (class folders hold
no cache of ours).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from utils.data.datasets import YoloDataset, bgr_to_chw_rgb
from utils.data.errors import DataError
from utils.data.image_io import ImageRefused, read_image
from utils.data.label_cache import check_image
from utils.data.ram_cache import SharedImages, build_shared
from utils.data.samples import DatasetOptions, Sample
from utils.device import available_cores
from utils.distributed import comm as dist
from utils.hyp import load_hyp
from utils.log import LOGGER
from utils.tasks.classify.augment import train_transform, val_transform
from utils.tasks.classify.folders import ClassSplit, listed_split, scan_split, summary

WHOLE_IMAGE = (0.5, 0.5, 1.0, 1.0)  # a target row's box: the class is the whole image's


def _checked(path: Path) -> tuple[tuple[int, int] | None, str]:
    """((w, h) or None, why) of one image's header (utils.data.label_cache.check_image's checks)."""
    try:
        return check_image(str(path))[0], ""
    except (ValueError, OSError, OverflowError, TypeError) as e:
        return None, str(e)


def first_of_each_class(classes: np.ndarray, fraction: float) -> np.ndarray:
    """Indices of the first max(1, round(n x ``fraction``)) images of each class (n: the class's images), in order."""
    kept = [np.flatnonzero(classes == c) for c in np.unique(classes)]
    return np.sort(np.concatenate([k[:max(1, round(len(k) * fraction))] for k in kept]))


class ClassFolders(torch.utils.data.Dataset):
    """Class-folder images as samples (see the module docstring)."""

    mosaic = False  # no mosaic to close in the last epochs

    def __init__(self, sources: str | Path | Sequence[str | Path], options: DatasetOptions | None = None,
                 **overrides: Any) -> None:
        opts = replace(options or DatasetOptions(), **overrides)
        self.options, self.img_size, self.augment = opts, opts.img_size, opts.augment
        self.hyp = dict(load_hyp() if opts.hyp is None and opts.augment else opts.hyp or {})
        self.seed, self.rng = opts.seed, np.random.default_rng([opts.seed, dist.get_rank()])
        items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
        paths = [Path(s) for s in items]
        is_file = [path.is_file() for path in paths]
        listed = [path for path, file in zip(paths, is_file) if file]  # images named one by one: see listed_split
        splits = [scan_split(path, opts.names) for path, file in zip(paths, is_file) if not file]
        if listed:
            names = opts.names if opts.names is not None else splits[0].names if splits else None
            if names is None:
                raise DataError(f"{opts.prefix}{listed[0]}: images listed one by one need the data's class names")
            splits.append(listed_split(listed, names))
        self.names = list(splits[0].names)
        if opts.nc is not None and len(self.names) != opts.nc:
            raise DataError(f"{opts.prefix}{items[0]}: {len(self.names)} classes but the data YAML's nc is {opts.nc}")
        self.im_files, classes = self._usable(splits, opts.prefix)
        if opts.fraction < 1:  # --fraction: the first share of each class's images, so every class stays
            keep = first_of_each_class(np.asarray(classes, np.int64), opts.fraction)
            self.im_files, classes = [self.im_files[i] for i in keep], [classes[i] for i in keep]
            self.shapes = self.shapes[keep]
        self.classes = np.array([0 if opts.single_cls else c for c in classes], np.int64)
        self.labels = [np.array([[c, *WHOLE_IMAGE]], np.float32) for c in self.classes]
        self.ram: SharedImages | None = None
        self.collate_fn = YoloDataset.collate_fn

    def _usable(self, splits: Sequence[ClassSplit], prefix: str) -> tuple[list[str], list[int]]:
        """Every split's images whose header reads, with their classes; the scan's summary line, and a warning
        naming the first unreadable image."""
        files = [(str(s.root / f), int(c)) for s in splits for f, c in zip(s.files, s.labels)]
        with ThreadPool(max(available_cores(), 1)) as pool:
            checked = pool.map(_checked, [Path(f) for f, _ in files], chunksize=64)
        self.shapes = np.array([wh for wh, _ in checked if wh is not None], np.float64).reshape(-1, 2)  # (n, 2) w, h
        kept = [(f, c) for (f, c), (wh, _) in zip(files, checked) if wh is not None]
        corrupt = [(f, why) for (f, _), (wh, why) in zip(files, checked) if wh is None]
        LOGGER.info(f"{prefix}{'; '.join(summary(s) for s in splits)}: {len(kept)} found, {len(corrupt)} corrupt")
        if corrupt:
            LOGGER.warning(f"{prefix}WARNING: {len(corrupt)} unreadable images left out, e.g. {corrupt[0][0]}: "
                           f"{corrupt[0][1][:120]}")
        if not kept:
            raise DataError(f"{prefix}no usable images in {', '.join(str(s.root) for s in splits)}: all "
                            f"{len(files)} are corrupt (see warnings)")
        return [f for f, _ in kept], [c for _, c in kept]

    def __len__(self) -> int:
        return len(self.im_files)

    def batch_nbytes(self, batch_size: int) -> int:
        """Bytes of a collated batch: uint8 images and one float32 target row each, plus a page per tensor."""
        return batch_size * (3 * self.img_size ** 2 + 6 * 4) + 2 * 4096

    def _cached_shape(self, i: int) -> tuple[int, int]:
        """(h, w) of image i in the RAM cache: its shorter side the training size (never enlarged)."""
        w, h = (int(v) for v in self.shapes[i])
        scale = min(self.img_size / min(w, h), 1.0)
        return max(round(h * scale), 1), max(round(w * scale), 1)

    def cache_images(self, kind: str, prefix: str = "") -> None:
        """Every image decoded once per machine into shared memory (see the module docstring). All ranks must call
        it."""
        shapes = np.array([self._cached_shape(i) for i in range(len(self))], np.int64)
        key = hashlib.sha1(f"cls{self.im_files[0]}{len(self)}{self.img_size}".encode()).hexdigest()[:12]
        self.ram = build_shared(lambda i: cv2.resize(self._read(i), (int(shapes[i][1]), int(shapes[i][0])),
                                                     interpolation=cv2.INTER_AREA), shapes, key)
        if self.ram is not None:
            LOGGER.info(f"{prefix}Cached images to RAM, one shared copy per machine: {self.ram.nbytes / 1e9:.2f} GB"
                        f"{' (--cache disk reads as ram for class folders)' if kind == 'disk' else ''}")

    def _read(self, i: int) -> np.ndarray:
        if self.ram is not None:
            return self.ram[i]
        try:
            return read_image(self.im_files[i])
        except ImageRefused as e:
            raise DataError(f"{self.im_files[i]}: {e}") from None

    def __getitem__(self, index: int | tuple[int, tuple[int, ...]]) -> Sample:
        if isinstance(index, tuple):
            index, key = index
            self.seed_sample(key)
        img = self._read(index)
        img = train_transform(img, self.img_size, self.rng, self.hyp) if self.augment else \
            val_transform(img, self.img_size)
        targets = torch.tensor([[0, float(self.classes[index]), *WHOLE_IMAGE]], dtype=torch.float32)
        return Sample(bgr_to_chw_rgb(np.ascontiguousarray(img)), targets, self.im_files[index], None)

    def seed_sample(self, key: Sequence[int]) -> None:
        """Seed the augmentation of the next sample from (seed, epoch, position in the epoch)."""
        self.rng = np.random.default_rng([self.seed, *key])

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    @property
    def collate_quad(self) -> Any:
        """--quad is refused when the loader is built (a property: asked for, it says why in one line)."""
        raise DataError("--quad tiles four images into one of twice the size; a classifier's images keep theirs")


def class_indices(targets: torch.Tensor) -> torch.Tensor:
    """A batch's target rows [image, class, ...] -> (b,) class indices in image order."""
    return targets[targets[:, 0].argsort(stable=True), 1].long()

