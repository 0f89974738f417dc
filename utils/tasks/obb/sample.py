"""What an oriented-box sample carries beside its boxes, from the scan to the batch (the obb task's ``sample``
part): each object's four corners, moved with its box by every augmentation (CornerGeometry), then collated into
the rotated boxes the loss reads and, for validation, the corners the metric reads.

A batch's ``rboxes`` (n, 5) [cx, cy, w, h, r], in the targets' order, are the minimum-area rectangles of the
corners, found in the batch's pixels (so an image that is not square keeps its angles), then normalised to the
batch's size: x and w by its width, y and h by its height (the loss multiplies back the same way); the angle in
radians, in [0, pi/2) (utils.tasks.obb.rotated.corners2xywhr). Without augmentation (validation) the batch also
holds ``quads``: per image its objects' corners (k, 4, 2) normalised to the batch's size, in the targets' order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from utils.data.samples import SampleExtras
from utils.tasks.obb.augment import CornerGeometry
from utils.tasks.obb.rotated import corners2xywhr


def rotated_boxes(corners: np.ndarray, width: float, height: float) -> torch.Tensor:
    """(k, 4, 2) corners in pixels -> (k, 5) float32 rectangles [cx, cy, w, h, r] normalised to ``width`` x
    ``height`` (see the module docstring)."""
    if not len(corners):
        return torch.zeros((0, 5))
    boxes = corners2xywhr(torch.from_numpy(np.asarray(corners, np.float64)))
    return (boxes / boxes.new_tensor([width, height, width, height, 1.0])).float()


class Corners(CornerGeometry, SampleExtras):
    """The obb task's SampleExtras: corners through the augmentations, rotated boxes in the batch."""

    def prepare(self, objects: Sequence[np.ndarray]) -> np.ndarray:
        """An image's corners (k, 4, 2) normalised, one array in the labels' order."""
        return np.stack(objects).astype(np.float32) if len(objects) else np.zeros((0, 4, 2), np.float32)

    def sample_bytes(self, height: int, width: int, boxes: int) -> int:
        return 4 * 5 * boxes

    def collate(self, samples: Sequence[tuple], height: int, width: int,
                augment: bool) -> tuple[list[tuple], dict[str, Any]]:
        plain, rboxes, quads = [], [], []
        for img, targets, path, shapes, corners in samples:
            pixels = np.asarray(corners, np.float32).reshape(-1, 4, 2) * np.array([img.shape[2], img.shape[1]],
                                                                                   np.float32)
            rboxes.append(rotated_boxes(pixels, width, height))
            quads.append(pixels / np.array([width, height], np.float32))
            plain.append((img, targets, path, shapes))
        extras: dict[str, Any] = {"rboxes": torch.cat(rboxes) if rboxes else torch.zeros((0, 5))}
        if not augment:
            extras["quads"] = quads
        return plain, extras
