"""One inference interface over our .pt checkpoints, exported TorchScript and ONNX files and OpenVINO folders.

``DetectBackend(weights)`` picks the runtime from the file suffix (or the ``*_openvino_model/`` folder) and reads
the metadata each format carries (stride, class names, export image size, dynamic shapes), so ``detect.py`` and
``test.py`` treat them alike: call it with a float image batch (b, 3, h, w) in [0, 1] and get the decoded
predictions (b, n, 5 + nc) = [cx, cy, w, h (input pixels), obj, cls...] as a torch tensor.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from utils import paths
from utils.errors import UserError
from utils.evaluation.tta import DetectLayout
from utils.log import LOGGER
from utils.weights.downloads import attempt_download_once_per_node, is_release_name

SUFFIXES = {".pt": "pt", ".torchscript": "torchscript", ".onnx": "onnx", ".xml": "openvino"}
TORCHSCRIPT_CONFIG = "config.txt"  # the JSON metadata file inside a TorchScript archive
OPENVINO_SUFFIX = "_openvino_model"  # export.py writes best.pt's OpenVINO model to best_openvino_model/
METADATA_KEYS = ("stride", "names", "img_size", "batch_size", "dynamic", "device", "strides", "num_anchors", "half")


class BackendError(UserError, RuntimeError):
    """Weights that no backend can run; the message names the file and what to do."""


def find_trained_weights(root: Path | None = None) -> Path:
    """The newest ``runs/train/*/weights/best.pt`` (by modification time) under ``root`` (the project)."""
    root = Path(root) if root is not None else paths.ROOT
    candidates = [p for p in (root / "runs" / "train").glob("*/weights/best.pt") if p.is_file()]
    if not candidates:
        raise BackendError(f"no trained model found ({root / 'runs/train/*/weights/best.pt'} does not exist); "
                           "train one first with `python train.py`, or pass --weights")
    return max(candidates, key=lambda p: p.stat().st_mtime)


def resolve_weights_arg(weights: str | Path) -> Path:
    """--weights as a local path: '' -> the newest trained best.pt; a release name (``yolov5s.pt``) that is not
    here -> downloaded once per machine; anything else as given. Under torchrun all ranks must call it."""
    if not str(weights):
        return find_trained_weights()
    if is_release_name(weights) and not Path(weights).expanduser().exists():
        return attempt_download_once_per_node(weights)
    return Path(weights).expanduser()


def check_img_size(img_size: list[int] | tuple[int, ...], stride: int, flag: str = "--img-size") -> tuple[int, int]:
    """(h, w) from one value (square) or two, each rounded up to a multiple of ``stride`` (with a warning)."""
    if len(img_size) not in (1, 2) or min(img_size) < 1:
        raise BackendError(f"{flag} {list(img_size)}: give one positive size or two (h w)")
    size = (int(img_size[0]), int(img_size[-1]))
    snapped = (math.ceil(size[0] / stride) * stride, math.ceil(size[1] / stride) * stride)
    if snapped != size:
        LOGGER.warning(f"WARNING: {flag} {list(size)} is not a multiple of stride {stride}; using {list(snapped)}")
    return snapped


def export_metadata(model: torch.nn.Module, img_size: tuple[int, int], batch_size: int, dynamic: bool,
                    half: bool = False) -> dict:
    """What an exported file must carry for detect.py and test.py: stride, class names, input size, dynamic or
    not, device, input precision, and the head's layout (strides per level, anchors per cell: --augment)."""
    return {"stride": int(model.stride.max()), "names": [str(n) for n in model.names],
            "img_size": [int(img_size[0]), int(img_size[1])], "batch_size": int(batch_size), "dynamic": bool(dynamic),
            "device": next(model.parameters()).device.type, "strides": [float(s) for s in model.stride.tolist()],
            "num_anchors": int(model.detect.na), "half": bool(half)}


def weights_kind(weights: Path) -> str | None:
    """The runtime of ``weights``: 'pt', 'torchscript', 'onnx', 'openvino' (a .xml or its folder); None if unknown."""
    if weights.is_dir() or weights.name.endswith(OPENVINO_SUFFIX):
        return "openvino"
    return SUFFIXES.get(weights.suffix.lower())


def openvino_xml(weights: Path) -> Path:
    """The model file of an OpenVINO folder (or the .xml itself)."""
    if weights.is_file():
        return weights
    found = sorted(weights.glob("*.xml")) if weights.is_dir() else []
    if not found:
        raise BackendError(f"--weights {weights}: no OpenVINO .xml model in it; write one with "
                           "`python export.py --include openvino`")
    return found[0]


