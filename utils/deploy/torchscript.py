"""TorchScript: torch.jit.trace of the fused model, metadata as JSON in the archive's config.txt (as YOLOv5)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

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
)
from utils.weights.untrusted import check_torchscript_trusted

CONFIG_FILE = "config.txt"  # the JSON metadata file inside a TorchScript archive


class TorchScriptFormat(ExportFormat):
    """``best.torchscript``; runs in PyTorch without the model's Python code, on the device it was traced on."""

    name = "torchscript"
    suffix = ".torchscript"
    supports_half = True
    supports_dynamic = True

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        with quiet_jit_warnings():
            traced = torch.jit.trace(model, images, strict=False, check_trace=False)  # verified by export.py
            torch.jit.save(traced, str(file), _extra_files={CONFIG_FILE: json.dumps(meta)})
        return file

    def load(self, file: Path, options: LoadOptions) -> LoadedModel:
        check_torchscript_trusted(file, options.trusted)  # loading one runs the code stored in it
        extra = {CONFIG_FILE: ""}
        try:
            with quiet_jit_warnings():
                model = torch.jit.load(str(file), map_location="cpu", _extra_files=extra)
        except (RuntimeError, ValueError) as e:
            raise FormatError(f"{file} is not a readable TorchScript file ({first_line(e)})") from None
        meta = parse_json_metadata(extra[CONFIG_FILE] or "{}", file)
        traced_on = meta.get("device", "cpu") if isinstance(meta, dict) else "cpu"
        if traced_on != options.device.type:  # a trace keeps the device of the tensors it created
            raise FormatError(f"{file} was exported on {traced_on} and runs only there; use --device "
                              f"{'cpu' if traced_on == 'cpu' else '0'} or export again with --device "
                              f"{options.device}")
        model = model.to(options.device)
        dtype = torch.float16 if isinstance(meta, dict) and meta.get("half") else torch.float32

        def run(images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
            return model(images.to(options.device, dtype))  # rows, or (rows, prototypes): the runtime checks them

        return LoadedModel(run, meta, input_dtype=dtype, module=None)


FORMAT = TorchScriptFormat()
