"""ONNX: torch.onnx.export (optionally simplified), stride/names as metadata_props, run by onnxruntime; --int8 is
ONNX Runtime's static quantization (QDQ, per-channel weights) calibrated on images of --data."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np
import torch
from torch import nn

from utils.deploy.formats import (
    ExportFormat,
    ExportOptions,
    FormatError,
    LoadedModel,
    LoadOptions,
    first_line,
    parse_json_metadata,
    quiet_jit_warnings,
    require,
)

SIMPLIFIERS = (("onnxslim", "onnxslim"), ("onnxsim", "onnxsim"))  # --simplify uses the first one installed
METADATA_KEYS = ("stride", "names", "img_size", "batch_size", "dynamic", "device", "strides", "num_anchors", "half")


def onnx_export_parameters() -> Collection[str]:
    """The keyword names of this torch's torch.onnx.export (torch 2.4 has no ``dynamo``)."""
    return inspect.signature(torch.onnx.export).parameters.keys()


def onnx_export_kwargs(options: ExportOptions, parameters: Collection[str] | None = None) -> dict:
    """torch.onnx.export's keywords for these options, only those ``parameters`` (this torch's) has."""
    parameters = onnx_export_parameters() if parameters is None else parameters
    kwargs: dict = {"opset_version": options.opset, "input_names": ["images"], "output_names": ["output0"],
                    "verbose": bool(options.verbose)}
    if "dynamo" in parameters:
        kwargs["dynamo"] = options.dynamo
    elif options.dynamo:
        raise FormatError(f"--dynamo needs torch 2.5 or newer (this is torch {torch.__version__}); drop --dynamo")
    if options.dynamic and options.dynamo:
        dim = torch.export.Dim
        kwargs["dynamic_shapes"] = ({0: dim("batch", min=1, max=1024), 2: dim.AUTO, 3: dim.AUTO},)
    elif options.dynamic:
        kwargs["dynamic_axes"] = {"images": {0: "batch", 2: "height", 3: "width"},
                                  "output0": {0: "batch", 1: "anchors"}}
    return kwargs


def installed_simplifier() -> str | None:
    """The first of onnxslim, onnxsim that is installed, or None."""
    import importlib.util

    return next((name for name, _ in SIMPLIFIERS if importlib.util.find_spec(name) is not None), None)


def simplify_onnx(proto: object) -> object:
    """The ONNX model simplified by onnxslim (or onnxsim): constants folded, redundant nodes removed."""
    name = installed_simplifier()
    if name is None:
        raise FormatError("--simplify needs onnxslim or onnxsim: pip install onnxslim")
    if name == "onnxslim":
        import onnxslim

        return onnxslim.slim(proto)
    import onnxsim

    simplified, valid = onnxsim.simplify(proto)
    if not valid:
        raise RuntimeError("onnxsim could not validate the simplified model")
    return simplified


def write_onnx(model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions) -> Path:
    """The float ONNX file (also the first step of OpenVINO, TFLite and --int8): checked, metadata attached."""
    import onnx

    with quiet_jit_warnings():
        torch.onnx.export(model, (images,), str(file), **onnx_export_kwargs(options))
    proto = onnx.load(str(file))
    if options.simplify:
        proto = simplify_onnx(proto)
    onnx.checker.check_model(proto)
    set_metadata(proto, meta)
    onnx.save(proto, str(file))
    return file


def set_metadata(proto: object, meta: dict) -> None:
    """Replace an ONNX model's metadata_props with ``meta`` (values as JSON)."""
    del proto.metadata_props[:]
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)


def quantize_onnx(float_file: Path, file: Path, batches: list[torch.Tensor], meta: dict) -> Path:
    """ONNX Runtime static INT8 quantization of ``float_file`` into ``file``: QDQ nodes, per-channel weights, uint8
    activations calibrated (min-max) on ``batches``; the head's box decoding stays float (pixels need range)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.pending = [{"images": b.cpu().numpy().astype(np.float32)} for b in batches]

        def get_next(self) -> dict | None:
            return self.pending.pop(0) if self.pending else None

    proto = onnx.load(str(float_file))
    quantize_static(str(float_file), str(file), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    nodes_to_exclude=head_decoding_nodes(proto))
    quantized = onnx.load(str(file))
    set_metadata(quantized, meta)
    onnx.save(quantized, str(file))
    return file


def head_decoding_nodes(proto: object) -> list[str]:
    """The nodes after the Detect head's convolutions (sigmoid, grid and anchor arithmetic, concat)."""
    convs = [node for node in proto.graph.node if node.op_type == "Conv"]
    head = convs[-1].name.rsplit("/", 2)[0] if convs and "/" in convs[-1].name else None
    if head is None:
        return []
    return [node.name for node in proto.graph.node if node.name.startswith(head + "/") and node.op_type != "Conv"]


class OnnxFormat(ExportFormat):
    """``best.onnx`` (``best-int8.onnx`` with --int8), run by onnxruntime on the CPU or CUDA."""

    name = "onnx"
    suffix = ".onnx"
    export_packages = (("onnx", "onnx"),)
    runtime_packages = (("onnxruntime", "onnxruntime"),)
    supports_half = supports_int8 = supports_dynamic = True

    def check(self, options: ExportOptions) -> None:
        super().check(options)
        onnx_export_kwargs(options)  # refuses --dynamo on a torch without it
        if options.int8:
            require(self.runtime_packages, "--include onnx --int8")

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        if not options.int8:
            return write_onnx(model, images, file, meta, options)
        float_file = file.with_name(file.stem + "-float.onnx")
        try:
            write_onnx(model, images, float_file, meta, options)
            return quantize_onnx(float_file, file, calibration(), meta)
        finally:
            float_file.unlink(missing_ok=True)

    def load(self, file: Path, options: LoadOptions) -> LoadedModel:
        require(self.runtime_packages, f"running {file.name}")
        import onnxruntime

        providers: list = ["CPUExecutionProvider"]
        if options.device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": options.device.index or 0}))
        try:
            session_options = onnxruntime.SessionOptions()
            session_options.intra_op_num_threads = options.threads
            session = onnxruntime.InferenceSession(str(file), session_options, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for bad files
            raise FormatError(f"{file} is not a readable ONNX file ({first_line(e)})") from None
        model_input = session.get_inputs()[0]
        raw = dict(session.get_modelmeta().custom_metadata_map)
        meta = {k: parse_json_metadata(v, file) for k, v in raw.items() if k in METADATA_KEYS}
        half = model_input.type == "tensor(float16)"

        def run(images: torch.Tensor) -> torch.Tensor:
            array = images.detach().cpu().numpy().astype(np.float16 if half else np.float32, copy=False)
            return torch.from_numpy(np.asarray(session.run(None, {model_input.name: array})[0]))

        return LoadedModel(run, meta, list(model_input.shape), torch.float16 if half else torch.float32)


FORMAT = OnnxFormat()
