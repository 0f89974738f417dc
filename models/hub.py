"""Images in, detections out: the model wrapper that ``hubconf.py`` returns, and its result class.

``Detector(model)(images)`` takes a file path (str or Path; read by OpenCV), a numpy HWC uint8 image in RGB order (as
PIL gives it; pass ``cv2.imread(...)[..., ::-1]`` for an OpenCV image), a PIL image, or a list of these. It fits them
to one batch shape as the model's task does (letterboxed; a classifier's centre-cropped to a square), runs the model,
post-processes its output as the model's output contract says (utils.tasks.contract.postprocess: NMS, or thresholds
only for an end-to-end head) and maps the boxes back to each original image: ``Detections.xyxy[i]`` is a (k, 6) tensor
[x1, y1, x2, y2, score, class] in that image's pixels. What a model's task predicts beyond the boxes comes by name,
per image, from the task's ``predict`` part (utils/evaluation/task_outputs.py): a segmenter's ``Detections.masks[i]``
(k, h, w) bool at that image's size (its prototypes and the rows' coefficients, then resized). A float tensor batch
(b, 3, h, w) in [0, 1] is passed straight to the model (raw decoded predictions).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from utils.boxes import scale_boxes, xyxy2xywh
from utils.data.image_io import ImageRefused, read_image
from utils.errors import UserError
from utils.evaluation.evaluate import model_contract
from utils.evaluation.task_outputs import outputs_of
from utils.tasks.contract import postprocess
from utils.tasks.registry import all_tasks


class ImageInputError(UserError, ValueError):
    """An input the detector cannot read as an image; the message names it."""


class Detections:
    """Detections of a batch: per image a (k, 6) tensor [x1, y1, x2, y2, score, class] in original pixels, and what
    the model's task predicts beyond the boxes by name, per image (``extras``; ``detections.<name>``: a segmenter's
    ``masks``, the (k, h, w) bool masks at the image's size; None for a model of another task)."""

    def __init__(self, xyxy: list[torch.Tensor], names: Sequence[str], shapes: list[tuple[int, int]],
                 sources: list[str], extras: dict[str, list] | None = None) -> None:
        self.xyxy = xyxy
        self.extras = extras or {}
        self.names = list(names)
        self.shapes = shapes  # (h, w) of each original image
        self.sources = sources  # file path, or "image<i>" for arrays

    def __len__(self) -> int:
        return len(self.xyxy)

    def __getattr__(self, name: str) -> list | None:
        """A task's results by name, per image (None when the model's task has none of that name)."""
        extras = self.__dict__.get("extras") or {}
        if name in extras:
            return extras[name]
        if any(name in task.words for task in all_tasks()):
            return None
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def xywh(self) -> list[torch.Tensor]:
        """Per image (k, 6) [cx, cy, w, h, score, class] in original pixels."""
        return [torch.cat((xyxy2xywh(d[:, :4]), d[:, 4:]), 1) for d in self.xyxy]

    def boxes(self, i: int = 0) -> torch.Tensor:
        return self.xyxy[i][:, :4]

    def scores(self, i: int = 0) -> torch.Tensor:
        return self.xyxy[i][:, 4]

    def classes(self, i: int = 0) -> torch.Tensor:
        return self.xyxy[i][:, 5].long()

    def labels(self, i: int = 0) -> list[str]:
        """Class names of image ``i``'s detections, best first."""
        return [self.names[c] for c in self.classes(i).tolist()]

    def tolist(self) -> list[list[dict[str, Any]]]:
        """Plain Python: per image a list of {"box": [x1, y1, x2, y2], "score", "class", "name"}."""
        return [[{"box": row[:4], "score": row[4], "class": int(row[5]), "name": self.names[int(row[5])]}
                 for row in d.tolist()] for d in self.xyxy]

    def __repr__(self) -> str:
        lines = []
        for i, ((h, w), source) in enumerate(zip(self.shapes, self.sources)):
            counts = {name: self.labels(i).count(name) for name in dict.fromkeys(self.labels(i))}
            found = ", ".join(f"{n} {name}" for name, n in counts.items()) or "no detections"
            lines.append(f"image {i + 1}/{len(self)} {source}: {w}x{h} {found}")
        return "\n".join(lines)


