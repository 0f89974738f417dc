"""One inference interface over our .pt checkpoints and every registered export format.

``InferenceModel(weights)`` finds the file's format in the registry (utils/deploy/formats.py), opens it there and
reads the metadata it carries (stride, class names, export image size, dynamic shapes), so ``detect.py``,
``test.py`` and ``hubconf.py`` treat them alike: call it with a float image batch (b, 3, h, w) in [0, 1] and get
the decoded predictions (b, n, columns) as a torch tensor, laid out as its ``contract`` says (the output contract the
file's metadata records; a file from before contracts were recorded is a YOLOv5 detector's: [cx, cy, w, h (input
pixels), obj, cls...]). ``utils.tasks.contract.postprocess(pred, model.contract, ...)`` turns them into detections.
A model whose task has other outputs (``contract.outputs``: a segmenter's prototypes (b, nm, h/4, w/4)) returns
``(rows, *others)`` as the PyTorch model does; the task's ``predict`` part reads them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils import paths
from utils.deploy.formats import ExportFormat, LoadOptions, all_formats, check_metadata, format_for
from utils.errors import UserError
from utils.evaluation.tta import DetectLayout
from utils.log import LOGGER
from utils.tasks.contract import ContractError, OutputContract
from utils.weights.downloads import attempt_download_once_per_node, check_not_url, is_release_name


class InferenceModelError(UserError, RuntimeError):
    """Weights that no format can run; the message names the file and what to do."""


def find_trained_weights(root: Path | None = None) -> Path:
    """The newest ``runs/train/*/weights/best.pt`` (by modification time) under ``root`` (the project)."""
    root = Path(root) if root is not None else paths.ROOT
    candidates = [p for p in (root / "runs" / "train").glob("*/weights/best.pt") if p.is_file()]
    if not candidates:
        raise InferenceModelError(f"no trained model found ({root / 'runs/train/*/weights/best.pt'} does not exist); "
                           "train one first with `python train.py`, or pass --weights")
    return max(candidates, key=lambda p: p.stat().st_mtime)


def resolve_weights_arg(weights: str | Path) -> Path:
    """--weights as a local path: '' -> the newest trained best.pt; a release name (``yolov5s.pt``) that is not
    here -> downloaded once per machine; anything else as given. Under torchrun all ranks must call it."""
    if not str(weights):
        return find_trained_weights()
    check_not_url(weights)
    if is_release_name(weights) and not Path(weights).expanduser().exists():
        return attempt_download_once_per_node(weights)
    return Path(weights).expanduser()


def default_img_size(img_size: list[int] | None, model: InferenceModel) -> list[int]:
    """``--img-size`` as given, else the size ``model`` was trained or exported at, else 640."""
    if img_size:
        return list(img_size)
    if model.default_size is None:
        return [640]
    LOGGER.info(f"Image size {model.default_size[0]}: the size {model.weights.name} was "
                f"{'trained' if model.kind == 'pytorch' else 'exported'} at (--img-size changes it)")
    return list(model.default_size)


def check_img_size(img_size: list[int] | tuple[int, ...], stride: int, flag: str = "--img-size") -> tuple[int, int]:
    """(h, w) from one value (square) or two, each rounded up to a multiple of ``stride`` (with a warning)."""
    if len(img_size) not in (1, 2) or min(img_size) < 1:
        raise InferenceModelError(f"{flag} {list(img_size)}: give one positive size or two (h w)")
    size = (int(img_size[0]), int(img_size[-1]))
    snapped = (math.ceil(size[0] / stride) * stride, math.ceil(size[1] / stride) * stride)
    if snapped != size:
        LOGGER.warning(f"WARNING: {flag} {list(size)} is not a multiple of stride {stride}; using {list(snapped)}")
    return snapped


def weights_format(weights: Path) -> ExportFormat:
    """The registered format of ``weights`` (by suffix, or an OpenVINO folder); a one-line error otherwise."""
    found = format_for(weights)
    if found is None:
        known = ", ".join(f.suffix + ("/" if f.is_folder else "") for f in all_formats())
        raise InferenceModelError(f"--weights {weights}: unknown format '{weights.suffix or weights.name}' "
                                  f"(use one of {known})")
    return found


