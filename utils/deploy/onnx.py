"""ONNX: torch.onnx.export (optionally simplified), stride/names as metadata_props, run by onnxruntime; --int8 is
ONNX Runtime's static quantization (QDQ, per-channel weights) calibrated on images of --data.

ONNX Runtime has no memory cap of its own for the CPU, and it computes a graph's constant expressions while it
creates the session: a 410-byte file whose ConstantOfShape asks for 2^31 floats takes gigabytes before anything
runs. So before a session is made, check_onnx_graph sizes the graph with ONNX's own shape inference (constants
propagated) and refuses, in one line, what is out of proportion: external data (other files), tensors computed
from constants alone larger together than CONSTANT_BUDGET x the file (+ CONSTANT_SLACK), and any tensor of known
shape above MAX_TENSOR_BYTES. Tensors whose size depends on the image fed in (a dynamic export) or on data values
stay unchecked: running a stranger's graph can still take memory (docs/security-paths.md)."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from utils.deploy.formats import (
    OUTPUT_NAMES,
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
CONSTANT_BUDGET = 16  # tensors computed from constants alone: at most this many times the file's size ...
CONSTANT_SLACK = 16 << 20  # ... plus this (a yolov5n export at 640 px: 0.4 MB of them in a 7.5 MB file)
MAX_TENSOR_BYTES = 2 << 30  # any one tensor of known shape (yolov5s at 640 px: 13 MB at most)
METADATA_KEYS = ("stride", "names", "img_size", "batch_size", "dynamic", "device", "strides", "num_anchors", "half",
                 "head")  # "head": the head's export metadata (output contract, ...)


def onnx_export_parameters() -> Collection[str]:
    """The keyword names of this torch's torch.onnx.export (torch 2.4 has no ``dynamo``)."""
    return inspect.signature(torch.onnx.export).parameters.keys()


def onnx_export_kwargs(options: ExportOptions, parameters: Collection[str] | None = None,
                       outputs: Sequence[str] = ("rows",)) -> dict:
    """torch.onnx.export's keywords for these options, only those ``parameters`` (this torch's) has; ``outputs``:
    the contract's outputs (the rows, then the task's others: a segmenter's prototypes)."""
    parameters = onnx_export_parameters() if parameters is None else parameters
    kwargs: dict = {"opset_version": options.opset, "input_names": ["images"],
                    "output_names": list(OUTPUT_NAMES[:len(outputs)]), "verbose": bool(options.verbose)}
    if "dynamo" in parameters:
        kwargs["dynamo"] = options.dynamo
        if options.dynamo and "external_data" in parameters:  # else its weights go to a second file, <file>.data
            kwargs["external_data"] = False
    elif options.dynamo:
        raise FormatError(f"--dynamo needs torch 2.5 or newer (this is torch {torch.__version__}); drop --dynamo")
    if options.dynamic and options.dynamo:
        dim = torch.export.Dim
        kwargs["dynamic_shapes"] = ({0: dim("batch", min=1, max=1024), 2: dim.AUTO, 3: dim.AUTO},)
    elif options.dynamic:
        kwargs["dynamic_axes"] = {"images": {0: "batch", 2: "height", 3: "width"},
                                  "output0": {0: "batch", 1: "anchors"},
                                  **{OUTPUT_NAMES[i]: {0: "batch", 2: f"{name}_height", 3: f"{name}_width"}
                                     for i, name in enumerate(outputs) if i}}
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

    if options.dynamic and options.dynamo and images.shape[0] == 1:  # torch.export fixes a dimension of size 1
        images = images.expand(2, *images.shape[1:])
    with quiet_jit_warnings():
        torch.onnx.export(model, (images,), str(file),
                          **onnx_export_kwargs(options, outputs=model.head.contract.outputs))
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
    """The head's decoding, left in float by --int8: every node of the head (the model's last layer, ``model.N``)
    that is no convolution and from which no convolution follows: the arithmetic after each branch's last
    convolution (sigmoids, distribution-focal sums, grid and anchor offsets, angles, keypoints, a classifier's
    pooling and linear layer, the rows' concat), never the activations between the branches' convolutions. Its
    rows mix pixels with scores and radians, which one INT8 scale cannot hold."""
    nodes = list(proto.graph.node)
    convs = [node for node in nodes if node.op_type == "Conv"]
    head = _top_module(convs[-1]) if convs else None
    if head is None:
        return []
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            consumers.setdefault(name, []).append(index)
    feeds_conv = [False] * len(nodes)
    for index in range(len(nodes) - 1, -1, -1):  # ONNX lists nodes in topological order: consumers come later
        feeds_conv[index] = any(nodes[j].op_type == "Conv" or feeds_conv[j]
                                for name in nodes[index].output for j in consumers.get(name, ()))
    return [node.name for node, feeds in zip(nodes, feeds_conv)
            if node.op_type != "Conv" and not feeds and _top_module(node) == head]


