"""Export a trained detector to the formats of utils/deploy (TorchScript, ONNX, OpenVINO, ...) and prove each
export gives PyTorch's output.

    python export.py --weights runs/train/exp/weights/best.pt --include torchscript onnx
    python export.py --weights best.pt --include onnx --dynamic --simplify --img-size 640
    python export.py --weights best.pt --include onnx openvino --int8 --data data/coco128.yaml
    python export.py --weights yolov5s.pt --include openvino     # release name: downloaded when missing
    python export.py --weights best.pt --include saved_model tflite --img-size 320
    python export.py --weights best.pt --include tflite --int8 --data data/coco128.yaml --calib-images 100

Files are written next to the weights with the same stem (best.pt -> best.torchscript, best.onnx,
best_openvino_model/, best-int8.onnx, best_saved_model/, best.tflite, best-fp16.tflite,
best-int8.tflite). The model is fused and in eval mode, so the files return the decoded predictions (b, n,
columns of the head's output contract, which each file records). Each float export is run on a real letterboxed
image and compared with PyTorch within its format's tolerance, as the contract lays the rows out; each --int8
export is compared by mAP on --data with the float model.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import utils.distributed.openmp  # noqa: F401  first: it sets OpenMP's wait before torch loads

# isort: split
import numpy as np
import torch

from utils import api
from utils.cli import (
    Parser,
    add_flags,
    add_refused_flags,
    check_refused_flags,
    collapse_weights,
    run_script,
    visible_options,
)
from utils.data.image_io import ImageRefused, read_image
from utils.data.sources import network_input
from utils.deploy.formats import (
    DYNAMO_OPSET,
    ONNX_OPSET,
    ExportFormat,
    ExportOptions,
    export_format_names,
    export_metadata,
    get_format,
)
from utils.deploy.onnx import installed_simplifier
from utils.deploy.runtime import check_img_size, resolve_weights_arg
from utils.deploy.verify import (
    Verification,
    calibration_batches,
    map_on_data,
    model_task,
    verify_float,
    verify_int8,
    verify_written,
)
from utils.device import one_device_warning, select_device
from utils.errors import UserError
from utils.log import LOGGER, colorstr, print_options, setup_logging
from utils.paths import IMG_SUFFIXES, ROOT
from utils.weights.checkpoint import load_model, trained_img_size

REFUSED = ("inplace", "optimize", "keras", "workspace", "nms", "agnostic_nms", "topk_per_class", "topk_all",
           "iou_thres", "conf_thres")  # YOLOv5 flags for features this script does not write


class ExportError(UserError, RuntimeError):
    """One or more exports failed; the message names the formats and why."""


@dataclass
class ExportResult:
    """What the summary reports for one format."""

    format: str
    file: Path | None = None
    verification: Verification | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def size_mb(self) -> float:
        """The file's size, or the sum of a folder's files (OpenVINO)."""
        if not self.file or not self.file.exists():
            return 0.0
        files = [self.file] if self.file.is_file() else [f for f in self.file.rglob("*") if f.is_file()]
        return sum(f.stat().st_size for f in files) / 1e6


def build_parser() -> argparse.ArgumentParser:
    """export.py's parser."""
    parser = Parser(prog="export.py", description="Export a trained detector to deployment "
                                     "formats, each verified against PyTorch")
    add_flags(parser, "weights", nargs={"weights": "+"})
    parser.add_argument("--include", nargs="+", default=["torchscript", "onnx"],
                        help=f"formats: {', '.join(export_format_names())}")
    add_flags(parser, "img_size", "batch_size", batch_size=1, img_size=None)
    parser.add_argument("--half", action="store_true", help="FP16 export (CUDA only: --device 0; "
                        "tflite: FP16 weights on any device)")
    parser.add_argument("--int8", action="store_true", help="INT8 post-training quantization (onnx, openvino, "
                        "tflite), "
                        "calibrated on --data's training images; verified by mAP on its validation images")
    parser.add_argument("--data", default=None, help="data YAML whose images calibrate and verify --int8")
    parser.add_argument("--calib-images", type=int, default=64, help="--int8: at most this many calibration images")
    parser.add_argument("--verify-images", type=int, default=128, help="--int8: at most this many validation "
                        "images for the mAP check")
    parser.add_argument("--dynamic", action="store_true", help="dynamic batch and image size (ONNX axes)")
    parser.add_argument("--simplify", action="store_true", help="simplify the ONNX graph (ONNX, OpenVINO) with "
                        "onnxslim or onnxsim (pip install onnxslim)")
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX opset version (default 17; 18 with --dynamo, the opset its exporter writes)")
    parser.add_argument("--dynamo", action="store_true", help="use the torch.export-based ONNX exporter (slower)")
    parser.add_argument("--verbose", action="store_true", help="print the ONNX exporter's graph")
    add_flags(parser, "device", "trust_weights", device="cpu")
    add_refused_flags(parser, *REFUSED)
    return parser


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """export.py's options (``argv=None`` reads sys.argv)."""
    opt = build_parser().parse_args(argv)
    opt.weights = collapse_weights(opt.weights)
    return opt


