"""Every export format of one weights file side by side: size, export time, mAP@.5:.95 and mAP@.5 on --data (a
segmenter's mask mAP@.5 too, with its difference from the .pt's) and latency per image at 1 thread and all threads,
each with its ratio to the .pt (YOLOv5's benchmarks.py is the reference).

    python benchmarks/bench_export.py --weights best.pt --data data/synthetic.yaml --img-size 160
    python benchmarks/bench_export.py --weights yolov5n.pt --data coco128.yaml --formats onnx openvino --int8

Formats whose packages are missing are listed with the one line saying what to install. Each export is written
by export.py (so verified as export.py verifies it) into a temporary folder; mAP is measured on at most
``--val-images`` validation images of --data, every format (the .pt too) on the same square --img-size inputs
with test.py's thresholds; latency is the median of ``--runs`` calls on one letterboxed image
through InferenceModel (the code path detect.py uses) after ``--warmup`` calls. The latencies are measured after
every export, all formats in turns (``ROUNDS`` rounds, each timing a block of calls of every format), so that a
change of load on a shared machine falls on every format alike and the ratios (INT8 against float) hold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import export  # noqa: E402
from benchmarks.harness import CLOCKS, Stats, add_timing_flags, header, load_average, time_call  # noqa: E402
from utils.deploy.formats import ExportOptions, export_format_names, get_format  # noqa: E402
from utils.deploy.runtime import InferenceModel  # noqa: E402
from utils.deploy.verify import calibration_batches, evaluate_on_data  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.log import setup_logging  # noqa: E402

ROUNDS = 5  # latency: every format timed in turns, this many times


@dataclass
class Row:
    """One format's measurements (None where it could not be measured, with the reason)."""

    name: str
    size_mb: float = 0.0
    export_s: float = 0.0
    map: float | None = None  # box mAP@.5:.95
    map50: float | None = None  # box mAP@.5
    mask_map50: float | None = None  # a segmenter's mask mAP@.5
    ms_one: float | None = None
    ms_all: float | None = None
    note: str = ""
    file: Path | None = None  # what was written and runs here (None: nothing to time)


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, help="a .pt checkpoint")
    parser.add_argument("--data", required=True, help="data YAML for mAP (and --int8 calibration)")
    parser.add_argument("--img-size", type=int, default=640)
    parser.add_argument("--formats", nargs="+", default=export_format_names(), help="formats to export")
    parser.add_argument("--int8", action="store_true", help="also the --int8 variant of each format that has one")
    parser.add_argument("--val-images", type=int, default=128, help="validation images for mAP")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    add_timing_flags(parser)
    return parser.parse_args(argv)


def latencies(files: dict[str, Path], image: torch.Tensor, threads: int, opt: argparse.Namespace) -> dict[str, float]:
    """Median ms per image of each file at ``threads`` intra-op threads (torch's and the runtime's), the files timed
    in turns: ROUNDS rounds, each timing a block of ``--runs / ROUNDS`` calls of every file."""
    torch.set_num_threads(threads)
    models = {label: InferenceModel(file, trusted=True, runtime_threads=threads)  # files it exported itself
              for label, file in files.items()}
    for model in models.values():
        for _ in range(opt.warmup):
            model(image)
    rounds = min(ROUNDS, opt.runs)
    samples: dict[str, list[Stats]] = {label: [] for label in models}
    for done in range(rounds):
        calls = opt.runs * (done + 1) // rounds - opt.runs * done // rounds
        for label, model in models.items():
            samples[label].append(time_call(lambda m=model: m(image), calls, 0, CLOCKS[opt.clock]))
    return {label: Stats.merge(*parts).scaled(1e3).median for label, parts in samples.items()}


def measure(name: str, file: Path, export_s: float, opt: argparse.Namespace) -> Row:
    """Size and mAPs of one written file (its latencies come later, with every format's)."""
    options = ExportOptions(img_size=(opt.img_size, opt.img_size), verify_images=opt.val_images)
    files = [file] if file.is_file() else [f for f in file.rglob("*") if f.is_file()]
    model = InferenceModel(file, trusted=True)
    result = evaluate_on_data(model.as_module(), opt.data, options, model.stride, model.task)
    mask_map50 = None if result.mask is None else float(result.mask.mean_results()[2])
    return Row(name, sum(f.stat().st_size for f in files) / 1e6, export_s, result.map, result.map50, mask_map50,
               file=file)


