"""CoreML: ``<stem>.mlpackage`` (an ML program) converted by coremltools from a TorchScript trace, with the
metadata as user-defined strings; a segmenter's prototypes are its second output. Core ML runs only on Apple systems:
here the package is read back and checked
(input, output, metadata), not run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils.deploy.formats import (
    OUTPUT_NAMES,
    ExportFormat,
    ExportOptions,
    FormatError,
    output_count,
    parse_json_metadata,
    quiet_jit_warnings,
    require,
)


class CoreMLFormat(ExportFormat):
    """``best.mlpackage``: FP32 compute (FP16 with --half), fixed input shape."""

    name = "coreml"
    suffix = ".mlpackage"
    is_folder = True
    export_packages = (("coremltools", "coremltools"),)
    runs_here = False
    runs_where = "Core ML runs on macOS and iOS only; it is written and checked here, not run"
    supports_half = True

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        import coremltools as ct

        with quiet_jit_warnings():
            traced = torch.jit.trace(model.float(), images.float(), strict=False, check_trace=False)
        precision = ct.precision.FLOAT16 if options.half else ct.precision.FLOAT32
        converted = ct.convert(traced, inputs=[ct.TensorType(name="images", shape=tuple(images.shape))],
                               outputs=[ct.TensorType(name=name) for name in OUTPUT_NAMES[:output_count(model)]],
                               convert_to="mlprogram",
                               compute_precision=precision, minimum_deployment_target=ct.target.iOS15)
        for key, value in meta.items():
            converted.user_defined_metadata[key] = json.dumps(value)
        converted.save(str(file))
        return file

    def read_back(self, file: Path) -> dict[str, Any]:
        """What coremltools reads from the written package: input and output names and shapes, metadata."""
        require(self.export_packages, f"checking {file.name}")
        import coremltools as ct

        try:
            spec = ct.models.MLModel(str(file), skip_model_load=True).get_spec()
        except Exception as e:  # coremltools raises several types for unreadable packages
            raise FormatError(f"{file} is not a readable Core ML package ({str(e).splitlines()[0][:200]})") from None
        description = spec.description
        user = dict(description.metadata.userDefined)
        return {"inputs": {i.name: list(i.type.multiArrayType.shape) for i in description.input},
                "outputs": [o.name for o in description.output],
                "meta": {k: parse_json_metadata(v, file) for k, v in user.items()
                         if not k.startswith("com.github.apple")}}


FORMAT = CoreMLFormat()
