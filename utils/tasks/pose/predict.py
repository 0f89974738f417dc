"""A pose model's predictions beyond the boxes (the pose task's ``predict`` part): each detection's keypoints in the
original image's pixels, drawn with their skeleton under the boxes, and YOLO pose rows for --save-txt; and how
test-time augmentation's passes move them back (``deaugment``: scaled, and mirrored with the model's flip_idx).

Results per image: ``keypoints`` (k, K, 3), x and y in the original image's pixels and the predicted visibility
score (1.0 for a model of keypoints without visibility). The skeleton drawn is COCO's for 17 keypoints (the
layout of COCO's people and of the built-in synthetic pose set); other counts get their keypoints alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from utils.boxes import xyxy2xywhn
from utils.errors import UserError
from utils.evaluation.task_outputs import TaskOutputs
from utils.tasks.contract import OutputContract
from utils.tasks.pose.draw import draw_keypoints
from utils.tasks.pose.labels import COCO_SKELETON, pose_label_line


def skeleton_of(count: int) -> tuple[tuple[int, int], ...]:
    """The limbs drawn between keypoints of an object of ``count`` keypoints: COCO's for 17, none otherwise."""
    return COCO_SKELETON if count == 17 else ()


def keypoints_in_original(rows: torch.Tensor, input_hw: Sequence[int], shape0: Sequence[int],
                          ratio_pad: Any) -> torch.Tensor:
    """Rows' keypoint columns (k, 6 + 3 K) in the input's pixels -> (k, K, 3) in the original image's of ``shape0``
    (h, w), placed in the input by ``ratio_pad`` ((ratio_h, ratio_w), (pad_w, pad_h)) (None: centred), clipped."""
    points = rows[:, 6:].float().reshape(len(rows), -1, 3).clone()
    if ratio_pad is None:
        gain = min(input_hw[0] / shape0[0], input_hw[1] / shape0[1])
        pad = ((input_hw[1] - shape0[1] * gain) / 2, (input_hw[0] - shape0[0] * gain) / 2)
    else:
        gain, pad = ratio_pad[0][0], ratio_pad[1]
    points[..., 0] = ((points[..., 0] - pad[0]) / gain).clamp(0, shape0[1])
    points[..., 1] = ((points[..., 1] - pad[1]) / gain).clamp(0, shape0[0])
    return points


class PoseOutputs(TaskOutputs):
    """See the module docstring."""

    deaugments = True

    def image(self, rows: torch.Tensor, outputs: tuple, index: int, input_hw: tuple[int, int],
              boxes0: torch.Tensor, shape0: tuple[int, int], ratio_pad: Any, native: bool = False) -> dict[str, Any]:
        return {"keypoints": keypoints_in_original(rows, input_hw, shape0, ratio_pad).cpu()}

    def draw(self, img_bgr: np.ndarray, det: np.ndarray, results: Mapping[str, Any]) -> np.ndarray:
        points = np.asarray(results["keypoints"], np.float64)
        return draw_keypoints(img_bgr, points, det[:, 5], skeleton_of(points.shape[1] if points.ndim == 3 else 0))

    def label_rows(self, det: np.ndarray, results: Mapping[str, Any], shape: tuple[int, int],
                   save_conf: bool) -> list[str]:
        """``class cx cy w h`` then each keypoint's ``x y v`` (v the visibility score), normalised to the image of
        ``shape`` (h, w), then the confidence with ``save_conf``."""
        h, w = shape
        boxes = xyxy2xywhn(np.asarray(det[:, :4], np.float64).copy(), w, h, clip=True)
        points = np.asarray(results["keypoints"], np.float64).copy()
        points[..., 0] /= w
        points[..., 1] /= h
        return [pose_label_line(int(row[5]), box, kpts, 3, float(row[4]) if save_conf else None)
                for row, box, kpts in zip(det, boxes, points)]

    def deaugment(self, rows: torch.Tensor, contract: OutputContract, scale_xy: tuple[float, float], flip: bool,
                  width: int, head: Mapping[str, Any]) -> torch.Tensor:
        """A test-time augmentation pass's rows (b, n, columns) with their keypoint columns back in the input's
        frame: divided by the pass's scale, and for a mirrored pass mirrored and re-ordered by the model's
        ``flip_idx`` (its head's metadata); a model without one cannot have its mirrored pass merged."""
        first = contract.columns - contract.extra
        points = rows[..., first:].reshape(*rows.shape[:2], -1, 3).clone()
        points[..., 0] /= scale_xy[0]
        points[..., 1] /= scale_xy[1]
        if flip:
            order = head.get("flip_idx")
            if order is None:
                raise UserError("--augment mirrors one pass, and this pose model records no flip_idx to swap its "
                                "left and right keypoints back (train it on a data YAML with flip_idx), or drop "
                                "--augment")
            points = points[..., list(order), :]
            points[..., 0] = width - points[..., 0]
        return torch.cat((rows[..., :first], points.flatten(2)), -1)


OUTPUTS = PoseOutputs()
