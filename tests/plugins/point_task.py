"""A toy task for the tests of the task seam: each object carries one point (its marked spot), written as a YOLO
row ``class cx cy w h px py``. Its room is this module: a LabelReader, a Geometry that moves the points with the
boxes, a collate that hands the batch its points, a metric view and per-image results; registering it is one line
(``register``). Nothing outside this file knows the task."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from utils.data.annotations import LabelReader
from utils.data.augment import TilePlace
from utils.data.label_cache import check_image, check_label_rows, read_label_rows
from utils.data.samples import SampleExtras
from utils.evaluation.task_metric import ImageContext, TaskMatch, TaskMetric
from utils.evaluation.task_outputs import TaskOutputs
from utils.tasks.registry import BOX_FITNESS, BOX_METRICS, Task, register_task

NAME = "point"


def check_point_sample(args: tuple[str, str, int | None, Path | None]) -> tuple:
    """label_cache.check_sample's six values and, seventh, each object's point (1, 2) normalised."""
    im_file, label_file, nc, repair_dir = args
    try:
        shape, note, repaired = check_image(im_file, repair_dir)
        rows, state = read_label_rows(label_file)
        values = np.array(rows, np.float64).reshape(-1, 7) if rows else np.zeros((0, 7))
        labels, duplicates, label_note = check_label_rows(values[:, :5], nc) if len(values) else \
            (np.zeros((0, 5), np.float32), 0, "")
    except (ValueError, OverflowError, TypeError) as e:
        return np.zeros((0, 5), np.float32), (0, 0), "corrupt", 0, f"{im_file}: {e}", "", []
    points = [row[5:7].reshape(1, 2).astype(np.float32) for row in values]
    return labels, shape, state, duplicates, "; ".join(n for n in (note, label_note) if n), repaired, points


READER = LabelReader(kind="points", check=check_point_sample, what="points", who="a point model",
                     sources="YOLO point labels")


class Points(SampleExtras):
    """Each object's point (k, 2) moved with its box; the batch gets ``spots`` (n, 2) in the targets' order."""

    def prepare(self, objects: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(objects).astype(np.float32) if len(objects) else np.zeros((0, 2), np.float32)

    def place(self, extras: np.ndarray, width: float, height: float, pad_x: float = 0.0,
              pad_y: float = 0.0) -> np.ndarray:
        return extras * (width, height) + (pad_x, pad_y)

    def mosaic(self, extras: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]], places: Sequence[TilePlace],
               size: int) -> np.ndarray:
        return np.concatenate([self.place(p, w, h, t.x1a - t.x1b, t.y1a - t.y1b)
                               for p, (h, w), t in zip(extras, sizes, places)]).astype(np.float32)

    def warp(self, labels: np.ndarray, extras: np.ndarray, matrix: np.ndarray, scale: float,
             out_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        from utils.data.augment import warp_boxes

        moved = np.concatenate((extras, np.ones((len(extras), 1))), 1) @ matrix.T
        moved = moved[:, :2] / moved[:, 2:3]
        tagged = np.concatenate((labels, np.arange(len(labels))[:, None]), 1)  # which objects survive the warp
        kept = warp_boxes(tagged, matrix, scale, out_shape)
        return kept[:, :5].astype(np.float32), moved[kept[:, 5].astype(int)].astype(np.float32)

    def normalize(self, extras: np.ndarray, width: float, height: float) -> np.ndarray:
        return (extras / (width, height)).astype(np.float32)

    def flip_lr(self, extras: np.ndarray) -> np.ndarray:
        return np.stack((1 - extras[:, 0], extras[:, 1]), 1)

    def flip_ud(self, extras: np.ndarray) -> np.ndarray:
        return np.stack((extras[:, 0], 1 - extras[:, 1]), 1)

    def join(self, extras: np.ndarray, other: np.ndarray) -> np.ndarray:
        return np.concatenate((extras, other))

    def collate(self, samples: Sequence[tuple], height: int, width: int,
                augment: bool) -> tuple[list[tuple], dict[str, Any]]:
        spots = [torch.from_numpy(s[4] * (s[0].shape[2] / width, s[0].shape[1] / height)) for s in samples]
        return [tuple(s[:4]) for s in samples], {"spots": torch.cat(spots) if spots else torch.zeros(0, 2)}


class PointMetric(TaskMetric):
    """A view ``spot`` that equals the boxes' (a point model is judged by its boxes here)."""

    views = {"spot": "spots"}

    def match(self, image: ImageContext) -> TaskMatch:
        from utils.evaluation.metrics import match_predictions

        return TaskMatch({"spot": match_predictions(image.det, image.labels)})


class PointOutputs(TaskOutputs):
    def image(self, rows: torch.Tensor, outputs: tuple, index: int, input_hw: tuple[int, int],
              boxes0: torch.Tensor, shape0: tuple[int, int], ratio_pad: Any, native: bool = False) -> dict[str, Any]:
        return {"centres": ((boxes0[:, :2] + boxes0[:, 2:4]) / 2).cpu()}

    def label_rows(self, det: np.ndarray, results: Mapping[str, Any], shape: tuple[int, int],
                   save_conf: bool) -> list[str]:
        return [f"{int(cls)} point" for *_, cls in det]


METRIC, OUTPUTS = PointMetric(), PointOutputs()


def register() -> Task:
    """The task's registry line."""
    return register_task(Task(NAME, "boxes with a marked point", words=("spots",), data_keys=("spot_size",),
                              metrics=(*BOX_METRICS, *(f"spot_{n}" for n in BOX_METRICS)),
                              fitness={**BOX_FITNESS, "spot_mAP_0.5:0.95": 1.0},
                              labels=f"{__name__}:READER", sample=f"{__name__}:Points",
                              metric=f"{__name__}:METRIC", predict=f"{__name__}:OUTPUTS"))
