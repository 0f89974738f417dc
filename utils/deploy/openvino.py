"""OpenVINO: ``<stem>_openvino_model/`` with <stem>.xml/.bin converted from this export's ONNX and <stem>.yaml
holding the metadata (YOLOv5's layout); --half stores FP16 weights, --int8 is NNCF post-training quantization."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from utils.deploy.formats import (
    ExportFormat,
    ExportOptions,
    FormatError,
    LoadedModel,
    LoadOptions,
    check_metadata,
    first_line,
    read_metadata_yaml,
    require,
)
from utils.deploy.onnx import MAX_TENSOR_BYTES, head_decoding_nodes, onnx_export_kwargs, write_onnx


def openvino_xml(weights: Path) -> Path:
    """The model file of an OpenVINO folder (or the .xml itself)."""
    if weights.is_file():
        return weights
    found = sorted(weights.glob("*.xml")) if weights.is_dir() else []
    if not found:
        raise FormatError(f"--weights {weights}: no OpenVINO .xml model in it; write one with "
                          "`python export.py --include openvino`")
    return found[0]


def quantize_openvino(converted: object, batches: list[torch.Tensor], float_names: list[str]) -> object:
    """NNCF's post-training INT8 quantization of an OpenVINO model, calibrated on ``batches``; the nodes named in
    ``float_names`` (the head's box decoding) get no quantizer and stay float.

    The performance preset (symmetric INT8 weights and activations) rather than the mixed one (asymmetric
    activations): the convolutions then need no zero-point compensation (measured 1.40x vs 1.24x faster than FP32
    on yolov5n at 160 px, docs/export.md "Every format side by side"). The graph is kept as read from ONNX (SiLU as
    Sigmoid and Multiply), not converted with SiLU as one Swish: OpenVINO's CPU plugin runs a Swish fused into an
    INT8 convolution slower than as a separate step (1.03-1.15x of FP32 against 1.40x, same section)."""
    import nncf

    dataset = nncf.Dataset([b.cpu().numpy().astype(np.float32) for b in batches])
    return nncf.quantize(converted, dataset, preset=nncf.QuantizationPreset.PERFORMANCE, subset_size=len(batches),
                         fast_bias_correction=True, ignored_scope=nncf.IgnoredScope(names=float_names, validate=False))


def check_openvino_sizes(model: object, xml: Path) -> None:
    """FormatError (one line) when any output of the model's ops has a static shape over MAX_TENSOR_BYTES (a
    Broadcast of a constant to 2^31 values in a 2 KB file, folded by compile_model), read from OpenVINO's own shape
    inference before anything is compiled; shapes that depend on the image stay unchecked."""
    for op in model.get_ordered_ops():
        for i in range(op.get_output_size()):
            shape = op.get_output_partial_shape(i)
            if shape.is_static:
                nbytes = math.prod(shape.to_shape()) * max(op.get_output_element_type(i).size, 1)
                if nbytes > MAX_TENSOR_BYTES:
                    raise FormatError(f"{xml}: {op.get_type_name()} {op.get_friendly_name()[:60]!r} would hold "
                                      f"{nbytes:,} bytes, more than {MAX_TENSOR_BYTES:,}; refused")


class OpenVinoFormat(ExportFormat):
    """``best_openvino_model/`` (``best-int8_openvino_model/`` with --int8), run by OpenVINO on the CPU."""

    name = "openvino"
    suffix = "_openvino_model"
    is_folder = True
    export_packages = (("onnx", "onnx"), ("openvino", "openvino"))
    runtime_packages = (("openvino", "openvino"),)
    supports_half = supports_int8 = supports_dynamic = True

    def matches(self, path: Path) -> bool:
        return path.name.endswith(self.suffix) or path.suffix.lower() == ".xml" or (
            path.is_dir() and any(path.glob("*.xml")))

    def check(self, options: ExportOptions) -> None:
        super().check(options)
        onnx_export_kwargs(options)
        if options.int8:
            require((("nncf", "nncf"),), "--include openvino --int8")

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        import openvino

        stem = file.name.removesuffix(self.suffix)
        file.mkdir(parents=True, exist_ok=True)
        onnx_file = write_onnx(model, images, file / f"{stem}.onnx", meta, options)
        try:
            converted = openvino.Core().read_model(str(onnx_file))
            if options.int8:
                import onnx

                head = head_decoding_nodes(onnx.load(str(onnx_file)))
                converted = quantize_openvino(converted, calibration(), head)
            openvino.save_model(converted, str(file / f"{stem}.xml"), compress_to_fp16=bool(options.half))
        finally:
            onnx_file.unlink(missing_ok=True)
        (file / f"{stem}.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
        return file

    def load(self, file: Path, options: LoadOptions) -> LoadedModel:
        require(self.runtime_packages, f"running {file.name}")
        import openvino

        xml = openvino_xml(file)
        meta = read_metadata_yaml(xml.with_suffix(".yaml"), file)
        if isinstance(meta, dict) and meta:
            meta = check_metadata(meta, file)  # before the runtime compiles anything
        core = openvino.Core()
        # f32: on CPUs with AMX/AVX512-BF16 OpenVINO otherwise computes float models in bfloat16 (measured 2.3e-4 x
        # image size box error at 160 px, beyond FLOAT_TOLERANCE); INT8 layers stay INT8 under this hint
        config: dict = {"INFERENCE_PRECISION_HINT": "f32"}
        if options.threads:
            config["INFERENCE_NUM_THREADS"] = options.threads
        try:
            model = core.read_model(str(xml))
            check_openvino_sizes(model, xml)  # before compile_model folds its constants
            compiled = core.compile_model(model, "CPU", config)  # OpenVINO runs on the CPU
        except RuntimeError as e:
            raise FormatError(f"{xml} is not a readable OpenVINO model ({first_line(e)})") from None
        model_input = compiled.input(0)
        half = model_input.get_element_type() == openvino.Type.f16
        shape = [d.get_length() if d.is_static else "?" for d in model_input.get_partial_shape()]

        def run(images: torch.Tensor) -> tuple[torch.Tensor, ...]:
            array = images.detach().cpu().numpy().astype(np.float16 if half else np.float32, copy=False)
            results = compiled(array)  # the rows, then a segmenter's prototypes (the ONNX file's output order)
            return tuple(torch.from_numpy(np.asarray(results[output])) for output in compiled.outputs)

        return LoadedModel(run, meta if isinstance(meta, dict) else {}, shape,
                           torch.float16 if half else torch.float32)


FORMAT = OpenVinoFormat()