def _top_module(node: object) -> str | None:
    """The model layer (``model.23``) a node of our own export belongs to: the first part of its name under the
    TorchScript exporter (``/model.23/cv3.2/...``), of its recorded namespace under torch.export's (--dynamo:
    ``: models.yolo.Model/model.23: models....``)."""
    parts = node.name.split("/")
    if len(parts) >= 3 and not parts[0]:
        return parts[1]
    namespace = next((p.value for p in node.metadata_props if p.key == "namespace"), "").split("/")
    return namespace[1].split(":")[0] if len(namespace) > 2 else None


def _itemsize(elem_type: int) -> int:
    import onnx

    try:
        return max(int(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize), 1)
    except (KeyError, TypeError, ValueError):
        return 8


def _subgraphs(graph: object) -> list:
    """``graph`` and every graph nested in its nodes' attributes (If, Loop, Scan bodies)."""
    import onnx

    found, pending = [], [graph]
    while pending:
        current = pending.pop()
        found.append(current)
        for node in current.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    pending.append(attribute.g)
                elif attribute.type == onnx.AttributeProto.GRAPHS:
                    pending.extend(attribute.graphs)
    return found


def _refuse_external_and_sparse(proto: object, file: Path, budget: int) -> None:
    """FormatError for tensors stored in other files, or sparse constants whose dense size is over ``budget``."""
    import onnx

    for graph in _subgraphs(proto.graph):
        tensors = list(graph.initializer) + [a.t for n in graph.node for a in n.attribute if a.type == a.TENSOR]
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors):
            raise FormatError(f"{file} refers to tensor data in other files (external data); refused")
        sparse = list(graph.sparse_initializer) + [a.sparse_tensor for n in graph.node for a in n.attribute
                                                   if a.type == a.SPARSE_TENSOR]
        for tensor in sparse:
            dense = math.prod(tensor.dims) * _itemsize(tensor.values.data_type)
            if dense > budget:
                raise FormatError(f"{file}: a sparse constant of {dense:,} bytes when dense, out of proportion to "
                                  f"the file's {file.stat().st_size:,}; refused")


def _constant_names(graph: object) -> set[str]:
    """Names of the tensors computed from the graph's constants alone (what a runtime folds while loading)."""
    constant = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    for node in graph.node:
        inputs = [name for name in node.input if name]
        if all(name in constant for name in inputs) and not node.op_type.startswith("Random") and \
                node.domain in ("", "ai.onnx"):
            constant.update(name for name in node.output if name)
    return constant


def check_onnx_graph(file: Path) -> None:
    """Refuse (one FormatError line) an ONNX file whose graph would take memory out of proportion to its size
    before it runs: see this module's docstring. Reads the file once; never creates a session."""
    import onnx

    size = file.stat().st_size
    budget = CONSTANT_BUDGET * size + CONSTANT_SLACK
    try:
        proto = onnx.load(str(file), load_external_data=False)
        _refuse_external_and_sparse(proto, file, budget)
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except FormatError:
        raise
    except Exception as e:  # onnx raises its own types (DecodeError, InferenceError, ...) for bad files
        raise FormatError(f"{file} is not a readable ONNX file ({first_line(e)})") from None
    graph = inferred.graph
    constant = _constant_names(graph)
    known = {t.name: (list(t.dims), t.data_type) for t in graph.initializer}
    for info in list(graph.value_info) + list(graph.output):
        dims = info.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims) or info.type.tensor_type.HasField("shape") and not dims:
            known[info.name] = ([d.dim_value for d in dims], info.type.tensor_type.elem_type)
    folded = 0
    for name, (dims, elem_type) in known.items():
        nbytes = math.prod(max(d, 0) for d in dims) * _itemsize(elem_type)
        if nbytes > MAX_TENSOR_BYTES:
            raise FormatError(f"{file}: tensor {name[:60]!r} would hold {nbytes:,} bytes, more than "
                              f"{MAX_TENSOR_BYTES:,}; refused")
        folded += nbytes if name in constant else 0
    if folded > budget:
        raise FormatError(f"{file}: its constant expressions would take {folded:,} bytes, out of proportion to the "
                          f"file's {size:,} (at most {CONSTANT_BUDGET}x + {CONSTANT_SLACK >> 20} MB); refused")
    unsized = [n for n in graph.node if n.op_type in SIZED_BY_CONSTANTS and n.output and n.output[0] in constant
               and n.output[0] not in known]
    if unsized:
        raise FormatError(f"{file}: a constant {unsized[0].op_type} whose size cannot be found before running it; "
                          "refused")


SIZED_BY_CONSTANTS = ("ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Upsample", "OneHot", "Pad")


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

        check_onnx_graph(file)  # before ONNX Runtime folds its constants
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

        def run(images: torch.Tensor) -> tuple[torch.Tensor, ...]:
            array = images.detach().cpu().numpy().astype(np.float16 if half else np.float32, copy=False)
            return tuple(torch.from_numpy(np.asarray(out)) for out in session.run(None, {model_input.name: array}))

        return LoadedModel(run, meta, list(model_input.shape), torch.float16 if half else torch.float32)


FORMAT = OnnxFormat()
