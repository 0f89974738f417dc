"""TensorFlow Lite: ``<stem>.tflite`` (FP32), ``<stem>-fp16.tflite`` (--half: float16 weights, float32
arithmetic) and ``<stem>-int8.tflite`` (--int8: full-integer, calibrated on images of --data), converted by
tf.lite.TFLiteConverter from our own translation (utils/deploy/tf_graph.py) and run by LiteRT (ai-edge-litert).

Input (b, h, w, 3) float32 in [0, 1] for all three: the INT8 file quantizes it in its first op and dequantizes its
outputs, so callers feed the same images. The float files return the decoded (b, n, columns) as the .pt does; the
INT8 file returns the head's maps (float32) and the boxes are decoded here in float (by the anchors for YOLOv5's
head, by the head's own decode rebuilt from its metadata for the others), because one 8-bit tensor
holding pixels (0..640) and probabilities (0..1) would step boxes by 2.5 px or scores by 0.4. The metadata
(stride, names, image size, anchors) is a JSON buffer in the flatbuffer's own metadata table, named
``yolo_metadata``. A segmenter's float file returns the rows and its prototypes (NHWC in the file, NCHW here); it
has no INT8 form.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    require,
)
from utils.deploy.head_maps import RawMapDecoder, head_from_metadata, recorded_contract
from utils.deploy.tf_graph import TENSORFLOW, import_tensorflow, nhwc_array, tf_module
from utils.tasks.registry import get_task

METADATA_NAME = "yolo_metadata"
TFLITE_IDENTIFIER = b"TFL3"


def with_metadata(flatbuffer: bytes, meta: dict) -> bytes:
    """The TFLite model ``flatbuffer`` with ``meta`` (JSON) added to its metadata table as ``yolo_metadata``."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(flatbuffer), 0)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = METADATA_NAME, len(model.buffers) - 1
    model.metadata = [m for m in model.metadata or [] if m.name != METADATA_NAME.encode()] + [entry]
    builder = flatbuffers.Builder(len(flatbuffer) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=TFLITE_IDENTIFIER)
    return bytes(builder.Output())


def read_metadata(flatbuffer: bytes, source: object = "the TFLite model") -> dict:
    """The ``yolo_metadata`` JSON of a TFLite flatbuffer ({} when it has none; FormatError when it is not JSON)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(flatbuffer, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name() == METADATA_NAME.encode():
            found = parse_json_metadata(bytes(model.Buffers(entry.Buffer()).DataAsNumpy()), source)
            return found if isinstance(found, dict) else {}
    return {}


def convert(tf: Any, module: Any, options: ExportOptions,
            calibration: Callable[[], list[torch.Tensor]] | None) -> bytes:
    """TFLiteConverter on the module's serving function: FP32; FP16 weights; or full-integer INT8 (every op int8,
    input and outputs float32) calibrated on ``calibration``'s batches."""
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
    if options.half or options.int8:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if options.half:
        converter.target_spec.supported_types = [tf.float16]
    if options.int8:
        batches = [nhwc_array(b) for b in calibration()]
        converter.representative_dataset = lambda: ([batch] for batch in batches)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.float32
    return converter.convert()


def maps_decoder(meta: dict, file: Path) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """How an INT8 file's head maps (NHWC, P3 first) become the rows of its contract, in float: an anchor-based
    head's by its anchors (the YOLOv5 Detect rebuilt from the metadata), any other head's by its own decode rebuilt
    from its export metadata (head_maps.RawMapDecoder); a one-line FormatError for a file that carries neither."""
    if "anchors" in meta:
        detect = head_from_metadata(meta, file)
        return lambda maps: detect.decode_into([x.permute(0, 3, 1, 2) for x in maps])  # seen as (b, na*no, ny, nx)
    if isinstance(meta.get("head"), dict):
        return RawMapDecoder(meta["head"], file)
    raise FormatError(f"{file} returns head maps but carries neither anchors nor its head's metadata; re-export it "
                      "with export.py")


class TfliteFormat(ExportFormat):
    """``best.tflite``, ``best-fp16.tflite``, ``best-int8.tflite``: fixed input shape, run by LiteRT on the CPU."""

    name = "tflite"
    suffix = ".tflite"
    runtime_packages = (("ai_edge_litert", "ai-edge-litert"),)
    export_packages = TENSORFLOW + runtime_packages
    supports_half = supports_int8 = True
    half_on_cpu = True

    def output_path(self, weights: Path, options: ExportOptions | None = None) -> Path:
        precision = "" if options is None else "-int8" if options.int8 else "-fp16" if options.half else ""
        return weights.with_name(weights.stem + precision + self.suffix)

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        tf = import_tensorflow()
        b, _, h, w = images.shape
        anchors = model.head.export_metadata().get("anchors")  # an anchor-based head's maps decode by its anchors
        module = tf_module(tf, model, (b, h, w, 3), raw_maps=options.int8)
        meta = {**meta, "half": False, **({"anchors": anchors} if anchors else {}),
                "weights": "int8" if options.int8 else "float16" if options.half else "float32"}
        file.write_bytes(with_metadata(convert(tf, module, options, calibration), meta))
        return file

    def load(self, file: Path, options: LoadOptions) -> LoadedModel:
        require(self.runtime_packages, f"running {file.name}")
        from ai_edge_litert.interpreter import Interpreter

        try:
            content = file.read_bytes()
            interpreter = Interpreter(model_content=content, num_threads=options.threads or None)
            interpreter.allocate_tensors()
            meta = read_metadata(content, file)
        except (ValueError, RuntimeError, IndexError, UnicodeDecodeError) as e:
            raise FormatError(f"{file} is not a readable TFLite model ({first_line(e)})") from None
        model_input = interpreter.get_input_details()[0]
        outputs = sorted(interpreter.get_output_details(), key=lambda d: -int(np.prod(d["shape"])))  # P3 first
        contract = recorded_contract(meta, file)
        several = len(contract.outputs) > 1
        if several:  # the rows (rank 3), then the task's other outputs (a segmenter's prototypes: rank 4, NHWC)
            outputs = sorted(outputs, key=lambda d: len(d["shape"]))
            if len(outputs) != len(contract.outputs) or len(outputs[0]["shape"]) != 3:
                raise FormatError(f"{file} is {get_task(contract.task).model_noun} but its outputs are not "
                                  f"{', '.join(contract.outputs)}; re-export it with export.py")
        decode = maps_decoder(meta, file) if len(outputs) > 1 and not several else None
        b, h, w, _ = (int(d) for d in model_input["shape"])

        def run(images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
            interpreter.set_tensor(model_input["index"], nhwc_array(images))
            interpreter.invoke()
            found = [torch.from_numpy(interpreter.get_tensor(d["index"]).copy()) for d in outputs]
            if several:  # NHWC maps back to NCHW
                return found[0], *(f.permute(0, 3, 1, 2) if f.dim() == 4 else f for f in found[1:])
            return found[0] if decode is None else decode(found)

        return LoadedModel(run, meta, [b, 3, h, w])


FORMAT = TfliteFormat()