def export_options(opt: argparse.Namespace, img_size: tuple[int, int] = (640, 640)) -> ExportOptions:
    """The typed options the library reads, from export.py's flags."""
    return ExportOptions(img_size=img_size, batch_size=opt.batch_size, half=opt.half, int8=opt.int8,
                         dynamic=opt.dynamic, simplify=opt.simplify, dynamo=opt.dynamo,
                         opset=opt.opset if opt.opset is not None else DYNAMO_OPSET if opt.dynamo else ONNX_OPSET,
                         verbose=opt.verbose, data=opt.data, calib_images=opt.calib_images,
                         verify_images=opt.verify_images)


def check_options(opt: argparse.Namespace) -> list[ExportFormat]:
    """The validated formats (duplicates dropped); a UserError naming the flag otherwise."""
    check_refused_flags(opt)
    names = list(dict.fromkeys(f.lower().lstrip(".") for f in opt.include))
    formats = [get_format(name) for name in names]
    if opt.batch_size < 1:
        raise ExportError(f"--batch-size {opt.batch_size} must be at least 1")
    if opt.int8 and not opt.data:
        raise ExportError("--int8 calibrates on images and checks mAP on labels of a data set: add --data "
                          "(for example --data data/coco128.yaml)")
    if opt.int8 and opt.half:
        raise ExportError("--int8 and --half are two precisions: choose one")
    if opt.int8 and min(opt.calib_images, opt.verify_images) < 1:
        raise ExportError("--calib-images and --verify-images must be at least 1")
    if opt.simplify and not {"onnx", "openvino"} & set(names):
        raise ExportError("--simplify applies to ONNX graphs: add --include onnx (or openvino)")
    if opt.simplify and installed_simplifier() is None:
        raise ExportError("--simplify needs onnxslim or onnxsim, which are not installed: pip install onnxslim")
    options = export_options(opt)
    for fmt in formats:
        fmt.check(options)
    return formats


def check_device(opt: argparse.Namespace, device: torch.device, formats: list[ExportFormat]) -> None:
    """--half exports FP16 models, which only CUDA runs fast and PyTorch verifies there (TFLite's FP16 weights
    compute in FP32 anywhere, so they are verified against the FP32 model)."""
    if opt.half and device.type != "cuda" and not all(fmt.half_on_cpu for fmt in formats):
        raise ExportError(f"--half exports FP16 on CUDA only (this export runs on {device}); add --device 0, "
                          "or drop --half")


@functools.lru_cache(maxsize=1)
def sample_image() -> np.ndarray:
    """The first readable image in data/images (BGR); a synthetic scene when there is none."""
    for path in sorted((ROOT / "data" / "images").glob("*")):
        if path.suffix.lower() in IMG_SUFFIXES:
            with contextlib.suppress(ImageRefused):
                return read_image(path)
    LOGGER.warning("WARNING: no sample image in data/images; checking exports on a synthetic image")
    from utils.data.synthetic import draw_sample, make_spec

    return draw_sample(np.random.default_rng(0), make_spec(img_size=(360, 480)))[0]


def example_batch(img_size: tuple[int, int], stride: int, batch_size: int, device: torch.device) -> torch.Tensor:
    """The example image ``batch_size`` times (later copies mirrored, so the rows differ), float in [0, 1]."""
    image = torch.from_numpy(network_input(sample_image(), img_size, stride, auto=False)[0]).float() / 255
    rows = [image if i % 2 == 0 else image.flip(-1) for i in range(batch_size)]
    return torch.stack(rows).to(device)


