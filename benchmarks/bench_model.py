"""Model forward speed: ms/image at 640 px, batch 1, and GFLOP/s as a fraction of this CPU's fp32 matmul rate.

    python benchmarks/bench_model.py                       # yolov5n and yolov5s, 640 px, 20 timed runs
    python benchmarks/bench_model.py --quick               # yolov5n, 5 runs: well under a minute
    python benchmarks/bench_model.py --models yolov5s yolov5m --runs 50 --threads 1
    python benchmarks/bench_model.py --threads 1 --clock cpu   # robust on a machine shared with other jobs
    python benchmarks/bench_model.py --channels-last           # also NHWC vs NCHW, run for run
    python benchmarks/bench_model.py --merge-gain              # also C3's merged cv1/cv2 product vs two convs
    python benchmarks/bench_model.py --threads 1 --clock cpu --reference /tmp/ref/yolov5   # ours vs YOLOv5 7.0.14

Each model is built from its YAML, BatchNorm-fused and run in eval mode under torch.inference_mode
(untrained weights: the speed does not depend on the values). The forward includes the Detect head's
box decoding, not NMS. The reference rate is a plain fp32 square matmul (2*n^3 FLOPs) timed in the same
process with the same threads before and after the models (benchmarks/harness.py): the practical ceiling
for dense fp32 arithmetic on this machine, so the fraction says how much of it the convolutions reach, and
it moves less than milliseconds when other jobs share the cores. Figures are medians [min-max] of the timed
runs. ``--quick``: yolov5n only, 5 runs, a 1024 matmul.
``--reference DIR``: the ``yolov5`` package of PyPI yolov5 7.0.14 unpacked (``pip download yolov5==7.0.14
--no-deps`` and unzip; never installed, never committed): each model is also built from the reference's own YAML
with our weights copied in, both are fused, their outputs compared, and the two forwards timed in turns.
``--clock cpu`` times with this process's CPU time instead of wall time: with ``--threads 1`` that is the
compute time even when other jobs share the cores (wall time then also counts the time the process waited).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import CLOCKS, Clock, Reference, Stats, add_timing_flags, header, time_call  # noqa: E402
from models.common import C3  # noqa: E402
from models.yolo import Model  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["yolov5n", "yolov5s"], help="model YAMLs (names or paths)")
    parser.add_argument("--img-size", type=int, default=640, help="square input size (pixels)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20, help="timed forwards (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed forwards first")
    parser.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n fp32 reference matmul")
    add_timing_flags(parser)
    parser.add_argument("--quick", action="store_true", help="yolov5n, 5 runs, 1024 matmul")
    parser.add_argument("--reference", type=Path, default=None,
                        help="directory of the PyPI yolov5 7.0.14 package (…/yolov5): also time its forward, in turns")
    parser.add_argument("--merge-gain", action="store_true",
                        help="also time the fused model with and without C3's merged cv1/cv2 product, in turns")
    parser.add_argument("--channels-last", action="store_true",
                        help="also time each model in channels_last (NHWC), run for run with the default layout")
    opt = parser.parse_args(argv)
    if opt.reference is not None and not (opt.reference / "models" / "yolo.py").is_file():
        parser.error(f"--reference {opt.reference}: no models/yolo.py there (give the unpacked yolov5 package dir)")
    if opt.quick:
        opt.models, opt.runs, opt.matmul_size = opt.models[:1], 5, 1024
    return opt


def bench_model(name: str, img_size: int, batch_size: int, runs: int, warmup: int,
                clock: Clock = time.perf_counter) -> dict:
    """ms/image and GFLOP/s of the fused model's forward in inference mode (medians; ``ms`` holds the Stats)."""
    torch.manual_seed(0)
    model = Model(name).fuse().eval()
    gflops_per_image = model.flops(img_size)  # of the fused model: convolutions only
    x = torch.rand(batch_size, 3, img_size, img_size)
    with torch.inference_mode():
        seconds = time_call(lambda: model(x), runs, warmup, clock)
    return {"ms_per_image": seconds.median * 1e3 / batch_size, "gflops_per_image": gflops_per_image,
            "gflops_per_s": gflops_per_image * batch_size / seconds.median,
            "ms": seconds.scaled(1e3 / batch_size)}


def channels_last_gain(opt: argparse.Namespace, clock: Clock) -> str:
    """Per model: ms/image in the default layout and in channels_last, the two timed in turns, and the median of
    the per-pair ratios (> 1: channels_last is faster)."""
    lines = [f"{'channels_last':<16}{'NCHW ms':>12}{'NHWC ms':>12}{'NCHW/NHWC':>22}"]
    for name in opt.models:
        torch.manual_seed(0)
        nchw = Model(name).fuse().eval()
        nhwc = Model(name).fuse().eval().to(memory_format=torch.channels_last)
        nhwc.load_state_dict(nchw.state_dict())
        x = torch.rand(opt.batch_size, 3, opt.img_size, opt.img_size)
        times = alternate((nchw, nhwc), x, opt, clock)
        ratio = Stats.of(a / b for a, b in zip(*times))
        lines.append(f"{name:<16}{Stats.of(times[0]).median * 1e3:>12.1f}{Stats.of(times[1]).median * 1e3:>12.1f}"
                     f"{ratio.fmt(2):>22}")
    return "\n".join(lines)


