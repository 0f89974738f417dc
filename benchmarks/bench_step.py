"""CPU training step against the FLOP rate, and a whole train.py epoch against its pure steps.

    python benchmarks/bench_step.py --threads 1 --clock cpu                 # n and s at 320 and 640, fp32 and bf16
    python benchmarks/bench_step.py --threads 1 --clock cpu --compare /tmp/ts-old   # also an older checkout's step
    python benchmarks/bench_step.py --threads 1 --clock cpu --epoch         # also one train.py epoch (yolov5n 320)
    python benchmarks/bench_step.py --quick                                 # yolov5n 320, 2 rounds
    python benchmarks/bench_step.py --compare-threads --cfg yolov5n --img 320 --precisions fp32

Step: the batch's preparation, forward in train mode, the loss, backward and the SGD step, as train.py runs them
on the CPU, on a fixed batch of random images with a few boxes (no data pipeline), in a child process per
checkout (``--compare DIR``: also an older one, whose own code then builds its step). Its model FLOP/s are 3 x the
forward's FLOPs (forward + backward) x images/s, given as a share of a fp32 matmul timed in the same run before and
after (benchmarks/harness.py). Precisions and checkouts take turns round by round; "bf16/fp32" is the median of the
per-round ratios of their step times (< 1: bf16 is faster), "speed-up" the compared checkout's time over this one's.

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
from benchmarks.harness import (  # noqa: E402
    CLOCKS,
    Clock,
    Reference,
    ServeProcess,
    Stats,
    add_timing_flags,
    header,
    launch_env,
)

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
                   help="also time the step (and with --epoch the train.py epoch) of this checkout, in turns")
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # a StepProcess: time this tree's steps
    p.add_argument("--compare-threads", action="store_true",
                   help="also time the step with 1 thread and with one per usable core, in turns (wall and CPU)")
    p.add_argument("--quick", action="store_true", help="yolov5n at 320 only, 2 rounds")
    add_timing_flags(p)
    opt = p.parse_args(argv)
    if opt.quick:
        opt.cfg, opt.img, opt.rounds = opt.cfg[:1], opt.img[:1], 2
    return opt


def build_step(cfg: str, img_size: int, batch: int, bf16: bool):
    """A closure running one training step as train.py runs it (the builder's model and layout, the engine's batch
    preparation, the loss, backward, the optimizer of utils.training.optim with the default hyperparameters), on a
    fixed batch; and the model. It imports the project from sys.path: this tree, or the one a --serve process
    serves, whose step is then its own."""
    from utils.device import autocast
    from utils.training.builder import build_model
    from utils.training.config import RunConfig
    from utils.training.optim import build_optimizer

    try:
        from utils.training.engine import prepare_images
    except ImportError:  # a checkout from before the Trainer owned its loop
        from utils.training.engine import _prepare_images as prepare_images

    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model, _ = build_model(RunConfig(cfg=cfg, img_size=img_size), 3, ["a", "b", "c"], cpu)
    model.train()
    loss_fn = family_loss(model, img_size)
    optimizer = build_optimizer(model, "SGD", HYP["lr0"], HYP["momentum"], HYP["weight_decay"])
    imgs, targets, _, _ = make_batch(batch, img_size, 0)

    def step() -> None:
        images = prepare_images(imgs, cpu, None)
        with autocast(cpu, bf16):
            loss, _ = loss_fn(model(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def family_loss(model: torch.nn.Module, img_size: int):
    """The loss train.py trains ``model`` with: its head's family's, with the family's default hyperparameters; a
    checkout from before families had YOLOv5's alone (with HYP)."""
    try:
        from utils.hyp import load_hyp
        from utils.training.families import get_family
    except ImportError:
        from utils.training.loss import ComputeLoss

        return ComputeLoss(model, HYP, img_size)
    family = get_family(model.head.family)
    hyp = load_hyp(family.hyp_file, family.required_hyp, family.name)
    return family.loss(model, {**hyp, "img_size": img_size})


def serve(tree: str, batch: int, threads: int, clock_name: str) -> None:
    """Answer step-timing requests (one JSON line each on stdin: cfg, img, precision) with the seconds of one
    training step of ``tree``'s code; the steps of one cfg and size are built once."""
    sys.path.insert(0, str(Path(tree).resolve()))
    if threads > 0:
        torch.set_num_threads(threads)
    clock, steps = CLOCKS[clock_name], {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        key = (request["cfg"], request["img"], request["precision"])
        if key not in steps:
            steps = {k: v for k, v in steps.items() if k[:2] == key[:2]}  # one model size in memory at a time
            steps[key] = build_step(key[0], key[1], batch, key[2] == "bf16")[0]
        start = clock()
        steps[key]()
        print(json.dumps({"seconds": clock() - start}), flush=True)


class StepProcess(ServeProcess):
    """A ``serve`` process timing the training step of one checkout (this one, or --compare's)."""

    def __init__(self, tree: Path, opt: argparse.Namespace) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--serve", str(tree), "--batch-size",
                   str(opt.batch_size), "--threads", str(opt.threads), "--clock", opt.clock]
        env = {**os.environ, **({"OMP_NUM_THREADS": str(opt.threads)} if opt.threads > 0 else {})}
        super().__init__(tree, command, env)

    def step(self, cfg: str, img: int, precision: str) -> float:
        """Seconds of one training step (the first of a cfg, size and precision also builds it)."""
        return self.ask(cfg=cfg, img=img, precision=precision)


