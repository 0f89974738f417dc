"""The export formats: one ``ExportFormat`` object per format (name, file suffix, packages, export, tolerance, load
and run), all in one registry that export.py, detect.py, test.py, hubconf.py and the benchmarks read.

Adding a format is one module under utils/deploy/ that defines ``FORMAT = MyFormat()`` and one line in
``FORMAT_MODULES``; each module imports its optional packages only inside the methods that need them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import math
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils.errors import UserError
from utils.safe_yaml import YamlError, load_yaml, shown

FORMAT_MODULES = ("utils.deploy.pytorch", "utils.deploy.torchscript", "utils.deploy.onnx", "utils.deploy.openvino",
                  "utils.deploy.ncnn", "utils.deploy.coreml", "utils.deploy.saved_model", "utils.deploy.tflite")
REFUSED_FORMATS = {  # YOLOv5 names whose tools do not install from the package registries or run here
    "edgetpu": "the Edge TPU compiler is a Debian package for x86-64 from Google's apt repository, not on PyPI",
    "tfjs": "tensorflowjs 4.22 installs tensorflow 2.19, which downgrades numpy below 2.2 and protobuf to 5.x",
    "paddle": "not implemented in this project; export onnx and convert it with x2paddle --framework onnx",
}


class FormatError(UserError, RuntimeError):
    """A format this installation or these options cannot serve; the message says what to install or change."""


ONNX_OPSET = 17  # export.py's default --opset
DYNAMO_OPSET = 18  # with --dynamo: torch.export's ONNX exporter writes opset 18 operators (Split's num_outputs)


@dataclass(frozen=True)
class ExportOptions:
    """What an export is asked for (export.py builds it from its flags; the library reads nothing else)."""

    img_size: tuple[int, int] = (640, 640)
    batch_size: int = 1
    half: bool = False  # FP16 weights and input
    int8: bool = False  # INT8 post-training quantization, calibrated on images of ``data``
    dynamic: bool = False  # dynamic batch and image size
    simplify: bool = False  # ONNX graph simplification (onnxslim / onnxsim)
    opset: int = ONNX_OPSET
    dynamo: bool = False  # torch.export-based ONNX exporter
    verbose: bool = False
    data: str | None = None  # the data YAML whose images calibrate --int8 and measure its mAP
    calib_images: int = 64  # at most this many training images calibrate --int8
    verify_images: int = 128  # at most this many validation images measure --int8's mAP


@dataclass(frozen=True)
class LoadOptions:
    """How to open a file for inference."""

    device: torch.device = torch.device("cpu")
    half: bool = False  # .pt only: run in FP16 (CUDA)
    trusted: bool = False  # --trust-weights: .pt files may hold pickled code; TorchScript files always hold code
    threads: int = 0  # the runtime's intra-op threads (0: its default)


@dataclass
class LoadedModel:
    """A format's opened file: ``run`` maps a float batch (b, 3, h, w) to the decoded predictions (b, n, columns of
    the output contract its metadata records), followed by its task's other outputs (a segmenter's prototypes
    (b, nm, h', w'))."""

    run: Callable[[torch.Tensor], torch.Tensor | tuple[torch.Tensor, ...]]
    meta: dict[str, Any]  # what export_metadata wrote (stride, names, img_size, ...)
    input_shape: list[int | str] | None = None  # the runtime's own input shape; strings are symbolic dims
    input_dtype: torch.dtype = torch.float32
    module: nn.Module | None = None  # the torch module itself (.pt), used as is by evaluate()


@dataclass(frozen=True)
class Tolerance:
    """How far a float export may be from PyTorch: boxes as a fraction of the input's longer side (so the limit
    does not grow with the image size), objectness and class scores (probabilities) absolutely."""

    box: float
    score: float

    def describe(self) -> str:
        return f"boxes {self.box:.0e} x image size, scores {self.score:.0e}"


FLOAT_TOLERANCE = Tolerance(box=1e-4, score=1e-3)  # fp32 runtimes: kernel-order noise (0.06 px at 640)
HALF_TOLERANCE = Tolerance(box=2e-3, score=1e-2)  # fp16 weights and arithmetic (11-bit mantissa)
MAX_INT8_MAP_DROP = 0.03  # --int8: mAP@.5:.95 on --data may be at most this much below the float model's


def missing_packages(packages: tuple[tuple[str, str], ...]) -> list[str]:
    """The pip names of ``packages`` ((import name, pip name), ...) that are not installed."""
    return [pip for module, pip in packages if importlib.util.find_spec(module) is None]


def require(packages: tuple[tuple[str, str], ...], purpose: str) -> None:
    """FormatError naming what to pip install when any of ``packages`` is missing. Loads torch's compiler stack
    first: once TensorFlow (imported by coremltools and our TF formats) is loaded, a later import of triton (torchvision
    and torch._dynamo import it) crashes the process (triton 3.8, TensorFlow 2.21); in the other order both work."""
    import torch._dynamo  # noqa: F401  (loads triton where it is installed)

    missing = missing_packages(packages)
    if missing:
        raise FormatError(f"{purpose} needs {', '.join(missing)}: pip install {' '.join(missing)} "
                          "(or pip install -r requirements-export.txt)")


class ExportFormat:
    """One format. Subclasses set the class attributes and implement export() and load()."""

    name: str = ""
    suffix: str = ""  # ".onnx" for a file, "_openvino_model" for a folder (is_folder)
    is_folder: bool = False
    export_packages: tuple[tuple[str, str], ...] = ()  # (import name, pip name) needed to write the format
    runtime_packages: tuple[tuple[str, str], ...] = ()  # needed to run it
    exportable: bool = True  # False for the .pt itself
    runs_here: bool = True  # False where no runtime exists on this OS (CoreML on Linux)
    runs_where: str = ""  # where it runs instead, when not here
    supports_half: bool = False
    half_on_cpu: bool = False  # --half needs no CUDA: FP16 weights in a file that computes in FP32 (TFLite)
    supports_int8: bool = False
    supports_dynamic: bool = False

    def output_path(self, weights: Path, options: ExportOptions | None = None) -> Path:
        """Where this format is written next to ``weights`` (best.pt -> best.onnx, best-int8.onnx, ...)."""
        stem = weights.stem + ("-int8" if options is not None and options.int8 else "")
        return weights.with_name(stem + self.suffix)

    def matches(self, path: Path) -> bool:
        """Whether ``path`` (a file or folder) is this format."""
        return path.name.lower().endswith(self.suffix)

    def check(self, options: ExportOptions) -> None:
        """FormatError (one line) when these options or this installation cannot write the format."""
        unsupported = [flag for flag, wanted, ok in (("--half", options.half, self.supports_half),
                                                     ("--int8", options.int8, self.supports_int8),
                                                     ("--dynamic", options.dynamic, self.supports_dynamic)) if
                       wanted and not ok]
        if unsupported:
            raise FormatError(f"--include {self.name} does not support {' '.join(unsupported)}")
        require(self.export_packages, f"--include {self.name}")

    def tolerance(self, options: ExportOptions) -> Tolerance:
        """The largest difference from PyTorch a float export of these options may show."""
        return HALF_TOLERANCE if options.half else FLOAT_TOLERANCE

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        """Write ``file`` from the fused eval ``model`` traced on ``images``; ``calibration`` gives --int8's
        batches."""
        raise NotImplementedError

    def load(self, file: Path, options: LoadOptions) -> LoadedModel:
        """Open ``file`` for inference."""
        raise NotImplementedError

    def read_back(self, file: Path) -> dict[str, Any]:
        """For a format without a runtime here: its inputs {name: shape}, outputs [names] and metadata, as its own
        tools read them from the written file."""
        raise NotImplementedError


def export_metadata(model: nn.Module, img_size: tuple[int, int], batch_size: int, dynamic: bool,
                    half: bool = False) -> dict:
    """What an exported file must carry for detect.py and test.py: stride, class names, input size, dynamic or
    not, device, input precision, the head's layout (strides per level, anchors per cell: --augment) and the head's
    own export metadata under ``head`` (its output contract, strides, anchors where it has them, ...), from which
    the runtime post-processes (a file without it is a YOLOv5 detector's)."""
    head = model.head.export_metadata()
    anchors = head.get("anchors") or [[None]]  # per level, (anchors per cell) pairs; anchor-free: one row per cell
    return {"stride": int(model.stride.max()), "names": [str(n) for n in model.names],
            "img_size": [int(img_size[0]), int(img_size[1])], "batch_size": int(batch_size), "dynamic": bool(dynamic),
            "device": next(model.parameters()).device.type, "strides": [float(s) for s in model.stride.tolist()],
            "num_anchors": len(anchors[0]), "half": bool(half), "head": head}


OUTPUT_NAMES = tuple(f"output{i}" for i in range(8))  # the rows, then the task's other outputs, in order


def output_count(model: nn.Module) -> int:
    """How many outputs an export of ``model`` has: the rows, then its task's other outputs (its contract's
    ``outputs``: a segmenter's prototypes)."""
    return len(model.head.contract.outputs)


MAX_METADATA_TEXT = 1 << 20  # bytes of an exported file's metadata text (80 class names: ~1 KB)
METADATA_BOUNDS = {"stride": 1024, "classes": 10_000, "name": 128, "side": 16_384, "batch": 1024, "levels": 8,
                   "anchors": 32, "anchor": 1e5, "head_list": 1024}


def parse_json_metadata(text: str | bytes, source: object) -> Any:
    """Metadata text stored as JSON in an exported file, within MAX_METADATA_TEXT; one FormatError line otherwise
    (too long, not JSON, nested deep enough to exhaust the stack, a number over Python's digit limit)."""
    if len(text) > MAX_METADATA_TEXT:
        raise FormatError(f"{source}: its metadata is larger than {MAX_METADATA_TEXT} bytes; re-export it")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{source}: its metadata is not valid JSON ({type(e).__name__}); re-export it") from None


def read_metadata_yaml(path: Path, source: object) -> Any:
    """The YAML metadata file of an exported folder (OpenVINO, NCNN) through the bounded reader: {} when there is
    none, one FormatError line when it cannot be read."""
    if not path.is_file():
        return {}
    try:
        return load_yaml(path)
    except YamlError as e:
        raise FormatError(f"{source}: its metadata cannot be read ({e}); re-export it with export.py") from None


def _whole(value: Any, low: float, high: float) -> int | None:
    """``value`` as an int when it is a finite whole number (not a bool) in [low, high], else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if low <= value <= high else None


def _positive(value: Any, high: float) -> float | None:
    """``value`` as a float when it is a finite number (not a bool) in (0, high], else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if 0 < value <= high else None


def _names(value: Any) -> list[str] | None:
    """Class names as a list of plain one-line strings, from a list or a {0: name, ...} mapping; None if not."""
    if isinstance(value, dict):
        keys = {k: int(k) for k in value if (isinstance(k, int) and not isinstance(k, bool)) or
                (isinstance(k, str) and re.fullmatch(r"\d{1,6}", k))}
        if len(keys) != len(value) or sorted(keys.values()) != list(range(len(value))):
            return None
        value = [value[k] for k in sorted(keys, key=keys.get)]
    if not isinstance(value, list) or not 1 <= len(value) <= METADATA_BOUNDS["classes"]:
        return None
    names = [str(n) for n in value if isinstance(n, str | int | float) and not isinstance(n, bool)]
    ok = len(names) == len(value) and all(0 < len(n) <= METADATA_BOUNDS["name"] and n.isprintable() for n in names)
    return names if ok else None


def _anchors(value: Any) -> list[list[list[float]]] | None:
    """Anchors as levels of [w, h] pairs (the head's (nl, na, 2)), each a finite positive size; None if not."""
    if not isinstance(value, list) or not 1 <= len(value) <= METADATA_BOUNDS["levels"]:
        return None
    levels = []
    for level in value:
        if not isinstance(level, list) or not 1 <= len(level) <= METADATA_BOUNDS["anchors"]:
            return None
        pairs = [[_positive(v, METADATA_BOUNDS["anchor"]) for v in pair] if isinstance(pair, list) else [None]
                 for pair in level]
        if any(len(pair) != 2 or None in pair for pair in pairs):
            return None
        levels.append(pairs)
    return levels if len({len(level) for level in levels}) == 1 else None


def _plain_value(value: Any) -> Any:
    """A plain scalar of a head's metadata (a bool, a finite number, a short one-line string), else None."""
    if isinstance(value, bool) or (isinstance(value, int | float) and math.isfinite(value)):
        return value
    return value if isinstance(value, str) and len(value) <= 64 and value.isprintable() else None


def _head(value: Any) -> dict[str, Any] | None:
    """The head's own export metadata: at most 16 named fields; its ``contract`` a mapping of plain values (the
    runtime reads it through OutputContract.from_metadata), ``stride`` the strides, ``anchors`` as the top-level
    field, anything else a plain value, None, or a list of at most METADATA_BOUNDS["head_list"] plain values. None
    if not."""
    if not isinstance(value, dict) or len(value) > 16 or not all(isinstance(k, str) and len(k) <= 32 for k in value):
        return None
    checked: dict[str, Any] = {}
    for key, field in value.items():
        if key == "contract":
            plain = isinstance(field, dict) and len(field) <= 8 and \
                all(_plain_value(v) is not None for v in field.values())
            used = dict(field) if plain else None
        elif key == "stride":
            used = [_positive(s, METADATA_BOUNDS["stride"]) for s in field] if isinstance(field, list) and \
                1 <= len(field) <= METADATA_BOUNDS["levels"] else None
            used = None if used is None or None in used else used
        elif key == "anchors":
            used = _anchors(field)
        elif field is None:  # a setting the head does not have (a pose model without flip_idx)
            checked[key] = None
            continue
        elif isinstance(field, list):  # a short list of plain values (a pose model's kpt_shape, flip_idx)
            used = [_plain_value(v) for v in field] if len(field) <= METADATA_BOUNDS["head_list"] else None
            used = None if used is None or None in used else used
        else:
            used = _plain_value(field)
        if used is None:
            return None
        checked[key] = used
    return checked


def _check_field(key: str, value: Any) -> tuple[bool, Any, str]:
    """(valid, the value as used, what it must be) for one metadata field."""
    bounds = METADATA_BOUNDS
    checks: dict[str, tuple[Callable[[Any], Any], str]] = {
        "stride": (lambda v: _whole(v, 1, bounds["stride"]), f"a whole number in 1..{bounds['stride']}"),
        "names": (_names, f"1..{bounds['classes']} plain names of 1..{bounds['name']} printable characters"),
        "img_size": (lambda v: [_whole(s, 0, bounds["side"]) for s in v] if isinstance(v, list) and len(v) == 2
                     else None, f"[height, width], each in 0..{bounds['side']} (0: not fixed)"),
        "batch_size": (lambda v: _whole(v, 1, bounds["batch"]), f"a whole number in 1..{bounds['batch']}"),
        "strides": (lambda v: [_positive(s, bounds["stride"]) for s in v] if isinstance(v, list) and
                    1 <= len(v) <= bounds["levels"] else None, f"1..{bounds['levels']} numbers in (0, 1024]"),
        "num_anchors": (lambda v: _whole(v, 1, bounds["anchors"]), f"a whole number in 1..{bounds['anchors']}"),
        "anchors": (_anchors, f"1..{bounds['levels']} levels of the same number of [w, h] sizes in (0, 1e5]"),
        "dynamic": (lambda v: v if isinstance(v, bool) else None, "true or false"),
        "half": (lambda v: v if isinstance(v, bool) else None, "true or false"),
        "device": (lambda v: v if isinstance(v, str) and re.fullmatch(r"[a-z]{1,16}", v) else None, "a device type"),
        "weights": (lambda v: v if isinstance(v, str) and len(v) <= 16 else None, "a precision name"),
        "head": (_head, "a mapping of the head's fields (contract, stride, anchors, plain values)"),
    }
    check, expected = checks[key]
    used = check(value)
    return used is not None and (not isinstance(used, list) or None not in used), used, expected


def check_metadata(meta: Any, source: object) -> dict[str, Any]:
    """The metadata an exported file carries (export_metadata's keys, plus anchors), each field checked against
    METADATA_BOUNDS before anything uses it: one FormatError line naming the file and the field otherwise (stride 0,
    NaN, a huge or wrongly typed value). Unknown keys are dropped; ``nc``, when present, must match the names."""
    if not isinstance(meta, dict):
        raise FormatError(f"{source}: its metadata is not a mapping; re-export it with export.py")
    checked: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "nc" or not isinstance(key, str) or key not in METADATA_FIELDS:
            continue
        valid, used, expected = _check_field(key, value)
        if not valid:
            raise FormatError(f"{source}: metadata '{key}' {shown(value)} must be {expected}; re-export it with "
                              "export.py")
        checked[key] = used
    if "nc" in meta and ("names" not in checked or _whole(meta["nc"], 1, 1e9) != len(checked["names"])):
        raise FormatError(f"{source}: metadata 'nc' {shown(meta['nc'])} does not match its class names")
    if "anchors" in checked and "strides" in checked and len(checked["anchors"]) != len(checked["strides"]):
        raise FormatError(f"{source}: metadata 'anchors' has {len(checked['anchors'])} levels but 'strides' "
                          f"{len(checked['strides'])}; re-export it with export.py")
    return checked


METADATA_FIELDS = ("stride", "names", "img_size", "batch_size", "strides", "num_anchors", "anchors", "dynamic",
                   "half", "device", "weights", "head")


@contextlib.contextmanager
def quiet_jit_warnings() -> Iterator[None]:
    """torch.jit is deprecated since torch 2.9 but its files still load and run; keep its notices quiet."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.(jit|onnx).*deprecated")
        warnings.filterwarnings("ignore", message=r".*legacy TorchScript-based ONNX export")
        warnings.filterwarnings("ignore", message=r".*feature will be removed")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (runtimes raise long multi-line texts)."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, ExportFormat]:
    formats = [importlib.import_module(name).FORMAT for name in FORMAT_MODULES]
    return {fmt.name: fmt for fmt in formats}


def all_formats() -> list[ExportFormat]:
    """Every registered format, in FORMAT_MODULES order (the .pt first)."""
    return list(_registry().values())


def export_format_names() -> list[str]:
    """The names --include accepts."""
    return [fmt.name for fmt in all_formats() if fmt.exportable]


def get_format(name: str) -> ExportFormat:
    """The format called ``name``; FormatError listing the names otherwise."""
    found = _registry().get(name)
    if name in REFUSED_FORMATS:
        raise FormatError(f"--include {name} is not written here: {REFUSED_FORMATS[name]}")
    if name == "engine" and found is None:
        raise FormatError("--include engine builds a TensorRT engine, which needs a CUDA GPU: this machine has none"
                          if not torch.cuda.is_available() else "--include engine: TensorRT engines are not written "
                          "by this project yet; export onnx and build one with trtexec --onnx=best.onnx")
    if found is None or not found.exportable:
        raise FormatError(f"--include {name}: unknown format (choose from {', '.join(export_format_names())})")
    return found


def format_for(weights: Path) -> ExportFormat | None:
    """The format of a weights file or folder, by its suffix; None if no format claims it."""
    return next((fmt for fmt in all_formats() if fmt.matches(weights)), None)
