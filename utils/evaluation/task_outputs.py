"""What a task's predictions hold beyond the boxes, per image, for detect.py, the hub model and the trackers: a
task's ``predict`` part (utils/tasks/registry.py); the base task's holds nothing.

``fit_input`` makes an image the model's input (the base task letterboxes it; a classifier crops it); ``image``
makes one image's results in its original pixels from the model's other outputs (a segmenter's masks from its
prototypes and the rows' coefficients); ``summary`` is what detect.run's result keeps per frame (a segmenter's
outlines); ``draw`` paints the results under the boxes; ``label_rows`` writes --save-txt's rows (None: the boxes'
YOLO rows); ``deaugment`` moves a test-time augmentation pass's task columns back to the input's frame
(utils/evaluation/tta.py), for a task that can (``deaugments``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from utils.data.sources import letterbox_fit, letterbox_shape
from utils.tasks.registry import get_task


class TaskOutputs:
    """The base task's: nothing beyond the boxes (see the module docstring)."""

    deaugments = False  # whether ``deaugment`` moves its task's columns (else --augment is refused for them)

    def fit_input(self, image: np.ndarray, size: int | tuple[int, int], stride: int = 32,
                  auto: bool = True) -> tuple[np.ndarray, tuple]:
        """An (h0, w0, 3) image as the model reads it, (h, w, 3) in the same channel order, and its ratio_pad for
        utils.boxes.scale_boxes; detect.py, the hub model and --int8's calibration fit images with it. The base
        task's: letterboxed (utils.data.sources.letterbox_fit)."""
        return letterbox_fit(image, size, stride, auto)

    def input_shape(self, shapes: Sequence[tuple[int, int]], size: int, stride: int = 32) -> tuple[int, int]:
        """The (h, w) input of one batch of images of (h0, w0) ``shapes`` at ``size`` (the hub model's batch), each
        then fitted by ``fit_input``. The base task's holds every image letterboxed with its longest side ``size``
        (utils.data.sources.letterbox_shape)."""
        return letterbox_shape(shapes, size, stride)

    def image(self, rows: torch.Tensor, outputs: tuple, index: int, input_hw: tuple[int, int],
              boxes0: torch.Tensor, shape0: tuple[int, int], ratio_pad: Any, native: bool = False) -> dict[str, Any]:
        """Image ``index``'s results: ``rows`` its post-processed detections (k, 6 + extra) in input pixels,
        ``outputs`` the model's other outputs for the batch, ``boxes0`` (k, 4) the boxes in the original image of
        (h0, w0) ``shape0``, placed in the input by ``ratio_pad``; ``native``: made at the original resolution
        (detect.py --retina-masks)."""
        return {}

    def summary(self, results: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def draw(self, img_bgr: np.ndarray, det: np.ndarray, results: Mapping[str, Any]) -> np.ndarray:
        return img_bgr

    def draw_labelled(self, img_bgr: np.ndarray, det: np.ndarray, results: Mapping[str, Any],
                      names: Sequence[str] | None, line_thickness: int, hide_labels: bool,
                      hide_conf: bool) -> np.ndarray | None:
        return None

    def describe(self, det: np.ndarray, results: Mapping[str, Any], names: Sequence[str] | None) -> str | None:
        return None

    def label_rows(self, det: np.ndarray, results: Mapping[str, Any], shape: tuple[int, int],
                   save_conf: bool) -> list[str] | None:
        return None

    def deaugment(self, rows: torch.Tensor, contract: Any, scale_xy: tuple[float, float], flip: bool, width: int,
                  head: Mapping[str, Any]) -> torch.Tensor:
        """A pass's rows (b, n, columns), boxes already back in the input's frame, with the task's columns moved back
        too: divided by the pass's ``scale_xy``, mirrored in an image ``width`` wide when ``flip``; ``head`` is the
        model's head metadata. The base task's rows have no such columns."""
        return rows


BOXES_ONLY = TaskOutputs()


def outputs_of(task: str | None) -> TaskOutputs:
    """The ``predict`` part of the task called ``task`` (None: the base task); the base task's, boxes alone, for a
    task that adds nothing there."""
    return get_task(task).load("predict") or BOXES_ONLY
