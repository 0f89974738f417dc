"""What a task's predictions hold beyond the boxes, per image, for detect.py, the hub model and the trackers: a
task's ``predict`` part (utils/tasks/registry.py); the base task's holds nothing.

``image`` makes one image's results in its original pixels from the model's other outputs (a segmenter's masks
from its prototypes and the rows' coefficients); ``summary`` is what detect.run's result keeps per frame (a
segmenter's outlines); ``draw`` paints the results under the boxes; ``label_rows`` writes --save-txt's rows (None:
the boxes' YOLO rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


class TaskOutputs:
    """The base task's: nothing beyond the boxes (see the module docstring)."""

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

    def label_rows(self, det: np.ndarray, results: Mapping[str, Any], shape: tuple[int, int],
                   save_conf: bool) -> list[str] | None:
        return None


BOXES_ONLY = TaskOutputs()
