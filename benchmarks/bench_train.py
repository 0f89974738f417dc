"""Training throughput: DDP scaling (one process vs 2 ranks), and training variants compared step for step
(float32 vs bfloat16 autocast, channels_last, torch.compile).

    python benchmarks/bench_train.py                   # DDP: yolov5n 128 px, total batch 16, 1 x 2 threads vs 2 x 1
    python benchmarks/bench_train.py --variants fp32 bf16 --cfg yolov5n yolov5s --img 320 640
    python benchmarks/bench_train.py --variants fp32 channels_last compile --img 320
    python benchmarks/bench_train.py --variants fp32 bf16+channels_last --batch-size 4 --repeats 5

DDP: images/s of one process (2 threads) and of a 2-rank gloo group (1 thread each) on the same total batch;
scaling efficiency = DDP / one process (1.0: two half-size processes train as fast as one using both cores).
Variants: each is ``+``-joined features of fp32 (plain), bf16 (CPU autocast, as --amp on), channels_last, compile
(torch.compile; its compile time is reported apart and not timed). Every variant trains its own copy of the
model; the variants take turns round by round, so a change in the machine's load hits all alike, and
"x first" is the median of the per-round ratios of each variant's images/s to the first variant's.
Batches are fixed random images with a few boxes each, so the figures are the trainer's (forward, loss,
backward, step, EMA), not the data pipeline's. A reference fp32 matmul is timed before and after
(benchmarks/harness.py); "matmuls/img" is the time per image in units of it, comparable between runs on a
loaded machine. Images/s are absolute (this machine, as loaded now). Figures are medians [min-max]. On a busy
machine compare variants with ``--threads 1 --clock cpu`` (this process's CPU time: the compute, not the waiting).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import CLOCKS, Reference, Stats, add_timing_flags, free_port, header, time_call  # noqa: E402

HYP = {"lr0": 0.01, "lrf": 1.0, "momentum": 0.937, "weight_decay": 5e-4, "warmup_epochs": 0.0, "box": 0.05,
       "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}
FEATURES = ("fp32", "bf16", "channels_last", "compile")


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", nargs="+", default=["yolov5n"], help="model YAMLs")
    p.add_argument("--img", type=int, nargs="+", default=None, help="image sizes (default: 128 for DDP, 320 else)")
    p.add_argument("--batch-size", type=int, default=None, help="total batch (default: 16 for DDP, 4 for variants)")
    p.add_argument("--variants", nargs="*", default=[], help="compare these (e.g. fp32 bf16 channels_last compile "
                   "bf16+channels_last) instead of the DDP scaling; the first is the base")
    p.add_argument("--steps", type=int, default=2, help="timed steps per round (variants) or repeat (DDP)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--repeats", type=int, default=3, help="rounds (variants) or repeats (DDP)")
    add_timing_flags(p, scope="variants: ")
    opt = p.parse_args(argv)
    for name in opt.variants:
        if any(f not in FEATURES for f in name.split("+")):
            p.error(f"variant {name!r}: features are {', '.join(FEATURES)}, joined with +")
    opt.img = opt.img or ([320] if opt.variants else [128])
    opt.batch_size = opt.batch_size or (4 if opt.variants else 16)
    if not opt.variants:
        opt.steps = max(opt.steps, 8)
    return opt


def make_batch(batch: int, img_size: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    imgs = torch.randint(0, 256, (batch, 3, img_size, img_size), dtype=torch.uint8, generator=g)
    rows = [[i, int(torch.randint(0, 3, (1,), generator=g)), *(torch.rand(2, generator=g) * 0.6 + 0.2).tolist(),
             *(torch.rand(2, generator=g) * 0.3 + 0.1).tolist()] for i in range(batch) for _ in range(3)]
    return imgs, torch.tensor(rows), tuple(str(i) for i in range(batch)), None


@dataclass
class Run:
    """One model training on fixed batches: ``steps(n)`` runs n batches (one Trainer.train_epoch)."""

    trainer: Any
    batches: list
    batch: int
    folder: tempfile.TemporaryDirectory  # the run folder the builder writes opt.yaml into

    def steps(self, n: int) -> None:
        self.trainer.train_loader = [self.batches[i % len(self.batches)] for i in range(n)]
        self.trainer.train_epoch(0)


def build_run(cfg: str, batch: int, img_size: int, device: torch.device, variant: str = "fp32",
              seed: int = 0, total_batch: int = 64) -> Run:
    """The trainer train.py builds (utils.training.builder: DDP-wrapped when a group is up) with the variant's
    features, on fixed batches of ``batch`` images per rank; ``total_batch`` sets the accumulation (the default 64,
    the nominal batch, steps the optimizer after every batch)."""
    import utils.distributed.comm as dist
    from utils.training.builder import TrainData, build_trainer
    from utils.training.config import RunConfig

    features = set(variant.split("+"))
    batches = [make_batch(batch, img_size, seed * 100 + i) for i in range(4)]
    folder = tempfile.TemporaryDirectory(prefix="bench_train")
    cuda_amp = "bf16" in features and device.type == "cuda"  # float16 with its gradient scaler, as --amp on
    config = RunConfig(cfg=cfg, epochs=10, batch_size=total_batch, img_size=img_size, optimizer="SGD",
                       amp="on" if cuda_amp else "off",
                       channels_last="channels_last" in features, compile="compile" in features, noplots=True,
                       save_dir=folder.name, seed=0)
    trainer = build_trainer(config, HYP, device, data=TrainData(batches, None, None, ["a", "b", "c"]))
    trainer.show_progress = False  # the timings print their own table
    if "bf16" in features and device.type == "cpu":
        trainer.amp = True  # bfloat16 autocast as the variant asks, even where --amp's check would turn it down
    assert dist.get_world_size() == 1 or isinstance(trainer.model, torch.nn.parallel.DistributedDataParallel)
    return Run(trainer, batches, batch, folder)


def compare_variants(opt: argparse.Namespace, cfg: str, img_size: int, reference: Reference) -> list[str]:
    """Rows of the variant table for one model and size: images/s, matmuls per image, ratio to the first."""
    runs, compile_s = [], {}
    for variant in opt.variants:
        runs.append(build_run(cfg, opt.batch_size, img_size, torch.device("cpu"), variant))
        start = time.perf_counter()
        runs[-1].steps(opt.warmup)
        if "compile" in variant:
            compile_s[variant] = time.perf_counter() - start
    seconds: list[list[float]] = [[] for _ in runs]
    for r in range(opt.repeats):
        for v in (range(len(runs)) if r % 2 == 0 else reversed(range(len(runs)))):
            seconds[v].append(time_call(lambda run=runs[v]: run.steps(opt.steps), 1, 0, clock=CLOCKS[opt.clock]).median)
    images = opt.steps * opt.batch_size
    rows = []
    for v, variant in enumerate(opt.variants):
        rate = Stats.of(images / s for s in seconds[v])
        ratio = Stats.of(base / s for s, base in zip(seconds[v], seconds[0]))
        note = f"  (compiling took {compile_s[variant]:.0f} s)" if variant in compile_s else ""
        rows.append(f"{cfg:<10}{img_size:>5}{variant:>22}{rate.fmt(2):>24}"
                    f"{reference.ratio(Stats.of(seconds[v]).median / images):>13.1f}{ratio.fmt(2):>20}{note}")
    return rows


def _ddp_worker(rank: int, port: int, opt: argparse.Namespace, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import utils.distributed.comm as dist

    dist.init_distributed("cpu", "gloo", 300, 300)
    try:
        rates = timed_rates(opt, opt.batch_size // 2, seed=rank)
        lean, every = collectives_per_step(opt, seed=rank), collectives_per_step(opt, seed=rank, sync_every_batch=True)
        if rank == 0:
            Path(out).write_text(" ".join(f"{r:.4f}" for r in rates) + f"\n{lean} {every}")
    finally:
        dist.cleanup()


def collectives_per_step(opt: argparse.Namespace, seed: int, sync_every_batch: bool = False) -> float:
    """Collectives of the default group per optimizer step (its sequence number counts them: the step vote, DDP's
    buffer broadcasts and gradient buckets), over 3 accumulations; ``sync_every_batch`` all-reduces gradients on
    every batch as before issue 12 (no no_sync). All ranks must call it."""
    import contextlib

    import torch.distributed as tdist

    from utils.training.optim import accumulate_steps

    accumulate = accumulate_steps(opt.batch_size)
    run = build_run(opt.cfg[0], opt.batch_size // 2, opt.img[0], torch.device("cpu"), seed=seed,
                    total_batch=opt.batch_size)
    if sync_every_batch:
        run.trainer.updater.sync_context = contextlib.nullcontext
    run.steps(accumulate)  # settle: the first step's buffer broadcast and bucket rebuild
    group = tdist.distributed_c10d._get_default_group()
    before, steps = group._get_sequence_number_for_group(), run.trainer.updater.steps
    run.steps(3 * accumulate)
    return (group._get_sequence_number_for_group() - before) / max(run.trainer.updater.steps - steps, 1)


def timed_rates(opt: argparse.Namespace, batch: int, seed: int = 0) -> list[float]:
    """Images/s (all ranks together) of each repeat of ``opt.steps`` steps, between barriers. All ranks call it."""
    import utils.distributed.comm as dist

    run = build_run(opt.cfg[0], batch, opt.img[0], torch.device("cpu"), seed=seed, total_batch=opt.batch_size)
    run.steps(opt.warmup)
    rates = []
    for _ in range(opt.repeats):
        dist.barrier()
        start = time.perf_counter()
        run.steps(opt.steps)
        dist.barrier()
        rates.append(opt.steps * batch * dist.get_world_size() / (time.perf_counter() - start))
    return rates


def ddp_scaling(opt: argparse.Namespace) -> dict[str, Stats]:
    """Images/s of one process with 2 threads and of 2 DDP ranks with 1 thread each."""
    single = Stats.of(timed_rates(opt, opt.batch_size))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ddp.txt"
        mp.start_processes(_ddp_worker, args=(free_port(), opt, str(out)), nprocs=2, start_method="spawn")
        rates, counts = out.read_text().splitlines()
        ddp = Stats.of(float(x) for x in rates.split())
    lean, every = (float(x) for x in counts.split())
    return {"single": single, "ddp": ddp, "collectives_per_step": lean, "collectives_per_step_sync_every": every}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    opt = parse_opt(argv)
    from utils.log import setup_logging

    setup_logging(1)  # quiet: only errors
    torch.set_num_threads(opt.threads if opt.variants and opt.threads else 2)
    what = "variants " + ", ".join(opt.variants) if opt.variants else "1 process vs DDP 2 ranks"
    clock = opt.clock if opt.variants else "wall"
    print(header(f"bench_train: {what}, total batch {opt.batch_size}, median [min-max] of {opt.repeats} x "
                 f"{opt.steps} steps", clock=clock))
    reference = Reference(n=1024, runs=5, clock=CLOCKS[clock])
    reference.measure()
    if opt.variants:
        rows = [row for cfg in opt.cfg for img in opt.img for row in compare_variants(opt, cfg, img, reference)]
        reference.measure()
        print(reference.describe())
        print(f"{'model':<10}{'px':>5}{'variant':>22}{'images/s':>24}{'matmuls/img':>13}{'x first':>20}")
        print("\n".join(rows))
        return {"rows": rows}
    figures = ddp_scaling(opt)
    reference.measure()
    print(reference.describe())
    single, ddp = figures["single"], figures["ddp"]
    from utils.training.optim import accumulate_steps

    accumulate = accumulate_steps(opt.batch_size)
    print(f"{opt.cfg[0]} {opt.img[0]} px, total batch {opt.batch_size}: {accumulate} batches per optimizer step "
          f"(nominal batch 64)")
    print(f"  1 process, 2 threads : {single.fmt(1):>22} img/s")
    print(f"  DDP 2 x 1 thread     : {ddp.fmt(1):>22} img/s")
    print(f"  scaling efficiency   : {ddp.median / single.median:>8.2f}   (DDP / 1 process medians; goal >= 0.97)")
    print(f"  collectives per optimizer step (2 ranks): {figures['collectives_per_step']:.1f}; with gradients "
          f"all-reduced on every batch (no no_sync): {figures['collectives_per_step_sync_every']:.1f}")
    if torch.cuda.is_available():
        run = build_run(opt.cfg[0], opt.batch_size, opt.img[0], torch.device("cuda", 0), "bf16")  # float16 on CUDA
        run.steps(opt.warmup)
        gpu = time_call(lambda: run.steps(opt.steps), opt.repeats, 0, sync=torch.cuda.synchronize)
        figures["cuda_amp"] = gpu.scaled(1 / (opt.steps * opt.batch_size))
        print(f"  1 GPU, AMP (float16) : {Stats.of(1 / s for s in figures['cuda_amp'].samples).fmt(1):>22} img/s "
              f"({torch.cuda.get_device_name(0)})")
    return {**figures, "scaling_efficiency": ddp.median / single.median}


if __name__ == "__main__":
    main()
