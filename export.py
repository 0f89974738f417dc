"""Export a trained detector to TorchScript, ONNX and OpenVINO, and prove each export gives PyTorch's output.

    python export.py --weights runs/train/exp/weights/best.pt --include torchscript onnx
    python export.py --weights best.pt --include onnx --dynamic --simplify --img-size 640
    python export.py --weights yolov5s.pt --include openvino     # release name: downloaded when missing

Files are written next to the weights with the same stem (best.pt -> best.torchscript, best.onnx,
best_openvino_model/). The model is fused and in eval mode, so the files return the decoded predictions
(b, n, 5 + nc). Each export is run on a real letterboxed image and compared with PyTorch before it is reported.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from utils.cli import (
    add_flags,
    add_refused_flags,
    check_refused_flags,
    collapse_weights,
    run_main,
    visible_options,
)
from utils.data.sources import letterbox_image
from utils.deploy.exporters import EXPORTERS, FORMATS, installed_simplifier, onnx_export_kwargs, output_path
from utils.deploy.runtime import DetectBackend, check_img_size, export_metadata, resolve_weights_arg
from utils.device import select_device
from utils.errors import UserError
from utils.log import LOGGER, colorstr, print_options, setup_logging
from utils.paths import IMG_SUFFIXES, ROOT
from utils.weights.checkpoint import load_model

MAX_ERROR = 1e-3  # the largest difference accepted between an export and PyTorch (see compare_outputs)
HALF_RELATIVE_ERROR = 2e-3  # --half: also accepted up to this fraction of the largest output (fp16 rounding)
REFUSED = ("data", "inplace", "optimize", "keras", "int8", "workspace", "nms", "agnostic_nms", "topk_per_class",
           "topk_all", "iou_thres", "conf_thres")  # YOLOv5 flags for formats this script does not write


class ExportError(UserError, RuntimeError):
    """One or more exports failed; the message names the formats and why."""


@dataclass
class ExportResult:
    """What the summary reports for one format."""

    format: str
    file: Path | None = None
    max_error: float | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def size_mb(self) -> float:
        """The file's size, or the sum of a folder's files (OpenVINO)."""
        if not self.file or not self.file.exists():
            return 0.0
        files = [self.file] if self.file.is_file() else [f for f in self.file.rglob("*") if f.is_file()]
        return sum(f.stat().st_size for f in files) / 1e6


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """export.py's options (``argv=None`` reads sys.argv)."""
    parser = argparse.ArgumentParser(prog="export.py", description="Export a trained detector to TorchScript, ONNX "
                                     "and OpenVINO")
    add_flags(parser, "weights", nargs={"weights": "+"})
    parser.add_argument("--include", nargs="+", default=["torchscript", "onnx"], help=f"formats: {', '.join(FORMATS)}")
    add_flags(parser, "img_size", "batch_size", batch_size=1)
    parser.add_argument("--half", action="store_true", help="FP16 export (CUDA only: --device 0)")
    parser.add_argument("--dynamic", action="store_true", help="dynamic batch and image size (ONNX axes)")
    parser.add_argument("--simplify", action="store_true", help="simplify the ONNX graph (ONNX, OpenVINO) with "
                        "onnxslim or onnxsim (pip install onnxslim)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    parser.add_argument("--dynamo", action="store_true", help="use the torch.export-based ONNX exporter (slower)")
    parser.add_argument("--verbose", action="store_true", help="print the ONNX exporter's graph")
    add_flags(parser, "device", "trust_weights", device="cpu")
    add_refused_flags(parser, *REFUSED)
    opt = parser.parse_args(argv)
    opt.weights = collapse_weights(opt.weights)
    return opt


def check_options(opt: argparse.Namespace) -> list[str]:
    """The validated formats (duplicates dropped); a UserError naming the flag otherwise."""
    check_refused_flags(opt)
    formats = list(dict.fromkeys(f.lower().lstrip(".") for f in opt.include))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ExportError(f"--include {' '.join(unknown)}: unknown format (choose from {', '.join(FORMATS)})")
    if opt.batch_size < 1:
        raise ExportError(f"--batch-size {opt.batch_size} must be at least 1")
    if opt.simplify and not {"onnx", "openvino"} & set(formats):
        raise ExportError("--simplify applies to ONNX graphs: add --include onnx (or openvino)")
    if opt.simplify and installed_simplifier() is None:
        raise ExportError("--simplify needs onnxslim or onnxsim, which are not installed: pip install onnxslim")
    if "openvino" in formats and importlib.util.find_spec("openvino") is None:
        raise ExportError("--include openvino needs the openvino package: pip install openvino")
    if {"onnx", "openvino"} & set(formats):
        onnx_export_kwargs(opt)  # refuses --dynamo on a torch without it
    return formats


def check_device(opt: argparse.Namespace, device: torch.device) -> None:
    """--half exports FP16 models, which only CUDA runs fast and PyTorch verifies there."""
    if opt.half and device.type != "cuda":
        raise ExportError(f"--half exports FP16 on CUDA only (this export runs on {device}); add --device 0, "
                          "or drop --half")


@functools.lru_cache(maxsize=1)
def sample_image() -> np.ndarray:
    """The first readable image in data/images (BGR); a synthetic scene when there is none."""
    for path in sorted((ROOT / "data" / "images").glob("*")):
        if path.suffix.lower() in IMG_SUFFIXES and (image := cv2.imread(str(path))) is not None:
            return image
    LOGGER.warning("WARNING: no sample image in data/images; checking exports on a synthetic image")
    from utils.data.synthetic import draw_sample, make_spec

    return draw_sample(np.random.default_rng(0), make_spec(img_size=(360, 480)))[0]


def example_batch(img_size: tuple[int, int], stride: int, batch_size: int, device: torch.device) -> torch.Tensor:
    """The example image ``batch_size`` times (later copies mirrored, so the rows differ), float in [0, 1]."""
    image = torch.from_numpy(letterbox_image(sample_image(), img_size, stride, auto=False)[0]).float() / 255
    rows = [image if i % 2 == 0 else image.flip(-1) for i in range(batch_size)]
    return torch.stack(rows).to(device)


def compare_outputs(reference: torch.Tensor, output: torch.Tensor) -> float:
    """Largest absolute difference over all columns: boxes in input pixels, objectness and class scores."""
    if reference.shape != output.shape:
        raise RuntimeError(f"output shape {tuple(output.shape)} differs from PyTorch's {tuple(reference.shape)}")
    return float((reference.float().cpu() - output.float().cpu()).abs().max())


def error_limit(reference: torch.Tensor, half: bool) -> float:
    """The largest difference accepted: MAX_ERROR, and for FP16 exports a share of the largest output too."""
    return max(MAX_ERROR, HALF_RELATIVE_ERROR * float(reference.float().abs().max())) if half else MAX_ERROR


def verify_export(file: Path, model: torch.nn.Module, checks: list[torch.Tensor], device: torch.device,
                  half: bool = False) -> float:
    """Run the exported file through DetectBackend on each example batch; the largest difference to PyTorch.
    RuntimeError when a batch differs by error_limit or more."""
    backend = DetectBackend(file, device)
    worst = 0.0
    with torch.no_grad():
        for images in checks:
            reference = model(images)
            error, limit = compare_outputs(reference, backend(images)), error_limit(reference, half)
            if not error < limit:
                raise RuntimeError(f"output differs from PyTorch by {error:.2e} (limit {limit:.0e})")
            worst = max(worst, error)
    return worst


def run_export(fmt: str, model: torch.nn.Module, weights: Path, checks: list[torch.Tensor], meta: dict,
               opt: argparse.Namespace) -> ExportResult:
    """Export one format and verify it; any failure is caught and returned with its reason."""
    result = ExportResult(fmt)
    start = time.perf_counter()
    LOGGER.info(f"{colorstr(fmt + ':')} exporting with torch {torch.__version__}...")
    try:
        result.file = EXPORTERS[fmt](model, checks[0], output_path(fmt, weights), meta, opt)
        result.max_error = verify_export(result.file, model, checks, checks[0].device, opt.half)
    except Exception as e:  # one failing format must not stop the others; the reason is reported
        result.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        LOGGER.info(f"{colorstr(fmt + ':')} export failure: {result.error}")
    else:
        LOGGER.info(f"{colorstr(fmt + ':')} export success, saved as {result.file} ({result.size_mb:.1f} MB), "
                    f"max error {result.max_error:.1e}")
    result.seconds = time.perf_counter() - start
    return result


def check_batches(opt: argparse.Namespace, img_size: tuple[int, int], stride: int,
                  device: torch.device) -> list[torch.Tensor]:
    """The example batch; with --dynamic also one at another batch size and image size."""
    checks = [example_batch(img_size, stride, opt.batch_size, device)]
    if opt.dynamic:
        other = (max(img_size[0] - 2 * stride, stride), img_size[1] + stride)
        checks.append(example_batch(other, stride, opt.batch_size + 1, device))
    return checks


def print_summary(results: list[ExportResult], seconds: float) -> None:
    """One row per format: file, size in MB and the largest difference from PyTorch (or why it failed)."""
    LOGGER.info(f"\nExport summary ({seconds:.1f}s):")
    LOGGER.info(f"{'format':<13}{'file':<50}{'size':>10}{'max error':>12}")
    for r in results:
        if r.error:
            LOGGER.info(f"{r.format:<13}FAILED: {r.error}")
        else:
            LOGGER.info(f"{r.format:<13}{str(r.file):<50}{r.size_mb:>7.1f} MB{r.max_error:>12.1e}")
    done = [r for r in results if not r.error]
    if done:
        LOGGER.info(f"Detect:   python detect.py --weights {done[-1].file}")


def export_weights(weights: Path, formats: list[str], device: torch.device,
                   opt: argparse.Namespace) -> list[ExportResult]:
    """Load one weights file (fused, FP16 with --half) and export and verify each format."""
    model, _ = load_model(weights, device, fuse=True, trusted=opt.trust_weights)
    for p in model.parameters():
        p.requires_grad_(False)
    stride = int(model.stride.max())
    img_size = check_img_size(opt.img_size, stride)
    meta = export_metadata(model, img_size, opt.batch_size, opt.dynamic, opt.half)
    checks = check_batches(opt, img_size, stride, device)
    if opt.half:
        model, checks = model.half(), [images.half() for images in checks]
    LOGGER.info(f"{colorstr('PyTorch:')} starting from {weights} with input shape {tuple(checks[0].shape)}"
                f"{' (FP16)' if opt.half else ''}")
    return [run_export(fmt, model, weights, checks, meta, opt) for fmt in formats]


def main(opt: argparse.Namespace) -> list[ExportResult]:
    """Export every --include format of every --weights file, verify each, print the summary; ExportError when
    any failed."""
    setup_logging(0)
    print_options("export", visible_options(opt))
    formats = check_options(opt)
    device = select_device(opt.device)
    check_device(opt, device)
    start = time.perf_counter()
    results = []
    for weights in opt.weights if isinstance(opt.weights, list) else [opt.weights]:
        results += export_weights(resolve_weights_arg(weights), formats, device, opt)
    print_summary(results, time.perf_counter() - start)
    failed = [r for r in results if r.error]
    if failed:
        raise ExportError("; ".join(f"{r.format} export failed ({r.error})" for r in failed))
    return results


if __name__ == "__main__":
    sys.exit(run_main(main, parse_opt(), "export"))
