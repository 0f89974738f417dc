"""Inference latency per image of .pt, .torchscript, .onnx (onnxruntime) and OpenVINO weights on this machine.

    python benchmarks/bench_infer.py                        # yolov5n and yolov5s, 640 px, batch 1, CPU
    python benchmarks/bench_infer.py --models yolov5s --runs 50 --device 0
    python benchmarks/bench_infer.py --quick                # yolov5n, 5 runs: about a minute
    python benchmarks/bench_infer.py --quick --threads 1 --clock cpu   # robust on a machine shared with other jobs

Models are built from their YAML (untrained weights: latency does not depend on the values),
saved as our checkpoint, exported with export.py (OpenVINO when the openvino package is installed), and each
file is run through InferenceModel, the code path detect.py uses; onnxruntime and OpenVINO get torch's thread
count. Reports the median [min-max] of ``--runs`` timed calls after ``--warmup`` calls, with the ratio to .pt;
NMS is timed separately on the .pt output. A reference fp32 matmul is timed before and after
(benchmarks/harness.py) and every figure is also given in units of it ('x matmul'), which stays comparable
when other jobs share the machine. ``--quick``: yolov5n only, 5 runs. ``--clock cpu`` times with this process's
CPU time (all its threads, onnxruntime's and OpenVINO's included) instead of wall time: with ``--threads 1`` that
is the single-core compute time, which other jobs on the machine barely change.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import export  # noqa: E402
from benchmarks.harness import CLOCKS, Reference, add_timing_flags, cuda_sync, header, load_average, time_call  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.boxes import non_max_suppression  # noqa: E402
from utils.data.sources import network_input  # noqa: E402
from utils.deploy.formats import get_format  # noqa: E402
from utils.deploy.runtime import InferenceModel  # noqa: E402
from utils.device import select_device  # noqa: E402
from utils.log import setup_logging  # noqa: E402
from utils.weights.checkpoint import new_checkpoint, save_checkpoint  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["yolov5n", "yolov5s"])
    parser.add_argument("--img-size", type=int, default=640)
    parser.add_argument("--runs", type=int, default=20, help="timed calls (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    add_timing_flags(parser)
    parser.add_argument("--quick", action="store_true", help="yolov5n only, 5 runs")
    opt = parser.parse_args(argv)
    if opt.quick:
        opt.models, opt.runs = opt.models[:1], 5
    return opt


def bench_model(name: str, folder: Path, opt: argparse.Namespace, device: torch.device) -> list[tuple]:
    """Rows (model, format, Stats of ms, ratio to .pt) and two NMS rows for one model size."""
    weights = save_checkpoint(new_checkpoint(Model(name)), folder / f"{name}.pt")
    formats = ["torchscript", "onnx"] + (["openvino"] if importlib.util.find_spec("openvino") else [])
    export.main(export.parse_opt(["--weights", str(weights), "--img-size", str(opt.img_size),
                                  "--device", opt.device, "--include", *formats]))
    from utils.data.synthetic import draw_sample, make_spec

    scene = draw_sample(np.random.default_rng(0), make_spec(img_size=(480, 640)))[0]
    chw = network_input(scene, opt.img_size, 32, auto=False)[0]
    image = (torch.from_numpy(chw).float() / 255)[None].to(device)
    sync = cuda_sync(device)
    rows, pt_ms = [], None
    for file in [weights] + [get_format(fmt).output_path(weights) for fmt in formats]:
        inference = InferenceModel(file, device, trusted=True, runtime_threads=torch.get_num_threads())
        ms = time_call(lambda m=inference: m(image), opt.runs, opt.warmup, CLOCKS[opt.clock], sync).scaled(1e3)
        pt_ms = pt_ms or ms.median
        rows.append((name, inference.kind if inference.format.is_folder else inference.format.suffix, ms,
                     ms.median / pt_ms))
    pred = InferenceModel(weights, device)(image)
    for conf in (0.25, 0.001):
        ms = time_call(lambda c=conf: non_max_suppression(pred, c, 0.45, max_det=1000), opt.runs, opt.warmup,
                       CLOCKS[opt.clock], sync).scaled(1e3)
        rows.append((name, f"NMS conf {conf}", ms, None))
    return rows


def openvino_version() -> str:
    """', OpenVINO <version>' when it is installed (its rows are then measured), else ''."""
    if importlib.util.find_spec("openvino") is None:
        return ""
    import openvino

    return f", OpenVINO {openvino.get_version().split('-')[0]}"


def main(opt: argparse.Namespace) -> list[tuple]:
    setup_logging(0)
    if opt.threads:
        torch.set_num_threads(opt.threads)
    device = select_device(opt.device)
    print(header(f"bench_infer: {opt.img_size}x{opt.img_size}, batch 1, {torch.get_num_threads()} threads "
                 f"(torch, onnxruntime {onnxruntime.__version__}{openvino_version()}), median [min-max] of {opt.runs} "
                 f"after {opt.warmup} warm-up", device, opt.clock))
    reference = Reference(device=str(device), clock=CLOCKS[opt.clock])
    reference.measure()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in opt.models:
            rows += bench_model(name, Path(tmp), opt, device)
    reference.measure()
    print(f"Inference at {opt.img_size}x{opt.img_size}, batch 1, {device}; load average now {load_average()}")
    print(f"{'model':<10}{'format':<16}{'ms/image':>10}{'[min-max]':>16}{'vs .pt':>8}{'x matmul':>10}")
    for name, fmt, ms, ratio in rows:
        spread = f"[{ms.low:.1f}-{ms.high:.1f}]"
        print(f"{name:<10}{fmt:<16}{ms.median:>10.1f}{spread:>16}{'' if ratio is None else f'{ratio:.2f}x':>8}"
              f"{reference.ratio(ms.median / 1e3):>10.3f}")
    print(reference.describe())
    print("('x matmul': the median divided by the time of one reference matmul, before and after together)")
    return rows


if __name__ == "__main__":
    main(parse_opt())
