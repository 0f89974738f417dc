"""Export a trained detector to TorchScript and ONNX, and prove each export gives PyTorch's output.

    python export.py --weights runs/train/exp/weights/best.pt --include torchscript onnx
    python export.py --weights best.pt --include onnx --dynamic --img-size 640

Files are written next to the weights with the same stem (best.pt -> best.torchscript, best.onnx).
The model is fused and in eval mode, so the files return the decoded predictions (b, n, 5 + nc).
Each export is run on a real letterboxed image and compared with PyTorch before it is reported.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from utils.backends import DetectBackend, check_img_size, export_metadata, find_trained_weights, quiet_jit_warnings
from utils.checkpoint import load_model
from utils.cli import add_flags, run_main
from utils.device import select_device
from utils.errors import UserError
from utils.log import LOGGER, colorstr, print_options, setup_logging
from utils.paths import IMG_SUFFIXES, ROOT
from utils.sources import letterbox_image

FORMATS = ("torchscript", "onnx")
MAX_ERROR = 1e-3  # the largest difference accepted between an export and PyTorch (see compare_outputs)


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
        return self.file.stat().st_size / 1e6 if self.file and self.file.is_file() else 0.0


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """export.py's options (``argv=None`` reads sys.argv)."""
    parser = argparse.ArgumentParser(prog="export.py", description="Export a trained detector to TorchScript / ONNX")
    add_flags(parser, "weights")
    parser.add_argument("--include", nargs="+", default=list(FORMATS), help=f"formats: {', '.join(FORMATS)}")
    add_flags(parser, "img_size", "batch_size", batch_size=1)
    parser.add_argument("--dynamic", action="store_true", help="dynamic batch and image size (ONNX axes)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    parser.add_argument("--dynamo", action="store_true", help="use the torch.export-based ONNX exporter (slower)")
    add_flags(parser, "device", "trust_weights", device="cpu")
    return parser.parse_args(argv)


def check_options(opt: argparse.Namespace) -> list[str]:
    """The validated formats (duplicates dropped); a UserError naming the flag otherwise."""
    formats = [f.lower().lstrip(".") for f in opt.include]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ExportError(f"--include {' '.join(unknown)}: unknown format (choose from {', '.join(FORMATS)})")
    if opt.batch_size < 1:
        raise ExportError(f"--batch-size {opt.batch_size} must be at least 1")
    return list(dict.fromkeys(formats))


@functools.lru_cache(maxsize=1)
def sample_image() -> np.ndarray:
    """The first readable image in data/images (BGR); a synthetic scene when there is none."""
    for path in sorted((ROOT / "data" / "images").glob("*")):
        if path.suffix.lower() in IMG_SUFFIXES and (image := cv2.imread(str(path))) is not None:
            return image
    LOGGER.warning("WARNING: no sample image in data/images; checking exports on a synthetic image")
    from utils.synthetic import draw_sample, make_spec

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


def export_torchscript(model: torch.nn.Module, images: torch.Tensor, file: Path, meta: dict, opt) -> Path:
    """torch.jit.trace of the fused model; metadata as JSON in the archive's config.txt."""
    with quiet_jit_warnings():
        traced = torch.jit.trace(model, images, strict=False, check_trace=False)  # verified below
        torch.jit.save(traced, str(file), _extra_files={"config.txt": json.dumps(meta)})
    return file


def export_onnx(model: torch.nn.Module, images: torch.Tensor, file: Path, meta: dict, opt) -> Path:
    """torch.onnx.export (TorchScript-based exporter unless --dynamo), then stride/names as metadata_props."""
    import onnx

    kwargs: dict = {"opset_version": opt.opset, "input_names": ["images"], "output_names": ["output0"],
                    "dynamo": opt.dynamo, "verbose": False}
    if opt.dynamic and opt.dynamo:
        dim = torch.export.Dim
        kwargs["dynamic_shapes"] = ({0: dim("batch", min=1, max=1024), 2: dim.AUTO, 3: dim.AUTO},)
    elif opt.dynamic:
        kwargs["dynamic_axes"] = {"images": {0: "batch", 2: "height", 3: "width"},
                                  "output0": {0: "batch", 1: "anchors"}}
    with quiet_jit_warnings():
        torch.onnx.export(model, (images,), str(file), **kwargs)
    proto = onnx.load(str(file))
    onnx.checker.check_model(proto)
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    onnx.save(proto, str(file))
    return file


EXPORTERS: dict[str, Callable[..., Path]] = {"torchscript": export_torchscript, "onnx": export_onnx}
SUFFIX = {"torchscript": ".torchscript", "onnx": ".onnx"}


def verify_export(file: Path, model: torch.nn.Module, checks: list[torch.Tensor], device: torch.device) -> float:
    """Run the exported file through DetectBackend on each example batch; the largest error against PyTorch."""
    backend = DetectBackend(file, device)
    with torch.no_grad():
        return max(compare_outputs(model(images), backend(images)) for images in checks)


def run_export(fmt: str, model: torch.nn.Module, weights: Path, checks: list[torch.Tensor], meta: dict,
               opt: argparse.Namespace) -> ExportResult:
    """Export one format and verify it; any failure is caught and returned with its reason."""
    result = ExportResult(fmt)
    start = time.perf_counter()
    LOGGER.info(f"{colorstr(fmt + ':')} exporting with torch {torch.__version__}...")
    try:
        result.file = EXPORTERS[fmt](model, checks[0], weights.with_suffix(SUFFIX[fmt]), meta, opt)
        result.max_error = verify_export(result.file, model, checks, checks[0].device)
        if not result.max_error < MAX_ERROR:
            raise RuntimeError(f"output differs from PyTorch by {result.max_error:.2e} (limit {MAX_ERROR:.0e})")
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


def main(opt: argparse.Namespace) -> list[ExportResult]:
    """Export every --include format, verify each, print the summary; ExportError when any failed."""
    setup_logging(0)
    print_options("export", opt)
    formats = check_options(opt)
    weights = Path(opt.weights) if opt.weights else find_trained_weights()
    device = select_device(opt.device)
    start = time.perf_counter()
    model, _ = load_model(weights, device, fuse=True, trusted=opt.trust_weights)
    for p in model.parameters():
        p.requires_grad_(False)
    stride = int(model.stride.max())
    img_size = check_img_size(opt.img_size, stride)
    meta = export_metadata(model, img_size, opt.batch_size, opt.dynamic)
    checks = check_batches(opt, img_size, stride, device)
    LOGGER.info(f"{colorstr('PyTorch:')} starting from {weights} with input shape {tuple(checks[0].shape)}")
    results = [run_export(fmt, model, weights, checks, meta, opt) for fmt in formats]
    print_summary(results, time.perf_counter() - start)
    failed = [r for r in results if r.error]
    if failed:
        raise ExportError("; ".join(f"{r.format} export failed ({r.error})" for r in failed))
    return results


if __name__ == "__main__":
    sys.exit(run_main(main, parse_opt(), "export"))
