"""The formats export.py writes: TorchScript, ONNX (optionally simplified) and OpenVINO, each with the metadata
utils/backends.DetectBackend reads back (stride, class names, input size, head layout).

Every exporter has the signature ``(model, images, file, meta, opt) -> Path`` and writes ``file``; the optional
packages (onnx, onnxslim/onnxsim, openvino) are imported only by the exporter that needs them.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
from collections.abc import Callable, Collection
from pathlib import Path

import torch
import yaml

from utils.deploy.runtime import OPENVINO_SUFFIX, quiet_jit_warnings
from utils.errors import UserError

FORMATS = ("torchscript", "onnx", "openvino")
SIMPLIFIERS = ("onnxslim", "onnxsim")  # --simplify uses the first one installed


class ExporterError(UserError, RuntimeError):
    """An export option this installation cannot serve; the message says what to install or change."""


def output_path(fmt: str, weights: Path) -> Path:
    """Where ``fmt`` is written next to ``weights``: best.torchscript, best.onnx, best_openvino_model/."""
    if fmt == "openvino":
        return weights.with_name(weights.stem + OPENVINO_SUFFIX)
    return weights.with_suffix(f".{fmt}")


def onnx_export_parameters() -> Collection[str]:
    """The keyword names of this torch's torch.onnx.export (torch 2.4 has no ``dynamo``)."""
    return inspect.signature(torch.onnx.export).parameters.keys()


def onnx_export_kwargs(opt: argparse.Namespace, parameters: Collection[str] | None = None) -> dict:
    """torch.onnx.export's keywords for these options, only those ``parameters`` (this torch's) has."""
    parameters = onnx_export_parameters() if parameters is None else parameters
    kwargs: dict = {"opset_version": opt.opset, "input_names": ["images"], "output_names": ["output0"],
                    "verbose": bool(opt.verbose)}
    if "dynamo" in parameters:
        kwargs["dynamo"] = opt.dynamo
    elif opt.dynamo:
        raise ExporterError(f"--dynamo needs torch 2.5 or newer (this is torch {torch.__version__}); drop --dynamo")
    if opt.dynamic and opt.dynamo:
        dim = torch.export.Dim
        kwargs["dynamic_shapes"] = ({0: dim("batch", min=1, max=1024), 2: dim.AUTO, 3: dim.AUTO},)
    elif opt.dynamic:
        kwargs["dynamic_axes"] = {"images": {0: "batch", 2: "height", 3: "width"},
                                  "output0": {0: "batch", 1: "anchors"}}
    return kwargs


def installed_simplifier() -> str | None:
    """The first of onnxslim, onnxsim that is installed, or None."""
    return next((name for name in SIMPLIFIERS if importlib.util.find_spec(name) is not None), None)


def simplify_onnx(proto: object) -> object:
    """The ONNX model simplified by onnxslim (or onnxsim): constants folded, redundant nodes removed."""
    name = installed_simplifier()
    if name is None:
        raise ExporterError("--simplify needs onnxslim or onnxsim: pip install onnxslim")
    if name == "onnxslim":
        import onnxslim

        return onnxslim.slim(proto)
    import onnxsim

    simplified, valid = onnxsim.simplify(proto)
    if not valid:
        raise RuntimeError("onnxsim could not validate the simplified model")
    return simplified


def export_torchscript(model: torch.nn.Module, images: torch.Tensor, file: Path, meta: dict, opt) -> Path:
    """torch.jit.trace of the fused model; metadata as JSON in the archive's config.txt."""
    with quiet_jit_warnings():
        traced = torch.jit.trace(model, images, strict=False, check_trace=False)  # verified by export.py
        torch.jit.save(traced, str(file), _extra_files={"config.txt": json.dumps(meta)})
    return file


def export_onnx(model: torch.nn.Module, images: torch.Tensor, file: Path, meta: dict, opt) -> Path:
    """torch.onnx.export (TorchScript-based exporter unless --dynamo), --simplify, then stride/names as
    metadata_props."""
    import onnx

    with quiet_jit_warnings():
        torch.onnx.export(model, (images,), str(file), **onnx_export_kwargs(opt))
    proto = onnx.load(str(file))
    if opt.simplify:
        proto = simplify_onnx(proto)
    onnx.checker.check_model(proto)
    del proto.metadata_props[:]
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    onnx.save(proto, str(file))
    return file


def export_openvino(model: torch.nn.Module, images: torch.Tensor, folder: Path, meta: dict, opt) -> Path:
    """``<stem>_openvino_model/`` with <stem>.xml and .bin (converted from this export's ONNX; FP16 weights with
    --half) and <stem>.yaml holding the metadata, as YOLOv5 lays it out."""
    import openvino

    stem = folder.name.removesuffix(OPENVINO_SUFFIX)
    folder.mkdir(parents=True, exist_ok=True)
    onnx_file = export_onnx(model, images, folder / f"{stem}.onnx", meta, opt)
    try:
        converted = openvino.Core().read_model(str(onnx_file))
        openvino.save_model(converted, str(folder / f"{stem}.xml"), compress_to_fp16=bool(opt.half))
    finally:
        onnx_file.unlink(missing_ok=True)
    (folder / f"{stem}.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return folder


EXPORTERS: dict[str, Callable[..., Path]] = {"torchscript": export_torchscript, "onnx": export_onnx,
                                             "openvino": export_openvino}
