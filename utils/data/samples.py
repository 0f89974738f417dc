"""What the data set gives and the loader batches: the options a split is loaded with (DatasetOptions), one image's
Sample (a TaskSample for a task whose objects carry more than their box), collated Batches, and a task's
SampleExtras: what its samples carry beside the boxes, from the scan to the batch (utils/tasks/registry.py, a
task's ``sample`` part)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from utils.data.augment import Geometry
from utils.data.batch_memory import pinned
from utils.tasks.registry import BASE_TASK


@dataclass
class DatasetOptions:
    """How a split is loaded: size, batch geometry for --rect, augmentation, caching, classes."""

    img_size: int = 640
    batch_size: int = 16  # images per --rect shape group (the total over ranks for a sharded loader)
    augment: bool = False
    hyp: dict | None = None  # augmentation hyperparameters (the scratch hyps when augmenting without them)
    rect: bool = False
    stride: int = 32
    pad: float = 0.0
    cache: str | None = None  # 'ram' | 'disk' | None
    single_cls: bool = False
    prefix: str = ""  # log prefix, e.g. 'train: '
    nc: int | None = None  # class count the labels are checked against
    seed: int = 0
    names: Sequence[str] | None = None
    task: str = BASE_TASK  # a registered task: what its samples carry beside the boxes, and its batches
    task_options: dict = field(default_factory=dict)  # a task's own settings, read by its sample part
    fraction: float = 1.0  # the share of the split's images kept (the first ones, in file order; at least one)
    defer_colour: bool = False  # augmenting: the HSV change drawn, left to the training step (utils.data.colour)


class Sample(NamedTuple):
    """One image as the data set gives it (a tuple with names: ``img, targets, path, shapes = sample`` works)."""

    image: torch.Tensor  # uint8 (3, h, w) RGB over HWC memory
    targets: torch.Tensor  # float32 (k, 6) [0, class, cx, cy, w, h] normalised to ``image``
    path: str
    shapes: tuple | None  # ((h0, w0), ((ratio_h, ratio_w), (pad_w, pad_h))) of the letterbox; None after mosaic


class TaskSample(NamedTuple):
    """A Sample of a task whose objects carry more than their box: also their ``extras``, moved with the boxes
    by every augmentation (the task's SampleExtras says what they are)."""

    image: torch.Tensor
    targets: torch.Tensor
    path: str
    shapes: tuple | None
    extras: Any  # per object, in the targets' order, normalised to ``image`` (a segmenter's outlines (k, n, 2))


class BatchSamples(list):
    """A batch's samples as the data set builds them (YoloDataset.__getitems__), with what the batch carries as a
    whole: ``colour``, its images' HSV gains (b, 3) when their colour change waits for the training step."""

    colour: torch.Tensor | None = None


class Batch(NamedTuple):
    """Collated samples: images (b, 3, h, w) uint8, targets (n, 6) [image, class, cx, cy, w, h], paths, shapes."""

    images: torch.Tensor
    targets: torch.Tensor
    paths: tuple
    shapes: tuple

    def pin_memory(self, device: Any = None) -> Batch:
        """The batch in pinned memory (torch's DataLoader calls it for CUDA), its images handed back to their worker
        once copied (utils.data.batch_memory.pinned)."""
        return pinned(self)


class TaskBatch(NamedTuple):
    """A Batch of TaskSamples with the task's ``extras`` by name: tensors for its loss and, for validation, what
    its metric reads (YoloDataset.collate_extras, SampleExtras.collate)."""

    images: torch.Tensor
    targets: torch.Tensor
    paths: tuple
    shapes: tuple
    extras: dict

    def pin_memory(self, device: Any = None) -> TaskBatch:
        """As Batch.pin_memory, the extras' tensors too."""
        return pinned(self)


class SampleExtras(Geometry):
    """What a task's samples carry beside the boxes, from the scan to the batch (the base task's carries nothing):
    per image its objects' extras as the scan read them, completed (``objects``: what a box-only row of its labels
    stands for), made one array in the labels' order for augmentation (``prepare``), moved by the Geometry's steps,
    and collated (``collate``: the samples, reordered as the extras need, and the batch's extras by name: tensors
    for the task's loss, and without augmentation what its metric reads); ``sample_bytes`` is what one collated
    sample's extras take. A task's subclass is its ``sample`` part (utils/tasks/registry.py)."""

    def __init__(self, options: DatasetOptions) -> None:
        self.options = options

    def objects(self, labels: np.ndarray, points: Sequence[np.ndarray | None]) -> list:
        return list(points)

    def prepare(self, objects: Sequence[Any]) -> Any:
        return None

    def collate(self, samples: Sequence[tuple], height: int, width: int,
                augment: bool) -> tuple[list[tuple], dict[str, Any]]:
        return [tuple(s[:4]) for s in samples], {}

    def sample_bytes(self, height: int, width: int, boxes: int) -> int:
        return 0