class InferenceModel:
    """A .pt checkpoint or any registered export, opened by its format (utils/deploy/formats.py); exposes
    ``stride``, ``names``, ``img_size``, ``dynamic``, ``format``, the output ``contract`` and the head's ``layout``
    (for --augment)."""

    def __init__(self, weights: str | Path, device: torch.device | str = "cpu", half: bool = False,
                 trusted: bool = False, runtime_threads: int = 0) -> None:
        self.weights = Path(weights)
        self.device = torch.device(device)
        self.format = weights_format(self.weights)
        if not self.weights.exists():
            raise InferenceModelError(f"--weights {self.weights} not found")
        if not self.format.runs_here:
            raise InferenceModelError(f"--weights {self.weights}: {self.format.name} models have no runtime on "
                                      f"this operating system ({self.format.runs_where})")
        if half and self.device.type != "cuda":
            raise InferenceModelError("--half needs a CUDA device (--device 0); half precision is not used on CPU")
        if half and self.format.name != "pytorch":
            raise InferenceModelError(f"--half applies to .pt weights; {self.weights.name} runs at the precision "
                                      "it was exported with (export.py --half)")
        self.half = half
        self.img_size: tuple[int, int] | None = None  # fixed input size of a static export (h, w)
        self.default_size: tuple[int, int] | None = None  # the size it was trained (a .pt) or exported at (h, w)
        self.batch_size: int | None = None  # fixed batch of a static export
        self.dynamic = True
        self.strides: tuple[float, ...] = ()
        self.num_anchors = 3
        loaded = self.format.load(self.weights, LoadOptions(self.device, half, trusted, runtime_threads))
        self._apply_metadata(loaded.meta)
        if loaded.input_shape is not None:
            self._apply_input_shape(loaded.input_shape)
        self.input_dtype = loaded.input_dtype
        self._run, self.module = loaded.run, loaded.module

    @property
    def kind(self) -> str:
        """The format's name: 'pytorch', 'torchscript', 'onnx', 'openvino', ..."""
        return self.format.name

    def _apply_input_shape(self, shape: list[int | str]) -> None:
        """A runtime's input shape: fixed batch and (h, w) where its dimensions are numbers."""
        self.dynamic = not all(isinstance(d, int) for d in shape[2:])
        self.batch_size = shape[0] if isinstance(shape[0], int) else None
        self.img_size = None if self.dynamic else (int(shape[2]), int(shape[3]))
        self.default_size = self.img_size or self.default_size

    def _apply_metadata(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Read the metadata export.py wrote (names as a list, or as YOLOv5's {index: name}), every field checked
        first (check_metadata: stride, names, sizes, anchors within bounds, one line naming the field)."""
        if not isinstance(meta, dict) or "stride" not in meta or "names" not in meta:
            raise InferenceModelError(f"{self.weights} carries no stride/class-name metadata; re-export it with "
                                      "export.py")
        meta = check_metadata(meta, self.weights)
        self.stride = meta["stride"]
        self.names = meta["names"]
        self.dynamic = meta.get("dynamic", False)
        self.batch_size = None if self.dynamic else meta.get("batch_size", 1)
        if meta.get("img_size") and min(meta["img_size"]) > 0:
            self.default_size = (meta["img_size"][0], meta["img_size"][1])
            self.img_size = None if self.dynamic else self.default_size
        levels = int(math.log2(self.stride // 8)) + 1 if self.stride >= 8 else 1  # older exports: P3 and up
        self.strides = tuple(meta.get("strides") or [self.stride / 2 ** k for k in reversed(range(levels))])
        self.num_anchors = meta.get("num_anchors", 3)
        self.contract = self._contract(meta)
        self.head_meta = dict(meta.get("head") or {})  # the head's own metadata (a pose model's flip_idx: --augment)
        return meta

    def _contract(self, meta: dict[str, Any]) -> OutputContract:
        """The output contract the file records (under ``head``); YOLOv5's for a file from before contracts."""
        head = meta.get("head")
        recorded = head.get("contract") if isinstance(head, dict) else None
        try:
            contract = OutputContract.from_metadata(recorded, nc=len(self.names))
        except ContractError as e:
            raise InferenceModelError(f"{self.weights}: {e}") from None
        if contract.nc != len(self.names):
            raise InferenceModelError(f"{self.weights}: its output contract has {contract.nc} classes but it names "
                                      f"{len(self.names)}")
        return contract

    @property
    def dtype(self) -> torch.dtype:
        """The input dtype the model expects."""
        return self.input_dtype

    @property
    def layout(self) -> DetectLayout:
        """Strides per level and anchors per cell, which test-time augmentation needs."""
        return DetectLayout(self.strides, self.num_anchors, self.head_meta)

    def as_module(self) -> nn.Module:
        """An nn.Module for evaluate(): the model itself for .pt, a thin wrapper for the exports."""
        return self.module if self.module is not None else ExportedModule(self)

    @property
    def several_outputs(self) -> bool:
        """Whether calls return (rows, *others): its task has outputs besides the rows (a segmenter's prototypes)."""
        return len(self.contract.outputs) > 1

    @property
    def task(self) -> str:
        """The task whose labels score it (its contract's)."""
        return self.contract.task

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Decoded predictions (b, n, contract columns) for a float image batch (b, 3, h, w) in [0, 1]; for a task
        with other outputs ``(rows, *others)`` (a segmenter's prototypes (b, nm, h', w'))."""
        if self.batch_size is None or images.shape[0] == self.batch_size:
            return self._forward(images)
        outputs = []  # a static export takes exactly batch_size images: run chunks, zero-padding the last
        for chunk in images.split(self.batch_size):
            padded = torch.cat((chunk, chunk.new_zeros(self.batch_size - len(chunk), *chunk.shape[1:])), 0)
            output = self._forward(padded)
            outputs.append(tuple(part[: len(chunk)] for part in output) if self.several_outputs
                           else output[: len(chunk)])
        if self.several_outputs:
            return tuple(torch.cat(parts, 0) for parts in zip(*outputs))  # type: ignore[return-value]
        return torch.cat(outputs, 0)

    def _forward(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The runtime's outputs checked against the contract: the rows first, then the task's other outputs."""
        output = self._run(images)
        parts = list(output) if isinstance(output, (list, tuple)) else [output]
        rows, columns = (parts[0] if parts else None), self.contract.columns  # the row width its metadata promises
        if not isinstance(rows, torch.Tensor) or rows.dim() != self.contract.rank or rows.shape[0] != images.shape[0] \
                or rows.shape[-1] != columns or not rows.is_floating_point():
            found = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
            raise InferenceModelError(f"{self.weights} returned a {found} tensor, not (batch, boxes, {columns}) "
                                      f"floats for {len(self.names)} classes ({self.contract.layout}); it is not a "
                                      "detection model of this project's layout (re-export it with export.py)")
        if not self.several_outputs:
            return rows.to(self.device)
        names, others = self.contract.outputs[1:], parts[1:]
        for name, other in zip(names, [*others, *[None] * (len(names) - len(others))]):
            if not isinstance(other, torch.Tensor) or other.dim() < 2 or other.shape[0] != len(rows):
                found = tuple(other.shape) if isinstance(other, torch.Tensor) else "no"
                raise InferenceModelError(f"{self.weights} returned {found} {name}, not (batch, ...) as its "
                                          f"{self.contract.task} contract needs (re-export it with export.py)")
        return rows.to(self.device), *(other.to(self.device) for other in others[:len(names)])

    def warmup(self, img_size: tuple[int, int] = (640, 640)) -> None:
        """One forward pass on zeros, so the first timed image does not pay for lazy initialisation."""
        shape = self.img_size or img_size
        self(torch.zeros(self.batch_size or 1, 3, *shape, device=self.device, dtype=self.dtype))


class ExportedModule(nn.Module):
    """An exported model as an nn.Module for evaluate(): calls run the runtime; train and eval mode change
    nothing (exports are inference-only)."""

    def __init__(self, model: InferenceModel) -> None:
        super().__init__()
        self.inference = model
        self.strides, self.num_anchors = model.strides, model.num_anchors
        self.names, self.img_size = model.names, model.img_size  # img_size: a static export's fixed input (h, w)
        self.contract = model.contract  # the row layout of its output, from the file's metadata
        self.head_meta = model.head_meta
        self.register_buffer("stride", torch.tensor(model.strides, device=model.device), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        output = self.inference(images.float())
        return tuple(part.float() for part in output) if self.inference.several_outputs else output.float()
