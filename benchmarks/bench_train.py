"""Training throughput: one process (2 threads) vs 2-process DDP on gloo (1 thread each), same total batch.

    python benchmarks/bench_train.py                 # yolov5n at 128 px, total batch 16
    python benchmarks/bench_train.py --cfg yolov5s --img 160 --batch-size 32 --repeats 5

Prints images/s (median of repeats) and the DDP scaling efficiency = DDP images/s / one-process images/s
(1.0 = two half-size processes train as fast as one process using both cores). Batches are fixed random
images with a few boxes each, so the figure is the trainer's (forward, loss, backward, all-reduce, step,
EMA), not the data pipeline's. With CUDA, also one GPU with AMP.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HYP = {"lr0": 0.01, "lrf": 1.0, "momentum": 0.937, "weight_decay": 5e-4, "warmup_epochs": 0.0, "box": 0.05,
       "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}


def make_batch(batch: int, img_size: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    imgs = torch.randint(0, 256, (batch, 3, img_size, img_size), dtype=torch.uint8, generator=g)
    rows = [[i, int(torch.randint(0, 3, (1,), generator=g)), *(torch.rand(2, generator=g) * 0.6 + 0.2).tolist(),
             *(torch.rand(2, generator=g) * 0.3 + 0.1).tolist()] for i in range(batch) for _ in range(3)]
    return imgs, torch.tensor(rows), tuple(str(i) for i in range(batch)), None


def timed_steps(cfg: str, batch: int, img_size: int, steps: int, warmup: int, repeats: int, device: torch.device,
                amp: bool = False, seed: int = 0) -> list[float]:
    """Images/s of this process for each repeat (ddp when a group is initialised). All ranks call it."""
    import utils.dist as dist
    from models.yolo import Model
    from utils.engine import Trainer, train_one_epoch
    from utils.hooks import Hooks
    from utils.loss import ComputeLoss
    from utils.optim import LRSchedule, ModelEMA, WeightUpdater, build_optimizer
    from utils.writers import TrainWriters

    torch.manual_seed(0)
    core = Model(cfg, nc=3).to(device)
    model = torch.nn.parallel.DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda"
                                                      else None) if dist.is_initialized() else core
    ema = ModelEMA(core)
    updater = WeightUpdater(model, build_optimizer(core, "SGD", 0.01, 0.937, 5e-4), LRSchedule(HYP, 10, 10),
                            ema=ema, amp=amp)
    trainer = Trainer(opt=argparse.Namespace(epochs=10, batch_size=batch), hyp=HYP, device=device,
                      save_dir=Path(tempfile.gettempdir()), model=model, updater=updater, ema=ema,
                      compute_loss=ComputeLoss(core, HYP, img_size), train_loader=[], val_loader=None,
                      names=["a", "b", "c"], writers=TrainWriters(Path(tempfile.gettempdir()), enabled=False),
                      hooks=Hooks(), amp=amp)
    batches = [make_batch(batch, img_size, seed * 100 + i) for i in range(4)]
    rates = []
    for r in range(repeats + 1):
        n = warmup if r == 0 else steps
        trainer.train_loader = [batches[i % 4] for i in range(n)]
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_one_epoch(trainer, 0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        if r:
            rates.append(n * batch * dist.get_world_size() / (time.perf_counter() - t0))
    return rates


def _ddp_worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import utils.dist as dist

    dist.init_distributed("cpu", "gloo", 300, 300)
    try:
        rates = timed_steps(args.cfg, args.batch_size // 2, args.img, args.steps, args.warmup, args.repeats,
                            torch.device("cpu"), seed=rank)
        if rank == 0:
            Path(out).write_text(" ".join(f"{r:.4f}" for r in rates))
    finally:
        dist.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov5n")
    p.add_argument("--img", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="total batch (DDP: half per rank)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    from utils.log import setup_logging

    setup_logging(1)  # quiet: only errors
    torch.set_num_threads(2)
    single = statistics.median(timed_steps(args.cfg, args.batch_size, args.img, args.steps, args.warmup,
                                           args.repeats, torch.device("cpu")))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ddp.txt"
        mp.start_processes(_ddp_worker, args=(free_port(), args, str(out)), nprocs=2, start_method="spawn")
        ddp = statistics.median(float(x) for x in out.read_text().split())
    figures = {"cpu_1proc_2threads_img_s": single, "cpu_ddp2_1thread_img_s": ddp, "scaling_efficiency": ddp / single}
    print(f"{args.cfg} {args.img}px, total batch {args.batch_size}, median of {args.repeats} x {args.steps} steps")
    print(f"  1 process, 2 threads : {single:8.1f} img/s")
    print(f"  DDP 2 x 1 thread     : {ddp:8.1f} img/s")
    print(f"  scaling efficiency   : {ddp / single:8.2f}   (target >= 0.9)")
    if torch.cuda.is_available():
        gpu = statistics.median(timed_steps(args.cfg, args.batch_size, args.img, args.steps, args.warmup,
                                            args.repeats, torch.device("cuda", 0), amp=True))
        figures["cuda_1gpu_amp_img_s"] = gpu
        print(f"  1 GPU, AMP           : {gpu:8.1f} img/s ({torch.cuda.get_device_name(0)})")
    return figures


if __name__ == "__main__":
    main()