class ExportJob:
    """One weights file being exported: the fused model, its example batches and metadata, the options; the
    float model's mAP and the calibration batches are computed once and shared by the --int8 formats."""

    def __init__(self, model: torch.nn.Module, weights: Path, checks: list[torch.Tensor], meta: dict,
                 options: ExportOptions) -> None:
        self.model, self.weights, self.checks, self.meta, self.options = model, weights, checks, meta, options
        self.stride = int(meta["stride"])
        self._calibration: list[torch.Tensor] | None = None
        self._reference_map: float | None = None

    def calibration(self) -> list[torch.Tensor]:
        if self._calibration is None:
            self._calibration = calibration_batches(self.options.data, self.options, self.stride,
                                                    model_task(self.model))
            self._calibration = [b.to(self.checks[0].device) for b in self._calibration]
        return self._calibration

    def verify(self, fmt: ExportFormat, file: Path) -> Verification:
        """Float formats against PyTorch within the format's tolerance; INT8 by mAP against the float model."""
        device = self.checks[0].device
        if not fmt.runs_here:
            return verify_written(fmt, file, self.checks[0], self.meta)
        if not self.options.int8:
            return verify_float(file, self.model, self.checks, fmt.tolerance(self.options), device)
        if self._reference_map is None:
            self._reference_map = map_on_data(self.model, self.options.data, self.options, self.stride)
        return verify_int8(file, self.model, self.options, self.stride, self._reference_map)

    def run(self, fmt: ExportFormat) -> ExportResult:
        """Export one format and verify it; any failure is caught and returned with its reason."""
        result = ExportResult(fmt.name)
        start = time.perf_counter()
        LOGGER.info(f"{colorstr(fmt.name + ':')} exporting with torch {torch.__version__}...")
        try:
            file = fmt.output_path(self.weights, self.options)
            result.file = fmt.export(self.model, self.checks[0], file, self.meta, self.options, self.calibration)
            result.verification = self.verify(fmt, result.file)
        except Exception as e:  # one failing format must not stop the others; the reason is reported
            message = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            result.error = f"{type(e).__name__}: {message}"
            LOGGER.info(f"{colorstr(fmt.name + ':')} export failure: {result.error}")
        else:
            LOGGER.info(f"{colorstr(fmt.name + ':')} export success, saved as {result.file} ({result.size_mb:.1f} "
                        f"MB), {result.verification.describe()}")
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
    """One row per format: file, size in MB and what its verification measured (or why it failed)."""
    LOGGER.info(f"\nExport summary ({seconds:.1f}s):")
    LOGGER.info(f"{'format':<13}{'file':<50}{'size':>10}  verification")
    for r in results:
        if r.error:
            LOGGER.info(f"{r.format:<13}FAILED: {r.error}")
        else:
            LOGGER.info(f"{r.format:<13}{str(r.file):<50}{r.size_mb:>7.1f} MB  {r.verification.describe()}")
    done = [r for r in results if not r.error and get_format(r.format).runs_here]
    if done:
        LOGGER.info(f"Detect:   python detect.py --weights {done[-1].file}")


def export_weights(weights: Path, formats: list[ExportFormat], device: torch.device,
                   opt: argparse.Namespace) -> list[ExportResult]:
    """Load one weights file (fused, FP16 with --half) and export and verify each format."""
    model, ckpt = load_model(weights, device, fuse=True, trusted=opt.trust_weights)
    for p in model.parameters():
        p.requires_grad_(False)
    stride = int(model.stride.max())
    trained = trained_img_size(ckpt)
    if not opt.img_size and trained:
        LOGGER.info(f"Image size {trained}: the size {weights.name} was trained at (--img-size changes it)")
    options = export_options(opt, check_img_size(opt.img_size or [trained or 640], stride))
    meta = export_metadata(model, options.img_size, opt.batch_size, opt.dynamic, opt.half)
    checks = check_batches(opt, options.img_size, stride, device)
    if opt.half and device.type == "cuda":
        model, checks = model.half(), [images.half() for images in checks]
    LOGGER.info(f"{colorstr('PyTorch:')} starting from {weights} with input shape {tuple(checks[0].shape)}"
                f"{' (FP16)' if opt.half else ''}")
    job = ExportJob(model, weights, checks, meta, options)
    return [job.run(fmt) for fmt in formats]


def main(opt: argparse.Namespace) -> list[ExportResult]:
    """Export every --include format of every --weights file, verify each, print the summary; ExportError when
    any failed."""
    setup_logging(0)
    print_options("export", visible_options(opt), visible_options(parse_opt([])))
    formats = check_options(opt)
    device = select_device(opt.device)
    if (several := one_device_warning(opt.device, "export.py")) is not None:
        LOGGER.warning(several)
    check_device(opt, device, formats)
    start = time.perf_counter()
    results = []
    for weights in opt.weights if isinstance(opt.weights, list) else [opt.weights]:
        results += export_weights(resolve_weights_arg(weights), formats, device, opt)
    print_summary(results, time.perf_counter() - start)
    failed = [r for r in results if r.error]
    if failed:
        raise ExportError("; ".join(f"{r.format} export failed ({r.error})" for r in failed))
    return results


def run(**options: Any) -> list[Path]:
    """export.py from Python: ``export.run(weights="best.pt", include=["onnx"])`` takes the command line's option
    names (utils/api.py) and returns the files (or folders) written, each verified, in --include order. Errors
    are the UserErrors the command line prints (ExportError when a format failed)."""
    argv = api.to_argv(build_parser(), options, "export")
    return [result.file for result in main(api.parse(parse_opt, argv, "export"))]


if __name__ == "__main__":
    sys.exit(run_script(main, parse_opt(), "export"))
