"""CPU training step against the FLOP rate, and a whole train.py epoch against its pure steps.

    python benchmarks/bench_step.py --threads 1 --clock cpu                 # n and s at 320 and 640, fp32 and bf16
    python benchmarks/bench_step.py --threads 1 --clock cpu --epoch         # also one train.py epoch (yolov5n 320)
    python benchmarks/bench_step.py --quick                                 # yolov5n 320, 2 rounds
    python benchmarks/bench_step.py --compare-threads --cfg yolov5n --img 320 --precisions fp32

Step: forward in train mode, the loss, backward and an SGD step on a fixed batch of random images with a few
boxes (no data pipeline). Its model FLOP/s are 3 x the forward's FLOPs (forward + backward) x images/s, given as a
share of a fp32 matmul timed in the same process before and after (benchmarks/harness.py). Precisions take turns
round by round; "bf16/fp32" is the median of the per-round ratios of their step times (< 1: bf16 is faster).

Epoch (``--epoch``): train.py runs one epoch on its built-in synthetic set (512 images, default settings) in a
child process with ``OMP_NUM_THREADS`` = ``--threads``, timed phase by phase (benchmarks/epoch_phases.py: start-up
imports, data, forward, loss, backward, optimizer, EMA, validation and its NMS and plots, checkpoints, loggers, the
background plot thread, the DataLoader workers). "Not the model" is everything but forward, loss, backward and the
optimizer step: of the whole run, and of an epoch that recurs (without what a run does once: start-up, the final
plots); it is also given against pure steps timed here at the precision train.py chose (--amp auto). CPU time,
not wall time, so a loaded machine's waiting is not counted; the workers' CPU time is. ``--compare DIR`` times the
train.py of another checkout in turns (before/after a change); ``--epoch-rounds`` sets the rounds.

Workers (``--epoch-workers 0 1 2``): the same train.py epoch with each DataLoader worker count, in turns: wall
and CPU seconds (the training process's threads: ``--threads``).

Threads (``--compare-threads``): the step of each --cfg/--img (first precision) with 1 torch thread and with one
per core this process may use (os.sched_getaffinity), in turns: wall and CPU seconds, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_train import HYP, make_batch  # noqa: E402
from benchmarks.epoch_phases import MODEL_PHASES, ONCE_PER_RUN, all_phases, shares  # noqa: E402
from benchmarks.harness import CLOCKS, Clock, Reference, Stats, add_timing_flags, header  # noqa: E402
from utils.device import autocast, available_cores  # noqa: E402

SYNTHETIC_TRAIN_IMAGES = 512  # data/synthetic.yaml's train split


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", nargs="+", default=["yolov5n", "yolov5s"], help="model YAMLs")
    p.add_argument("--img", nargs="+", type=int, default=[320, 640], help="square image sizes")
    p.add_argument("--batch-size", type=int, default=4, help="images per step")
    p.add_argument("--rounds", type=int, default=5, help="timed steps per precision, taken in turns")
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    p.add_argument("--epoch", action="store_true", help="also time one train.py epoch against its pure steps")
    p.add_argument("--epoch-batch", type=int, default=16, help="train.py's batch for --epoch (its default)")
    p.add_argument("--epoch-rounds", type=int, default=1, help="train.py epochs per tree for --epoch, in turns")
    p.add_argument("--epoch-workers", type=int, nargs="+", default=None,
                   help="time the train.py epoch with each of these --workers, in turns (wall and CPU)")
    p.add_argument("--compare", type=Path, default=None,
                   help="--epoch: also time the train.py of this checkout (e.g. before a change), in turns")
    p.add_argument("--compare-threads", action="store_true",
                   help="also time the step with 1 thread and with one per usable core, in turns (wall and CPU)")
    p.add_argument("--quick", action="store_true", help="yolov5n at 320 only, 2 rounds")
    add_timing_flags(p)
    opt = p.parse_args(argv)
    if opt.quick:
        opt.cfg, opt.img, opt.rounds = opt.cfg[:1], opt.img[:1], 2
    return opt


def build_step(cfg: str, img_size: int, batch: int, bf16: bool):
    """A closure running one training step (forward, loss, backward, SGD) on a fixed batch; and the model."""
    from models.yolo import Model
    from utils.training.loss import ComputeLoss

    torch.manual_seed(0)
    model = Model(cfg, nc=3).train()
    loss_fn = ComputeLoss(model, HYP, img_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    imgs, targets, _, _ = make_batch(batch, img_size, 0)
    images = imgs.float() / 255
    cpu = torch.device("cpu")

    def step() -> None:
        with autocast(cpu, bf16):
            loss, _ = loss_fn(model(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def step_seconds(cfg: str, img_size: int, opt: argparse.Namespace, clock: Clock) -> dict[str, Stats]:
    """Seconds per step of each precision, one step of each in turn per round, after one warm-up step each."""
    steps = {p: build_step(cfg, img_size, opt.batch_size, p == "bf16")[0] for p in opt.precisions}
    for step in steps.values():
        step()
    samples: dict[str, list[float]] = {p: [] for p in steps}
    for _ in range(opt.rounds):
        for precision, step in steps.items():
            start = clock()
            step()
            samples[precision].append(clock() - start)
    return {p: Stats.of(s) for p, s in samples.items()}


def step_table(opt: argparse.Namespace, reference: Reference, clock: Clock) -> list[dict]:
    """Print and return, per model, size and precision: images/s, model GFLOP/s and its share of the matmul rate."""
    from models.yolo import Model

    peak = reference.gflops(reference.before)
    print(f"{'model':<10}{'px':>5}{'prec':>6}{'ms/step [min-max]':>26}{'img/s':>8}{'GFLOP/s':>9}{'of matmul':>11}"
          f"{'bf16/fp32':>22}")
    rows = []
    for cfg in opt.cfg:
        for img_size in opt.img:
            train_gflops = 3 * Model(cfg, nc=3).flops(img_size)  # forward + backward (2x) per image
            seconds = step_seconds(cfg, img_size, opt, clock)
            for precision, stats in seconds.items():
                rate = opt.batch_size / stats.median
                share = train_gflops * rate / peak
                ratio = ""
                if precision == "bf16" and "fp32" in seconds:
                    ratio = Stats.of(b / f for b, f in zip(stats.samples, seconds["fp32"].samples)).fmt(2)
                print(f"{cfg:<10}{img_size:>5}{precision:>6}{stats.scaled(1e3).fmt(0):>26}{rate:>8.2f}"
                      f"{train_gflops * rate:>9.1f}{share:>10.0%}{ratio:>22}")
                rows.append({"cfg": cfg, "img": img_size, "precision": precision, "ms": stats.median * 1e3,
                             "share_of_matmul": share})
    return rows


def epoch_run(tree: Path, opt: argparse.Namespace, workers: int | None = None) -> dict:
    """One default train.py epoch (yolov5n, 320 px) of ``tree`` in a child process, timed phase by phase
    (benchmarks/epoch_phases.py), with OMP_NUM_THREADS = --threads and ``workers`` (None: train.py's default)."""
    with tempfile.TemporaryDirectory() as project:
        out = Path(project) / "phases.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(opt.threads or torch.get_num_threads())}
        args = ["--cfg", "yolov5n", "--img", "320", "--epochs", "1", "--batch-size", str(opt.epoch_batch),
                "--device", "cpu", "--project", project, "--name", "bench"]
        args += ["--workers", str(workers)] if workers is not None else []
        command = [sys.executable, str(ROOT / "benchmarks" / "epoch_phases.py"), "--tree", str(tree),
                   "--out", str(out), "--", *args]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"train.py of {tree} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        result = json.loads(out.read_text())
    result.update(wall_s=wall, bf16=bool(re.search(r"AMP: bfloat16", done.stdout + done.stderr)))
    return result


def pure_steps(opt: argparse.Namespace, bf16: bool, clock: Clock) -> Stats:
    """CPU seconds of the epoch's steps without anything else (fixed batch, no data pipeline)."""
    step, _ = build_step("yolov5n", 320, opt.epoch_batch, bf16)
    step()
    samples = []
    for _ in range(opt.rounds):
        start = clock()
        step()
        samples.append(clock() - start)
    return Stats.of(samples).scaled(-(-SYNTHETIC_TRAIN_IMAGES // opt.epoch_batch))


def epoch_against_steps(opt: argparse.Namespace, clock: Clock) -> dict:
    """Rounds of one train.py epoch of this tree (and of --compare's, in turns): CPU by phase, the share that is
    not the model, and the pure steps' CPU time for the same batches."""
    trees = {"this tree": ROOT, **({"compare": opt.compare.resolve()} if opt.compare else {})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(opt.epoch_rounds):
        for name, tree in trees.items():
            runs[name].append(epoch_run(tree, opt))
    pure = pure_steps(opt, runs["this tree"][0]["bf16"], clock)
    print("\n".join(phase_table(runs)))
    for name, results in runs.items():
        totals = [shares(r) for r in results]
        print(f"{name}: {Stats.of(t['total_s'] for t in totals).fmt(1)} s CPU in all "
              f"({Stats.of(r['wall_s'] for r in results).fmt(0)} s wall), the model "
              f"{Stats.of(t['model_s'] for t in totals).fmt(1)} s: not the model "
              f"{Stats.of(t['not_model'] for t in totals).fmt(2)} of the run, "
              f"{Stats.of(t['recurring_not_model'] for t in totals).fmt(2)} of a recurring epoch; "
              f"against pure steps ({pure.median:.1f} s CPU): "
              f"{Stats.of(1 - pure.median / t['total_s'] for t in totals).fmt(2)}")
    if opt.compare:
        pairs = zip(runs["this tree"], runs["compare"])
        ratio = Stats.of(shares(a)["total_s"] / shares(b)["total_s"] for a, b in pairs)
        print(f"this tree / compare, CPU of the run, per round: {ratio.fmt(2)}")
    return {"runs": runs, "pure_steps_s": pure.median}


def phase_table(runs: dict[str, list[dict]]) -> list[str]:
    """Lines: each phase's CPU seconds, median [min-max] of the rounds, per tree, largest first."""
    names = list(runs)
    phases = {p for results in runs.values() for r in results for p in all_phases(r)}
    medians = {n: {p: Stats.of(all_phases(r).get(p, 0.0) for r in runs[n]) for p in phases} for n in names}
    lines = [f"{'phase (CPU s, median [min-max])':<52}" + "".join(f"{n:>22}" for n in names)]
    for phase in sorted(phases, key=lambda p: -medians[names[0]][p].median):
        kind = "model" if phase in MODEL_PHASES else "once" if phase in ONCE_PER_RUN else "epoch"
        lines.append(f"{phase[:44]:<45}{kind:>7}" + "".join(medians[n][phase].fmt(2, 22) for n in names))
    return lines


def compare_workers(opt: argparse.Namespace) -> list[str]:
    """Rows: per --workers of --epoch-workers, the train.py epoch's wall and CPU seconds (rounds in turns)."""
    runs: dict[int, list[dict]] = {w: [] for w in opt.epoch_workers}
    for _ in range(opt.epoch_rounds):
        for workers in runs:
            runs[workers].append(epoch_run(ROOT, opt, workers))
    first = opt.epoch_workers[0]
    lines = [f"{'--workers':<10}{'wall s':>22}{'CPU s':>22}{f'wall / {first} workers':>24}"]
    for workers, results in runs.items():
        ratio = Stats.of(r["wall_s"] / b["wall_s"] for r, b in zip(results, runs[first]))
        lines.append(f"{workers:<10}{Stats.of(r['wall_s'] for r in results).fmt(1, 22)}"
                     f"{Stats.of(shares(r)['total_s'] for r in results).fmt(1, 22)}{ratio.fmt(2, 24)}")
    return lines


def compare_threads(opt: argparse.Namespace) -> list[str]:
    """Rows: per model and size, the step's wall and CPU seconds with 1 thread and with one per usable core."""
    cores = available_cores()
    lines = [f"{'threads':<10}{'px':>5}{'1 thread wall':>16}{f'{cores} threads wall':>18}{'wall 1/N':>20}"
             f"{'1 thread CPU':>15}{f'{cores} threads CPU':>17}"]
    for cfg in opt.cfg:
        for img_size in opt.img:
            step, _ = build_step(cfg, img_size, opt.batch_size, opt.precisions[0] == "bf16")
            step()
            wall: dict[int, list[float]] = {1: [], cores: []}
            cpu: dict[int, list[float]] = {1: [], cores: []}
            for _ in range(opt.rounds):
                for threads in wall:
                    torch.set_num_threads(threads)
                    start_wall, start_cpu = time.perf_counter(), time.process_time()
                    step()
                    wall[threads].append(time.perf_counter() - start_wall)
                    cpu[threads].append(time.process_time() - start_cpu)
            ratio = Stats.of(a / b for a, b in zip(wall[1], wall[cores]))
            lines.append(f"{cfg:<10}{img_size:>5}{Stats.of(wall[1]).median:>16.2f}{Stats.of(wall[cores]).median:>18.2f}"
                         f"{ratio.fmt(2):>20}{Stats.of(cpu[1]).median:>15.2f}{Stats.of(cpu[cores]).median:>17.2f}")
    torch.set_num_threads(opt.threads or cores)
    return lines


def main(opt: argparse.Namespace) -> dict:
    if opt.threads > 0:
        torch.set_num_threads(opt.threads)
    clock = CLOCKS[opt.clock]
    print(header(f"bench_step: batch {opt.batch_size}, median [min-max] of {opt.rounds} rounds", clock=opt.clock))
    reference = Reference(n=1024, runs=5, clock=clock)
    reference.measure()
    rows = step_table(opt, reference, clock)
    result: dict = {"steps": rows}
    if opt.epoch:
        result["epoch"] = epoch_against_steps(opt, clock)
    if opt.epoch_workers:
        print("\n".join(compare_workers(opt)))
    if opt.compare_threads:
        print("\n".join(compare_threads(opt)))
        print("('wall 1/N' > 1: the usable cores' threads are faster; < 1: one thread is - the cores are busy)")
    reference.measure()
    print(reference.describe())
    return result


if __name__ == "__main__":
    main(parse_opt())
