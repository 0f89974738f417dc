"""Accuracy at a large total batch: total batch 16 in one process against total batch 128 over 2 ranks, the same
epochs, with the large-batch rule (--batch-scaling, docs/cluster.md) and without it (the default).

    python benchmarks/bench_large_batch.py                        # yolov5n, 15 epochs of 512 images at 128 px
    python benchmarks/bench_large_batch.py --epochs 30 --images 1024
    python benchmarks/bench_large_batch.py --quick                # 2 epochs of 64 images at 64 px: the pipeline

The data set is generated as in benchmarks/bench_recipe.py (shapes at 128-160 px, a quarter as many validation
images, the family's scratch hyperparameters, --optimizer auto). Each variant is one train.py run (``--workers
0``, the same --seed, validation after the last epoch only); the 2-rank ones run under ``torch.distributed.run
--nproc_per_node 2`` on the CPU (gloo). Printed: each variant's final mAP@.5 and mAP@.5:.95, the optimizer line
train.py logged (where the rule shows), and the differences to batch 16 (the goal: within 0.02 of mAP@.5).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_recipe import make_data  # noqa: E402
from benchmarks.harness import free_port, header  # noqa: E402

VARIANTS = {  # name -> (processes, total batch, extra train.py flags)
    "b16": (1, 16, []),
    "b128-rule": (2, 128, ["--batch-scaling"]),
    "b128-norule": (2, 128, []),
}


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov5n", help="model YAML")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--img", type=int, default=128, help="training and validation image size")
    p.add_argument("--images", type=int, default=512, help="generated training images (val: a quarter as many)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                   help="the runs to make (b16 is the base of the differences when it runs)")
    p.add_argument("--quick", action="store_true", help="2 epochs of 64 images at 64 px: checks the pipeline")
    opt = p.parse_args(argv)
    if opt.quick:
        opt.epochs, opt.images, opt.img = 2, 64, 64
    return opt


def final_metrics(results_csv: Path) -> tuple[float, float]:
    """mAP@.5 and mAP@.5:.95 of the last row of a results.csv (the validation after the last epoch)."""
    last = results_csv.read_text().strip().splitlines()
    header_row, row = [c.strip() for c in last[0].split(",")], [c.strip() for c in last[-1].split(",")]
    values = dict(zip(header_row, row))
    return float(values["metrics/mAP_0.5"]), float(values["metrics/mAP_0.5:0.95"])


def optimizer_line(log: str) -> str:
    """The optimizer train.py built (``AdamW(lr=0.002021)``) and what the large-batch rule did, from its log."""
    built = re.search(r"(\w+\(lr=[^)]*\)) with parameter groups", log)
    rule = re.search(r"batch \d+ = [^;]*;", log)
    return f"{built.group(1) if built else '?'}; {rule.group(0)[:-1] if rule else 'no rule'}"


def run_variant(name: str, opt: argparse.Namespace, data: Path, folder: Path) -> tuple[float, float, float, str]:
    """One train.py run of the variant: (mAP@.5, mAP@.5:.95, seconds, the optimizer line)."""
    processes, batch, flags = VARIANTS[name]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())] if processes > 1 else [sys.executable]
    command = [*launcher, str(ROOT / "train.py"), "--cfg", opt.cfg, "--data", str(data), "--epochs", str(opt.epochs),
               "--img", str(opt.img), "--batch-size", str(batch), "--workers", "0", "--seed", str(opt.seed),
               "--device", "cpu", "--noplots", "--noval", "--loggers", "csv", "--project", str(folder / "runs"),
               "--name", name, *flags]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: train.py failed ({done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}")
    return (*final_metrics(folder / "runs" / name / "results.csv"), seconds,
            optimizer_line(done.stdout + done.stderr))


def main(opt: argparse.Namespace) -> dict[str, tuple[float, float, float, str]]:
    print(header(f"bench_large_batch: {opt.cfg}, {opt.epochs} epochs, {opt.images} generated images, {opt.img} px, "
                 f"seed {opt.seed}: total batch 16 (1 process) vs 128 (2 ranks)"))
    with tempfile.TemporaryDirectory(prefix="bench_large_batch_") as scratch:
        folder = Path(scratch)
        data = make_data(folder, opt.images)
        outcomes = {name: run_variant(name, opt, data, folder) for name in opt.variants}
    base = outcomes["b16"][0] if "b16" in outcomes else 0.0
    print(f"{'variant':<13}{'mAP@.5':>8}{'mAP@.5:.95':>12}{'- b16':>8}{'time (s)':>10}  optimizer")
    for name, (map50, map_, seconds, line) in outcomes.items():
        print(f"{name:<13}{map50:>8.4f}{map_:>12.4f}{map50 - base:>+8.4f}{seconds:>10.1f}  {line}")
    if len(outcomes) == len(VARIANTS):
        rule, norule = outcomes["b128-rule"][0], outcomes["b128-norule"][0]
        print(f"the rule's effect at batch 128: mAP@.5 {norule:.4f} -> {rule:.4f} ({rule - norule:+.4f}); "
              f"batch 128 with the rule vs batch 16: {rule - base:+.4f} (goal: within 0.02)")
    return outcomes


if __name__ == "__main__":
    main(parse_opt())