def step_seconds(trees: dict[str, StepProcess], cfg: str, img_size: int, opt: argparse.Namespace) \
        -> dict[tuple[str, str], Stats]:
    """Seconds per step of each (tree, precision): one warm-up step each, then per round one step of each,
    the trees taking turns (ABBA), so that a change of load hits them alike."""
    order = [(name, p) for name in trees for p in opt.precisions]
    for name, precision in order:
        trees[name].step(cfg, img_size, precision)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in order}
    for r in range(opt.rounds):
        for name, precision in order if r % 2 == 0 else order[::-1]:
            samples[name, precision].append(trees[name].step(cfg, img_size, precision))
    return {key: Stats.of(s) for key, s in samples.items()}


def step_table(opt: argparse.Namespace, reference: Reference) -> list[dict]:
    """Print and return, per model, size, precision and tree: ms/step, model GFLOP/s and its share of the matmul
    rate, bf16/fp32 and, with --compare, the speed-up over the compared tree (its time / this tree's, per round)."""
    from models.yolo import Model

    peak = reference.gflops(reference.before)
    trees = {"this tree": StepProcess(ROOT, opt), **({"compare": StepProcess(opt.compare.resolve(), opt)}
                                                    if opt.compare else {})}
    print(f"{'model':<10}{'px':>5}{'prec':>6}{'tree':>11}{'ms/step [min-max]':>22}{'img/s':>8}{'GFLOP/s':>9}"
          f"{'of matmul':>11}{'bf16/fp32':>20}{'speed-up':>20}")
    rows = []
    for cfg in opt.cfg:
        for img_size in opt.img:
            train_gflops = 3 * Model(cfg, nc=3).flops(img_size)  # forward + backward (2x) per image
            seconds = step_seconds(trees, cfg, img_size, opt)
            for (tree, precision), stats in seconds.items():
                rate = opt.batch_size / stats.median
                share = train_gflops * rate / peak
                ratio = paired(stats, seconds.get((tree, "fp32"))) if precision == "bf16" else ""
                gain = paired(seconds[("compare", precision)], stats) if opt.compare and tree != "compare" else ""
                print(f"{cfg:<10}{img_size:>5}{precision:>6}{tree:>11}{stats.scaled(1e3).fmt(0):>22}{rate:>8.2f}"
                      f"{train_gflops * rate:>9.1f}{share:>10.0%}{ratio:>20}{gain:>20}")
                rows.append({"cfg": cfg, "img": img_size, "precision": precision, "tree": tree,
                             "ms": stats.median * 1e3, "share_of_matmul": share})
    for process in trees.values():
        process.close()
    return rows


def paired(numerator: Stats, denominator: Stats | None) -> str:
    """'median [min-max]' of the per-round ratios of two figures timed in the same rounds ('' without both)."""
    if denominator is None:
        return ""
    return Stats.of(a / b for a, b in zip(numerator.samples, denominator.samples)).fmt(2)


def epoch_run(tree: Path, opt: argparse.Namespace, workers: int | None = None) -> dict:
    """One default train.py epoch (yolov5n, 320 px) of ``tree`` in a child process, timed phase by phase
    (benchmarks/epoch_phases.py), with OMP_NUM_THREADS = --threads and ``workers`` (None: train.py's default)."""
    with tempfile.TemporaryDirectory() as project:
        out = Path(project) / "phases.json"
        env = launch_env(OMP_NUM_THREADS=str(opt.threads or torch.get_num_threads()))
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
    from utils.device import available_cores

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
    if opt.serve:
        serve(opt.serve, opt.batch_size, opt.threads, opt.clock)
        return {}
    if opt.threads > 0:
        torch.set_num_threads(opt.threads)
    clock = CLOCKS[opt.clock]
    print(header(f"bench_step: batch {opt.batch_size}, median [min-max] of {opt.rounds} rounds", clock=opt.clock))
    reference = Reference(n=1024, runs=5, clock=clock)
    reference.measure()
    rows = step_table(opt, reference)
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