def add_latencies(rows: list[Row], image: torch.Tensor, opt: argparse.Namespace) -> None:
    """Fill each runnable row's latency at 1 thread and at all threads, every format timed in turns."""
    files = {row.name: row.file for row in rows if row.file is not None}
    one, every = latencies(files, image, 1, opt), latencies(files, image, os.cpu_count() or 1, opt)
    for row in rows:
        if row.file is not None:
            row.ms_one, row.ms_all = one[row.name], every[row.name]


def bench_format(name: str, int8: bool, weights: Path, opt: argparse.Namespace) -> Row:
    """Export one format with export.py and measure it; a Row with the reason when it cannot be done."""
    label = f"{name} int8" if int8 else name
    flags = ["--int8", "--data", opt.data, "--verify-images", str(opt.val_images)] if int8 else []
    start = time.perf_counter()
    try:
        result = export.main(export.parse_opt(["--weights", str(weights), "--img-size", str(opt.img_size),
                                               "--include", name, *flags]))[0]
    except UserError as e:
        return Row(label, note=str(e).splitlines()[0][:100])
    seconds = time.perf_counter() - start
    if not get_format(name).runs_here:
        return Row(label, result.size_mb, seconds, note=f"no runtime here ({get_format(name).runs_where})")
    return measure(label, result.file, seconds, opt)


def print_table(rows: list[Row]) -> None:
    """One line per format; a segmenter's table adds its mask mAP@.5 and that figure's difference from the .pt's."""
    base, masks = rows[0], rows[0].mask_map50 is not None
    print(f"{'format':<18}{'size MB':>9}{'export s':>10}{'mAP@.5:.95':>12}{'mAP@.5':>8}"
          + (f"{'mask mAP@.5':>13}{'vs .pt':>9}" if masks else "")
          + f"{'ms 1 thr':>10}{'ratio':>7}{'ms all':>9}{'ratio':>7}  note")
    for r in rows:
        def cell(value: float | None, ref: float | None, width: int) -> str:
            if value is None:
                return f"{'-':>{width}}{'-':>7}"
            return f"{value:>{width}.1f}{value / ref:>6.2f}x" if ref else f"{value:>{width}.1f}{'-':>7}"

        def figure(value: float | None, width: int, sign: str = "") -> str:
            return f"{'-':>{width}}" if value is None else f"{value:>{sign}{width}.4f}"

        mask = ""
        if masks:
            diff = None if r.mask_map50 is None else r.mask_map50 - base.mask_map50
            mask = figure(r.mask_map50, 13) + figure(diff, 9, "+")
        print(f"{r.name:<18}{r.size_mb:>9.1f}{r.export_s:>10.1f}{figure(r.map, 12)}{figure(r.map50, 8)}{mask}"
              f"{cell(r.ms_one, base.ms_one, 10)}{cell(r.ms_all, base.ms_all, 9)}  {r.note}")


def main(opt: argparse.Namespace) -> list[Row]:
    setup_logging(0)
    threads = torch.get_num_threads()
    print(header(f"bench_export: {opt.img_size} px, batch 1, median of {opt.runs} after {opt.warmup} warm-up",
                 "cpu", opt.clock))
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / Path(opt.weights).name
        shutil.copyfile(opt.weights, weights)
        options = ExportOptions(img_size=(opt.img_size, opt.img_size), calib_images=1)
        image = calibration_batches(opt.data, options, 32)[0]
        rows = [measure("pytorch (.pt)", weights, 0.0, opt)]
        for name in opt.formats:
            rows.append(bench_format(name, False, weights, opt))
            if opt.int8 and get_format(name).supports_int8:
                rows.append(bench_format(name, True, weights, opt))
        add_latencies(rows, image, opt)
    torch.set_num_threads(threads)
    print(f"\nOn {os.cpu_count()} CPU threads; load average now {load_average()}")
    print_table(rows)
    return rows


if __name__ == "__main__":
    main(parse_opt())
