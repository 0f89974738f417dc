"""A segmenter's predictions beyond the boxes (the segment task's ``predict`` part): each detection's mask at the
original image's size, its outline (the mask's largest part), the masks blended under the boxes, and YOLO segment
rows for --save-txt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from utils.evaluation.task_outputs import TaskOutputs
from utils.plots.annotate import class_color
from utils.tasks.segment.masks import masks_to_polygons, process_masks, process_masks_original, scale_masks


def draw_masks(img_bgr: np.ndarray, masks: np.ndarray, classes: np.ndarray | Any, alpha: float = 0.5) -> np.ndarray:
    """Blend instance masks (k, h, w) bool, the image's size, onto a uint8 BGR image in place, each in its class
    colour with opacity ``alpha`` (later masks over earlier ones); returns it."""
    classes = np.asarray(classes).reshape(-1).astype(int)
    for mask, cls in zip(np.asarray(masks, dtype=bool), classes):
        color = np.array(class_color(cls), np.float32)
        img_bgr[mask] = (img_bgr[mask] * (1 - alpha) + color * alpha).round().astype(np.uint8)
    return img_bgr


def segment_rows(det: np.ndarray, outlines: list[np.ndarray], shape: tuple[int, int], save_conf: bool) -> list[str]:
    """YOLO segment rows ``cls x1 y1 x2 y2 ... [conf]`` of detections and their outlines (original pixels),
    normalised to an image of ``shape`` (h, w); a detection whose mask is empty has no row."""
    scale = np.array([shape[1], shape[0]], np.float64)
    rows = []
    for (*_, conf, cls), outline in zip(det, outlines):
        if len(outline) < 3:
            continue
        points = " ".join(f"{v:.6g}" for v in (np.clip(outline / scale, 0, 1)).reshape(-1).tolist())
        rows.append(f"{int(cls)} {points}" + (f" {float(conf):.6g}" if save_conf else ""))
    return rows


class SegmentOutputs(TaskOutputs):
    """``masks`` (k, h0, w0) bool per image (made at the input's resolution and resized, or with ``native`` resized
    as probabilities and cropped at the original resolution); per frame its ``outlines``."""

    def image(self, rows: torch.Tensor, outputs: tuple, index: int, input_hw: tuple[int, int],
              boxes0: torch.Tensor, shape0: tuple[int, int], ratio_pad: Any, native: bool = False) -> dict[str, Any]:
        protos = outputs[0][index].float()
        if native:
            masks = process_masks_original(protos, rows[:, 6:], boxes0, input_hw, shape0, ratio_pad)
        else:
            masks = scale_masks(process_masks(protos, rows[:, 6:], rows[:, :4], input_hw), shape0, ratio_pad)
        return {"masks": masks.cpu()}

    def summary(self, results: Mapping[str, Any]) -> dict[str, Any]:
        return {"outlines": masks_to_polygons(np.asarray(results["masks"]))}

    def draw(self, img_bgr: np.ndarray, det: np.ndarray, results: Mapping[str, Any]) -> np.ndarray:
        return draw_masks(img_bgr, np.asarray(results["masks"]), det[:, 5])

    def label_rows(self, det: np.ndarray, results: Mapping[str, Any], shape: tuple[int, int],
                   save_conf: bool) -> list[str] | None:
        outlines = results.get("outlines")
        return segment_rows(det, outlines if outlines is not None else self.summary(results)["outlines"], shape,
                            save_conf)


OUTPUTS = SegmentOutputs()
