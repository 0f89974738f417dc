"""What a pose sample carries beside its boxes, from the scan to the batch (the pose task's ``sample`` part): each
object's keypoints, moved with its box by the one sample pipeline (KeypointGeometry, utils/tasks/pose/augment.py),
then collated for the loss and the metric.

``task_options`` of the data set's options are its data YAML's ``kpt_shape``, ``flip_idx`` and ``kpt_sigmas``
(utils/tasks/pose/labels.py, ``keypoint_spec``). A batch gets, by name:

- ``keypoints`` (n, K, 3) float32: the targets' objects' keypoints in the targets' order, x and y normalised to the
  batch's size (as the targets' boxes are), v as labelled (0: unlabelled);
- ``kpt_sigmas`` (K,): the data set's OKS sigmas, which the loss weighs keypoints by and the metric scores with;
- without augmentation (validation), ``keypoint_labels``: per image its objects' (m, K + 1, 3) arrays (keypoints
  normalised to the batch's size, then the area-share row), in its targets' order, for the metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from utils.data.errors import DataError
from utils.data.samples import DatasetOptions, SampleExtras
from utils.log import LOGGER
from utils.tasks.pose.augment import KeypointGeometry
from utils.tasks.pose.labels import keypoint_spec, with_area


class Keypoints(KeypointGeometry, SampleExtras):
    """The pose task's SampleExtras (see the module docstring)."""

    def __init__(self, options: DatasetOptions) -> None:
        SampleExtras.__init__(self, options)
        spec = keypoint_spec(options.task_options)
        if spec is None:
            raise DataError("a pose data set needs 'kpt_shape: [keypoints, 2 or 3]' in its data YAML")
        KeypointGeometry.__init__(self, spec.flip_index)
        self.spec = spec
        self.sigmas = torch.tensor(spec.sigmas, dtype=torch.float32)
        if options.augment and spec.flip_index is None and (options.hyp or {}).get("fliplr", 0) > 0:
            LOGGER.warning(f"{options.prefix}WARNING: the data YAML gives no flip_idx: a left-right flip mirrors each "
                           "keypoint in its own place (add flip_idx when keypoints come in left/right pairs)")

    def objects(self, labels: np.ndarray, points: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Per object its (K + 1, 3) array (an object the labels gave no keypoints: all unlabelled)."""
        empty = np.zeros((self.spec.count, 3), np.float32)
        return [with_area(empty) if p is None else np.asarray(p, np.float32) for p in points]

    def prepare(self, objects: Sequence[np.ndarray]) -> np.ndarray:
        """An image's objects as one (k, K + 1, 3) array, normalised."""
        if not len(objects):
            return np.zeros((0, self.spec.count + 1, 3), np.float32)
        return np.stack(objects).astype(np.float32)

    def sample_bytes(self, height: int, width: int, boxes: int) -> int:
        return 4 * 3 * (self.spec.count + 1) * boxes

    def collate(self, samples: Sequence[tuple], height: int, width: int,
                augment: bool) -> tuple[list[tuple], dict[str, Any]]:
        """The batch's ``keypoints``, ``kpt_sigmas`` and, without augmentation, ``keypoint_labels`` (see the module
        docstring); a sample smaller than the batch is padded right and bottom, so its positions scale by its share
        of the batch's size."""
        plain, scaled = [], []
        for img, targets, path, shapes, objects in samples:
            factor = np.array([img.shape[2] / width, img.shape[1] / height, 1.0], np.float32)
            moved = objects.astype(np.float32, copy=True)
            moved[:, :-1] *= factor
            scaled.append(moved)
            plain.append((img, targets, path, shapes))
        joined = np.concatenate(scaled) if scaled else np.zeros((0, self.spec.count + 1, 3), np.float32)
        extras: dict[str, Any] = {"keypoints": torch.from_numpy(np.ascontiguousarray(joined[:, :-1])),
                                  "kpt_sigmas": self.sigmas.clone()}
        if not augment:
            extras["keypoint_labels"] = scaled
        return plain, extras
