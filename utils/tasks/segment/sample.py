"""What a segment sample carries beside its boxes, from the scan to the batch (the segment task's ``sample`` part):
each object's outline, resampled to RESAMPLE_POINTS for augmentation and moved with its box (OutlineGeometry),
then collated into the masks the loss reads and, for validation, the outlines the mask metric fills.

A row of a segment split that is a box alone (``class cx cy w h``) stands for the box's outline (its corners).
``task_options`` of the data set's options: ``overlap_mask`` (default True: one index image per image; else one
mask per object) and ``mask_ratio`` (default 4: masks at the prototypes' 1/4 of the input's resolution).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from utils.data.samples import DatasetOptions, SampleExtras
from utils.tasks.segment.augment import RESAMPLE_POINTS, OutlineGeometry, resample_polygons
from utils.tasks.segment.masks import overlap_index, polygons_to_masks


def box_outline(row: np.ndarray) -> np.ndarray:
    """The outline of an object labelled by its box alone (a 5-column row in a segment data set): the box's
    corners (4, 2), normalised as the row [cls, cx, cy, w, h]."""
    _, cx, cy, w, h = (float(v) for v in row)
    x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    return np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float32)


class Outlines(OutlineGeometry, SampleExtras):
    """The segment task's SampleExtras: outlines through the augmentations, masks in the batch."""

    def __init__(self, options: DatasetOptions) -> None:
        super().__init__(options)
        self.overlap = bool(options.task_options.get("overlap_mask", True))
        self.ratio = int(options.task_options.get("mask_ratio", 4))

    def objects(self, labels: np.ndarray, points: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Per object its outline (normalised): its own, or its box's corners for a box row."""
        return [box_outline(row) if outline is None else outline for row, outline in zip(labels, points)]

    def prepare(self, objects: Sequence[np.ndarray]) -> np.ndarray:
        """An image's outlines, normalised, resampled to (k, RESAMPLE_POINTS, 2) for augmentation."""
        return resample_polygons(objects, RESAMPLE_POINTS)

    def sample_bytes(self, height: int, width: int, boxes: int) -> int:
        """A sample's masks: one int32 index image, or one mask per object, at 1/ratio of the size."""
        return 4 * height * width // self.ratio ** 2 * (1 if self.overlap else boxes)

    def collate(self, samples: Sequence[tuple], height: int, width: int,
                augment: bool) -> tuple[list[tuple], dict]:
        """The batch's ``masks`` at 1/ratio of its size (overlap: one index image per image (b, h, w), object r of
        an image the pixels equal to r + 1, the smaller object on top, its targets put in that order; else one 0/1
        mask per target (n, h, w)); without augmentation (validation) also ``outlines``, per image its objects'
        outlines (k, n, 2) normalised to the batch's size, in the targets' order."""
        plain, masks, outlines = [], [], []
        for img, targets, path, shapes, polygons in samples:
            pixels = polygons * np.array([img.shape[2], img.shape[1]], np.float32)
            if self.overlap:
                index, order = overlap_index(list(pixels), (height, width), self.ratio)
                targets, pixels = targets[torch.from_numpy(order)], pixels[order]
                masks.append(torch.from_numpy(index))
            else:
                masks.append(torch.from_numpy(polygons_to_masks(list(pixels), (height, width), self.ratio)))
            outlines.append(pixels / np.array([width, height], np.float32))
            plain.append((img, targets, path, shapes))
        if self.overlap and any(m.dtype != torch.uint8 for m in masks):
            masks = [m.to(torch.int32) for m in masks]
        extras = {"masks": torch.stack(masks) if self.overlap else torch.cat(masks)}
        if not augment:
            extras["outlines"] = outlines
        return plain, extras