class Detector(nn.Module):
    """A detection model (our Model, or an exported one) with its pre- and post-processing; settings are attributes
    (``conf``, ``iou``, ...)."""

    def __init__(self, model: nn.Module, conf: float = 0.25, iou: float = 0.45, classes: list[int] | None = None,
                 agnostic: bool = False, multi_label: bool = False, max_det: int = 1000) -> None:
        super().__init__()
        self.model = model.eval()
        self.contract = model_contract(model)  # the row layout of its output (its head's, or the file's)
        self.conf, self.iou, self.classes = conf, iou, classes
        self.agnostic, self.multi_label, self.max_det = agnostic, multi_label, max_det

    @property
    def names(self) -> list[str]:
        return list(self.model.names)

    @property
    def stride(self) -> int:
        return int(self.model.stride.max())

    @torch.no_grad()
    def forward(self, images: Any, size: int = 640) -> Detections | torch.Tensor:
        """Detections for one image or a list (see the module docstring); ``size`` is the longest side fed in (a
        classifier's: the side of its square input)."""
        if isinstance(images, torch.Tensor):
            return self.model(images)
        batch = list(images) if isinstance(images, (list, tuple)) else [images]
        if not batch:
            raise ImageInputError("no images given")
        arrays, sources = zip(*(read_rgb(image, i) for i, image in enumerate(batch)))
        outputs, extras = outputs_of(self.contract.task), {}
        shape = getattr(self.model, "img_size", None) or \
            outputs.input_shape([a.shape[:2] for a in arrays], size, self.stride)
        fitted = [outputs.fit_input(a, shape, self.stride, False) for a in arrays]
        parameter = next(iter([*self.model.parameters(), *self.model.buffers()]))  # exports: the stride buffer
        x = torch.from_numpy(np.stack([image.transpose(2, 0, 1) for image, _ in fitted]))
        x = x.to(parameter.device, parameter.dtype) / 255
        output = self.model(x)
        predictions, others = (output[0], tuple(output[1:])) if isinstance(output, (list, tuple)) else (output, ())
        kept = postprocess(predictions.float(), self.contract, self.conf, self.iou, self.classes, self.agnostic,
                           self.multi_label, max_det=self.max_det)
        for i, (det, array, (_, ratio_pad)) in enumerate(zip(kept, arrays, fitted)):
            boxes0 = scale_boxes(shape, det[:, :4].clone(), array.shape[:2], ratio_pad=ratio_pad)
            for name, value in (outputs.image(det, others, i, shape, boxes0, array.shape[:2], ratio_pad)
                                if not self.contract.boxes_alone else {}).items():
                extras.setdefault(name, []).append(value)
            det[:, :4] = boxes0
        shapes = [a.shape[:2] for a in arrays]
        return Detections([d[:, :6].cpu() for d in kept], self.names, shapes, list(sources), extras)


def read_rgb(image: Any, index: int = 0) -> tuple[np.ndarray, str]:
    """(HWC uint8 RGB array, name) from a path, an RGB numpy array or a PIL image."""
    if isinstance(image, (str, Path)):
        if not Path(image).exists():
            raise ImageInputError(f"cannot read image {image} (file not found)")
        try:
            bgr = read_image(image)
        except ImageRefused as e:
            raise ImageInputError(f"cannot read image {image} ({e})") from None
        return np.ascontiguousarray(bgr[..., ::-1]), str(image)
    if hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image
        return np.asarray(image.convert("RGB")), getattr(image, "filename", "") or f"image{index}"
    if isinstance(image, np.ndarray):
        array = image if image.ndim == 3 else np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else None
        if array is None or array.shape[2] not in (3, 4) or min(array.shape[:2]) < 1:
            raise ImageInputError(f"image {index}: expected an HWC array with 3 (RGB) or 4 (RGBA) channels, "
                                  f"got shape {image.shape}")
        if array.dtype != np.uint8:
            array = np.clip(array * 255 if array.dtype.kind == "f" and array.max() <= 1 else array, 0, 255)
        return np.ascontiguousarray(array[..., :3].astype(np.uint8, copy=False)), f"image{index}"
    raise ImageInputError(f"image {index}: a {type(image).__name__} is not a path, numpy array or PIL image")


def transfer_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> int:
    """Copy every tensor of ``state`` whose name and shape fit ``model`` (the rest keeps its initialisation)."""
    own = model.state_dict()
    matched = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
    model.load_state_dict(matched, strict=False)
    clear = getattr(getattr(model, "head", None), "clear_grid_cache", None)  # decode caches of the old tensors
    if callable(clear):
        clear()
    return len(matched)