def merge_gain(opt: argparse.Namespace, clock: Clock) -> str:
    """Per model: the fused forward with C3's cv1 and cv2 as one product (the default) and as two convolutions plus a
    concatenation, timed in turns; the median of the per-pair ratios (< 1: the merged product is faster)."""
    lines = [f"{'C3 merged':<16}{'two convs ms':>14}{'merged ms':>12}{'merged/two':>22}{'max |diff|':>12}"]
    for name in opt.models:
        torch.manual_seed(0)
        merged = Model(name).fuse().eval()
        plain = copy.deepcopy(merged)
        for block in plain.modules():
            if isinstance(block, C3):
                block.merged_weight = block.merged_bias = None
        x = torch.rand(opt.batch_size, 3, opt.img_size, opt.img_size)
        with torch.inference_mode():
            diff = (merged(x) - plain(x)).abs().max().item()
        times = alternate((plain, merged), x, opt, clock)
        ratio = Stats.of(b / a for a, b in zip(*times))
        lines.append(f"{name:<16}{Stats.of(times[0]).median * 1e3:>14.1f}{Stats.of(times[1]).median * 1e3:>12.1f}"
                     f"{ratio.fmt(3):>22}{diff:>12.1e}")
    return "\n".join(lines)


def alternate(models: tuple, x: torch.Tensor, opt: argparse.Namespace, clock: Clock) -> tuple[list[float], ...]:
    """Each model warmed up, then timed in turns ``opt.runs`` times (inference mode): a list of seconds per model."""
    times: tuple[list[float], ...] = tuple([] for _ in models)
    with torch.inference_mode():
        for model in models:
            time_call(lambda m=model: m(x), 1, opt.warmup, clock)
        for _ in range(opt.runs):
            for i, model in enumerate(models):
                times[i].append(time_call(lambda m=model: m(x), 1, 0, clock).median)
    return times


def against_reference(opt: argparse.Namespace, clock: Clock) -> str:
    """Per model: our fused forward and the reference YOLOv5's (same YAML, our weights copied in), timed in turns;
    the median and spread of the per-pair ratios (< 1: ours is faster) and the largest output difference."""
    from benchmarks.reference_yolov5 import build_reference

    lines = [f"{'vs YOLOv5 7.0.14':<16}{'ours ms':>10}{'ref ms':>10}{'ours/ref [min-max]':>24}{'max |diff|':>12}"]
    for name in opt.models:
        torch.manual_seed(0)
        ours = Model(name).eval()
        ref = build_reference(opt.reference, name, ours.state_dict())
        ours.fuse()
        x = torch.rand(opt.batch_size, 3, opt.img_size, opt.img_size)
        with torch.inference_mode():
            diff = (ours(x) - ref(x)[0]).abs().max().item()
        times = alternate((ours, ref), x, opt, clock)
        ratio = Stats.of(a / b for a, b in zip(*times))
        lines.append(f"{name:<16}{Stats.of(times[0]).median * 1e3:>10.1f}{Stats.of(times[1]).median * 1e3:>10.1f}"
                     f"{ratio.fmt(3):>24}{diff:>12.1e}")
    return "\n".join(lines)


def main(opt: argparse.Namespace) -> list[dict]:
    if opt.threads > 0:
        torch.set_num_threads(opt.threads)
    clock = CLOCKS[opt.clock]
    print(header(f"bench_model: {opt.img_size} px, batch {opt.batch_size}, median [min-max] of {opt.runs} runs "
                 f"after {opt.warmup} warm-up", clock=opt.clock))
    reference = Reference(n=opt.matmul_size, runs=opt.runs, clock=clock)
    reference.measure()
    peak = reference.gflops(reference.before)
    print(f"fp32 matmul {opt.matmul_size}x{opt.matmul_size}: {peak:.1f} GFLOP/s (the reference rate)")
    print(f"{'model':<16}{'ms/image':>10}{'[min-max]':>16}{'GFLOPs':>9}{'GFLOP/s':>10}{'of matmul':>11}"
          f"{'x matmul':>10}")
    rows = []
    for name in opt.models:
        result = bench_model(name, opt.img_size, opt.batch_size, opt.runs, opt.warmup, clock)
        result["fraction_of_matmul"] = result["gflops_per_s"] / peak
        ms = result.pop("ms")
        rows.append({"model": name, **result})
        spread = f"[{ms.low:.1f}-{ms.high:.1f}]"
        print(f"{name:<16}{result['ms_per_image']:>10.1f}{spread:>16}{result['gflops_per_image']:>9.2f}"
              f"{result['gflops_per_s']:>10.1f}{result['fraction_of_matmul']:>10.0%}"
              f"{reference.ratio(result['ms_per_image'] / 1e3):>10.2f}")
    if opt.channels_last:
        print(channels_last_gain(opt, clock))
    if opt.merge_gain:
        print(merge_gain(opt, clock))
    if opt.reference is not None:
        print(against_reference(opt, clock))
    reference.measure()
    peak_after = reference.gflops(reference.after)
    print(f"fp32 matmul again after the models: {peak_after:.1f} GFLOP/s "
          f"({abs(peak_after - peak) / peak:.0%} apart: a large gap means the machine was busy)")
    print("('x matmul': ms/image divided by the time of one reference matmul, measured before the models)")
    return rows


if __name__ == "__main__":
    main(parse_opt())
