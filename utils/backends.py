"""One inference interface over our .pt checkpoints, exported TorchScript files and ONNX files.

``DetectBackend(weights)`` picks the runtime from the file suffix and reads the metadata each
format carries (stride, class names, export image size, dynamic shapes), so ``detect.py`` treats
the three alike: call it with a float image batch (b, 3, h, w) in [0, 1] and get the decoded
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

from utils import paths
from utils.errors import UserError
from utils.log import LOGGER

SUFFIXES = {".pt": "pt", ".torchscript": "torchscript", ".onnx": "onnx"}
TORCHSCRIPT_CONFIG = "config.txt"  # the JSON metadata file inside a TorchScript archive


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


def check_img_size(img_size: list[int] | tuple[int, ...], stride: int, flag: str = "--img-size") -> tuple[int, int]:
    """(h, w) from one value (square) or two, each rounded up to a multiple of ``stride`` (with a warning)."""
    if len(img_size) not in (1, 2) or min(img_size) < 1:
        raise BackendError(f"{flag} {list(img_size)}: give one positive size or two (h w)")
    size = (int(img_size[0]), int(img_size[-1]))
    snapped = (math.ceil(size[0] / stride) * stride, math.ceil(size[1] / stride) * stride)
    if snapped != size:
        LOGGER.warning(f"WARNING: {flag} {list(size)} is not a multiple of stride {stride}; using {list(snapped)}")
    return snapped


def export_metadata(model: torch.nn.Module, img_size: tuple[int, int], batch_size: int, dynamic: bool) -> dict:
    """What an exported file must carry for detect.py: stride, class names, input size, dynamic or not, device."""
    return {"stride": int(model.stride.max()), "names": [str(n) for n in model.names],
            "img_size": [int(img_size[0]), int(img_size[1])], "batch_size": int(batch_size), "dynamic": bool(dynamic),
            "device": next(model.parameters()).device.type}


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
    """Run a .pt, .torchscript or .onnx detector; exposes ``stride``, ``names``, ``img_size``, ``dynamic``."""

    def __init__(self, weights: str | Path, device: torch.device | str = "cpu", half: bool = False,
                 trusted: bool = False, onnx_threads: int = 0) -> None:
        self.weights = Path(weights)
        self.onnx_threads = onnx_threads  # onnxruntime's intra-op threads (0: its default, one per core)
        self.device = torch.device(device)
        self.kind = SUFFIXES.get(self.weights.suffix.lower())
        if self.kind is None:
            raise BackendError(f"--weights {self.weights}: unknown format '{self.weights.suffix}' "
                               f"(use {', '.join(SUFFIXES)})")
        if not self.weights.is_file():
            raise BackendError(f"--weights {self.weights} not found")
        if half and self.device.type != "cuda":
            raise BackendError("--half needs a CUDA device (--device 0); half precision is not used on CPU")
        if half and self.kind != "pt":
            raise BackendError(f"--half: {self.weights.name} is a float32 export; use --half with .pt weights")
        self.half = half
        self.img_size: tuple[int, int] | None = None  # fixed input size of a static export (h, w)
        self.batch_size: int | None = None  # fixed batch of a static export
        self.dynamic = True
        getattr(self, f"_load_{self.kind}")(trusted)

    def _load_pt(self, trusted: bool) -> None:
        from utils.checkpoint import load_model

        model, _ = load_model(self.weights, self.device, fuse=True, trusted=trusted)
        self.model = model.half() if self.half else model
        self.stride = int(model.stride.max())
        self.names = list(model.names)

    def _load_torchscript(self, trusted: bool) -> None:
        extra = {TORCHSCRIPT_CONFIG: ""}
        try:
            with quiet_jit_warnings():
                model = torch.jit.load(str(self.weights), map_location="cpu", _extra_files=extra)
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"{self.weights} is not a readable TorchScript file ({str(e).splitlines()[0][:200]})") \
                from None
        meta = self._apply_metadata({"config": extra[TORCHSCRIPT_CONFIG] or "{}"})
        traced_on = meta.get("device", "cpu")
        if traced_on != self.device.type:  # a trace keeps the device of the tensors it created
            raise BackendError(f"{self.weights} was exported on {traced_on} and runs only there; use --device "
                               f"{'cpu' if traced_on == 'cpu' else '0'} or export again with --device {self.device}")
        self.model = model.to(self.device)

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
            options.intra_op_num_threads = self.onnx_threads
            self.session = onnxruntime.InferenceSession(str(self.weights), options, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for bad files
            raise BackendError(f"{self.weights} is not a readable ONNX file ({str(e).splitlines()[0][:200]})") \
                from None
        self.input_name = self.session.get_inputs()[0].name
        meta = dict(self.session.get_modelmeta().custom_metadata_map)
        self._apply_metadata({k: v for k, v in meta.items() if k in ("stride", "names", "img_size", "batch_size",
                                                                       "dynamic", "device")})
        shape = self.session.get_inputs()[0].shape  # symbolic dims are strings
        self.dynamic = not all(isinstance(d, int) for d in shape[2:])
        self.batch_size = shape[0] if isinstance(shape[0], int) else None
        if not self.dynamic:
            self.img_size = (int(shape[2]), int(shape[3]))

    def _apply_metadata(self, raw: dict[str, str | bytes]) -> dict[str, Any]:
        """Read the JSON metadata export.py wrote (TorchScript: one 'config' document; ONNX: one value a key)."""
        try:
            meta: dict[str, Any] = json.loads(raw["config"]) if "config" in raw else \
                {k: json.loads(v) for k, v in raw.items()}
        except (ValueError, TypeError):
            meta = {}
        if not isinstance(meta, dict) or "stride" not in meta or "names" not in meta:
            raise BackendError(f"{self.weights} carries no stride/class-name metadata; re-export it with export.py")
        self.stride = int(meta["stride"])
        self.names = [str(n) for n in meta["names"]]
        self.dynamic = bool(meta.get("dynamic", False))
        self.batch_size = None if self.dynamic else int(meta.get("batch_size", 1))
        if not self.dynamic and meta.get("img_size"):
            self.img_size = (int(meta["img_size"][0]), int(meta["img_size"][1]))
        return meta

    @property
    def dtype(self) -> torch.dtype:
        """The input dtype the model expects."""
        return torch.float16 if self.half else torch.float32

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
        if self.kind == "onnx":
            array = images.detach().cpu().numpy().astype(np.float32, copy=False)
            output = self.session.run(None, {self.input_name: array})[0]
            return torch.from_numpy(output).to(self.device)
        output = self.model(images.to(self.device, self.dtype))
        return output[0] if isinstance(output, (list, tuple)) else output

    def warmup(self, img_size: tuple[int, int] = (640, 640)) -> None:
        """One forward pass on zeros, so the first timed image does not pay for lazy initialisation."""
        shape = self.img_size or img_size
        self(torch.zeros(self.batch_size or 1, 3, *shape, device=self.device, dtype=self.dtype))
