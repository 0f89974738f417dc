"""Inference latency per image of .pt, .torchscript and .onnx (onnxruntime) weights on this machine.

    python benchmarks/bench_infer.py                        # yolov5n and yolov5s, 640 px, batch 1, CPU
    python benchmarks/bench_infer.py --models yolov5s --runs 50 --device 0

Models are built from their YAML (untrained weights: latency does not depend on the values),
saved as our checkpoint, exported with export.py, and each file is run through DetectBackend,
the code path detect.py uses. Reports the median of ``--runs`` timed calls after ``--warmup``
calls, with the ratio to .pt; NMS is timed separately on the .pt output.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import export  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.backends import DetectBackend  # noqa: E402
from utils.boxes import non_max_suppression  # noqa: E402
from utils.checkpoint import new_checkpoint, save_checkpoint  # noqa: E402
from utils.device import select_device  # noqa: E402
from utils.log import setup_logging  # noqa: E402
from utils.sources import letterbox_image  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["yolov5n", "yolov5s"])
    parser.add_argument("--img-size", type=int, default=640)
    parser.add_argument("--runs", type=int, default=20, help="timed calls (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    return parser.parse_args(argv)


def median_ms(fn: Callable[[], object], runs: int, warmup: int, sync: bool) -> float:
    """Median wall time of ``fn`` in milliseconds after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench_model(name: str, folder: Path, opt: argparse.Namespace, device: torch.device) -> list[tuple]:
    """Rows (model, format, ms, ratio to .pt) and two NMS rows for one model size."""
    weights = save_checkpoint(new_checkpoint(Model(name)), folder / f"{name}.pt")
    export.main(export.parse_opt(["--weights", str(weights), "--img-size", str(opt.img_size),
                                  "--device", opt.device]))
    from utils.synthetic import draw_sample, make_spec

    scene = draw_sample(np.random.default_rng(0), make_spec(img_size=(480, 640)))[0]
    chw = letterbox_image(scene, opt.img_size, 32, auto=False)[0]
    image = (torch.from_numpy(chw).float() / 255)[None].to(device)
    sync = device.type == "cuda"
    rows, reference = [], None
    for suffix in (".pt", ".torchscript", ".onnx"):
        backend = DetectBackend(weights.with_suffix(suffix), device, onnx_threads=torch.get_num_threads())
        ms = median_ms(lambda b=backend: b(image), opt.runs, opt.warmup, sync)
        reference = reference or ms
        rows.append((name, suffix, ms, ms / reference))
    pred = DetectBackend(weights, device)(image)
    for conf in (0.25, 0.001):
        ms = median_ms(lambda c=conf: non_max_suppression(pred, c, 0.45, max_det=1000), opt.runs, opt.warmup, sync)
        rows.append((name, f"NMS conf {conf}", ms, None))
    return rows


def main(opt: argparse.Namespace) -> list[tuple]:
    setup_logging(0)
    if opt.threads:
        torch.set_num_threads(opt.threads)
    device = select_device(opt.device)
    rows, load_before = [], os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for name in opt.models:
            rows += bench_model(name, Path(tmp), opt, device)
    print(f"Inference at {opt.img_size}x{opt.img_size}, batch 1, {device}, {torch.get_num_threads()} threads "
          f"(torch and onnxruntime), median of {opt.runs} after {opt.warmup} warm-up; torch {torch.__version__}, "
          f"onnxruntime {onnxruntime.__version__}; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")
    print(f"{'model':<10}{'format':<16}{'ms/image':>10}{'vs .pt':>8}")
    for name, fmt, ms, ratio in rows:
        print(f"{name:<10}{fmt:<16}{ms:>10.1f}{'' if ratio is None else f'{ratio:.2f}x':>8}")
    return rows


if __name__ == "__main__":
    main(parse_opt())