@contextlib.contextmanager
def quiet_jit_warnings() -> Iterator[None]:
    """torch.jit is deprecated since torch 2.9 but its files still load and run; keep its notices quiet."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.(jit|onnx).*deprecated")
        warnings.filterwarnings("ignore", message=r".*legacy TorchScript-based ONNX export")
        warnings.filterwarnings("ignore", message=r".*feature will be removed")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


class DetectBackend:
    """Run a .pt, .torchscript, .onnx or OpenVINO detector; exposes ``stride``, ``names``, ``img_size``, ``dynamic``
    and the head's ``layout`` (for --augment)."""

    def __init__(self, weights: str | Path, device: torch.device | str = "cpu", half: bool = False,
                 trusted: bool = False, runtime_threads: int = 0) -> None:
        self.weights = Path(weights)
        self.runtime_threads = runtime_threads  # onnxruntime's / OpenVINO's threads (0: their default)
        self.device = torch.device(device)
        self.kind = weights_kind(self.weights)
        if self.kind is None:
            raise BackendError(f"--weights {self.weights}: unknown format '{self.weights.suffix}' "
                               f"(use {', '.join(SUFFIXES)} or an OpenVINO folder *{OPENVINO_SUFFIX}/)")
        if not self.weights.exists():
            raise BackendError(f"--weights {self.weights} not found")
        if half and self.device.type != "cuda":
            raise BackendError("--half needs a CUDA device (--device 0); half precision is not used on CPU")
        if half and self.kind != "pt":
            raise BackendError(f"--half applies to .pt weights; {self.weights.name} runs at the precision it was "
                               "exported with (export.py --half)")
        self.half = half
        self.input_dtype = torch.float16 if half else torch.float32
        self.img_size: tuple[int, int] | None = None  # fixed input size of a static export (h, w)
        self.batch_size: int | None = None  # fixed batch of a static export
        self.dynamic = True
        self.strides: tuple[float, ...] = ()
        self.num_anchors = 3
        getattr(self, f"_load_{self.kind}")(trusted)

    def _load_pt(self, trusted: bool) -> None:
        from utils.weights.checkpoint import load_model

        model, _ = load_model(self.weights, self.device, fuse=True, trusted=trusted)
        self.model = model.half() if self.half else model
        self.stride = int(model.stride.max())
        self.names = list(model.names)
        self.strides, self.num_anchors = tuple(float(s) for s in model.stride.tolist()), int(model.detect.na)

    def _load_torchscript(self, trusted: bool) -> None:
        extra = {TORCHSCRIPT_CONFIG: ""}
        try:
            with quiet_jit_warnings():
                model = torch.jit.load(str(self.weights), map_location="cpu", _extra_files=extra)
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"{self.weights} is not a readable TorchScript file ({str(e).splitlines()[0][:200]})") \
                from None
        try:
            meta = json.loads(extra[TORCHSCRIPT_CONFIG] or "{}")
        except ValueError:
            meta = {}
        meta = self._apply_metadata(meta)
        traced_on = meta.get("device", "cpu")
        if traced_on != self.device.type:  # a trace keeps the device of the tensors it created
            raise BackendError(f"{self.weights} was exported on {traced_on} and runs only there; use --device "
                               f"{'cpu' if traced_on == 'cpu' else '0'} or export again with --device {self.device}")
        self.model = model.to(self.device)
        self.input_dtype = torch.float16 if meta.get("half") else torch.float32

    def _load_onnx(self, trusted: bool) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise BackendError(f"{self.weights}: running ONNX files needs onnxruntime (pip install onnxruntime)") \
                from None
        providers = ["CPUExecutionProvider"]
        if self.device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": self.device.index or 0}))
        try:
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = self.runtime_threads
            self.session = onnxruntime.InferenceSession(str(self.weights), options, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for bad files
            raise BackendError(f"{self.weights} is not a readable ONNX file ({str(e).splitlines()[0][:200]})") \
                from None
        self.input_name = self.session.get_inputs()[0].name
        raw = dict(self.session.get_modelmeta().custom_metadata_map)
        try:
            meta = {k: json.loads(v) for k, v in raw.items() if k in METADATA_KEYS}
        except ValueError:
            meta = {}
        self._apply_metadata(meta)
        model_input = self.session.get_inputs()[0]
        self.input_dtype = torch.float16 if model_input.type == "tensor(float16)" else torch.float32
        self._apply_input_shape(list(model_input.shape))  # symbolic dims are strings

    def _load_openvino(self, trusted: bool) -> None:
        try:
            import openvino
        except ImportError:
            raise BackendError(f"{self.weights}: running OpenVINO models needs openvino (pip install openvino)") \
                from None
        xml = openvino_xml(self.weights)
        meta_file = xml.with_suffix(".yaml")
        meta = yaml.safe_load(meta_file.read_text()) if meta_file.is_file() else {}
        self._apply_metadata(meta if isinstance(meta, dict) else {})
        core = openvino.Core()
        config = {"INFERENCE_NUM_THREADS": self.runtime_threads} if self.runtime_threads else {}
        try:
            self.compiled = core.compile_model(core.read_model(str(xml)), "CPU", config)  # OpenVINO runs on the CPU
        except RuntimeError as e:
            raise BackendError(f"{xml} is not a readable OpenVINO model ({str(e).strip().splitlines()[0][:200]})") \
                from None
        model_input = self.compiled.input(0)
        self.input_dtype = torch.float16 if model_input.get_element_type() == openvino.Type.f16 else torch.float32
        shape = model_input.get_partial_shape()
        self._apply_input_shape([d.get_length() if d.is_static else "?" for d in shape])

    def _apply_input_shape(self, shape: list[int | str]) -> None:
        """A runtime's input shape: fixed batch and (h, w) where its dimensions are numbers."""
        self.dynamic = not all(isinstance(d, int) for d in shape[2:])
        self.batch_size = shape[0] if isinstance(shape[0], int) else None
        self.img_size = None if self.dynamic else (int(shape[2]), int(shape[3]))

    def _apply_metadata(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Read the metadata export.py wrote (names as a list, or as YOLOv5's {index: name})."""
        if not isinstance(meta, dict) or "stride" not in meta or "names" not in meta:
            raise BackendError(f"{self.weights} carries no stride/class-name metadata; re-export it with export.py")
        names = meta["names"]
        if isinstance(names, dict):
            names = [names[k] for k in sorted(names, key=int)]
        self.stride = int(meta["stride"])
        self.names = [str(n) for n in names]
        self.dynamic = bool(meta.get("dynamic", False))
        self.batch_size = None if self.dynamic else int(meta.get("batch_size", 1))
        if not self.dynamic and meta.get("img_size"):
            self.img_size = (int(meta["img_size"][0]), int(meta["img_size"][1]))
        levels = int(math.log2(self.stride // 8)) + 1 if self.stride >= 8 else 1  # older exports: P3 and up
        self.strides = tuple(float(s) for s in meta.get("strides") or [self.stride / 2 ** k
                                                                        for k in reversed(range(levels))])
        self.num_anchors = int(meta.get("num_anchors", 3))
        return meta

    @property
    def dtype(self) -> torch.dtype:
        """The input dtype the model expects."""
        return self.input_dtype

    @property
    def layout(self) -> DetectLayout:
        """Strides per level and anchors per cell, which test-time augmentation needs."""
        return DetectLayout(self.strides, self.num_anchors)

    def as_module(self) -> nn.Module:
        """An nn.Module for evaluate(): the model itself for .pt, a thin wrapper for the exports."""
        return self.model if self.kind == "pt" else BackendModule(self)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Decoded predictions (b, n, 5 + nc) for a float image batch (b, 3, h, w) in [0, 1]."""
        if self.batch_size is None or images.shape[0] == self.batch_size:
            return self._forward(images)
        outputs = []  # a static export takes exactly batch_size images: run chunks, zero-padding the last
        for chunk in images.split(self.batch_size):
            padded = torch.cat((chunk, chunk.new_zeros(self.batch_size - len(chunk), *chunk.shape[1:])), 0)
            outputs.append(self._forward(padded)[: len(chunk)])
        return torch.cat(outputs, 0)

    def _forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.kind in ("onnx", "openvino"):
            array = images.detach().cpu().numpy().astype(np.float16 if self.input_dtype == torch.float16
                                                         else np.float32, copy=False)
            if self.kind == "onnx":
                output = self.session.run(None, {self.input_name: array})[0]
            else:
                output = self.compiled(array)[self.compiled.output(0)]
            return torch.from_numpy(np.asarray(output)).to(self.device)
        output = self.model(images.to(self.device, self.dtype))
        return output[0] if isinstance(output, (list, tuple)) else output

    def warmup(self, img_size: tuple[int, int] = (640, 640)) -> None:
        """One forward pass on zeros, so the first timed image does not pay for lazy initialisation."""
        shape = self.img_size or img_size
        self(torch.zeros(self.batch_size or 1, 3, *shape, device=self.device, dtype=self.dtype))


class BackendModule(nn.Module):
    """An exported model as an nn.Module for evaluate(): calls run the runtime; train and eval mode change
    nothing (exports are inference-only)."""

    def __init__(self, backend: DetectBackend) -> None:
        super().__init__()
        self.backend = backend
        self.strides, self.num_anchors = backend.strides, backend.num_anchors
        self.names = backend.names

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backend(images.float()).float()
