"""Training throughput on one device: train.py's step fed by the real loader against the same step on batches
already on the device, and the loader alone with the cores there are (the timed part of gpu_smoke.py).

    python -m tests.scripts.gpu_throughput --device 0                       # yolo11n and yolov5s at 640, AMP
    python -m tests.scripts.gpu_throughput --device cpu --img 64 --batch 2 --steps 2 --images 8   # the CPU check

Per model: the step is train.py's (the builder's model, the family's loss, SGD, float16 autocast and a gradient
scaler on CUDA); "model only" times ``--steps`` steps on one batch already on the device (uint8, cast there as
train.py casts), "end to end" the same steps on the batches of train.py's loader (mosaic and the default
augmentation, COCO-like 480-640 px JPEGs generated once, ``--workers`` workers, pinned memory and non-blocking
copies on CUDA), each after ``--warmup`` untimed steps; "loader" times the loader's batches alone. Images/s, and
end to end over model only (the goal on a GPU: at least 0.9). As train.py on CUDA (``--colour-on auto``), the
loader leaves the HSV colour change to the step, which applies it on the device (model only too, with drawn gains).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Throughput:
    """One model's figures (images/s)."""

    model: str
    img: int
    batch: int
    model_only: float
    end_to_end: float
    loader: float
    workers: int

    @property
    def ratio(self) -> float:
        return self.end_to_end / self.model_only if self.model_only else math.nan


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    from utils.training.builder import COLOUR_PLACES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["yolo11n", "yolov5s"])
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30, help="timed steps of each kind")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--images", type=int, default=256, help="generated training images (480-640 px JPEGs)")
    p.add_argument("--workers", type=int, default=0, help="loader workers (0: one per usable core, less one)")
    p.add_argument("--device", default="0", help="'0' (CUDA) or 'cpu'")
    p.add_argument("--out", type=Path, default=Path("/tmp/gpu_throughput"), help="folder for the generated set")
    p.add_argument("--colour-on", choices=COLOUR_PLACES, default="auto",
                   help="where the HSV change runs, as train.py's flag: auto = on the device when it is CUDA")
    opt = p.parse_args(argv)
    if min(opt.steps, opt.batch, opt.images) < 1 or opt.warmup < 0:
        p.error("--steps, --batch and --images must be >= 1, --warmup >= 0")
    return opt


def training_step(cfg: str, img: int, device: torch.device) -> tuple[Callable[..., None], torch.nn.Module]:
    """One train.py step on ``device`` (uint8 images, targets (n, 6) and the colour gains the loader left to it, if
    any, in; the weights updated), and the model."""
    from benchmarks.bench_step import HYP, family_loss
    from utils.device import autocast
    from utils.training.builder import build_model
    from utils.training.config import RunConfig
    from utils.training.engine import prepare_images
    from utils.training.optim import build_optimizer

    torch.manual_seed(0)
    model, _ = build_model(RunConfig(cfg=cfg, img_size=img), 3, ["circle", "square", "triangle"], device)
    model.train()
    loss_fn = family_loss(model, img)
    optimizer = build_optimizer(model, "SGD", HYP["lr0"], HYP["momentum"], HYP["weight_decay"])
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def step(imgs: torch.Tensor, targets: torch.Tensor, colour: torch.Tensor | None = None) -> None:
        images = prepare_images(imgs, device, None, colour=colour)
        with autocast(device, amp):
            loss, _ = loss_fn(model(images), targets.to(device, non_blocking=True))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(step: Callable[..., None], batches: Iterator, steps: int, warmup: int,
                      device: torch.device) -> float:
    """Images/s of ``steps`` steps on the next batches of ``batches`` after ``warmup`` untimed ones (each batch's
    colour gains, when it carries them, given to the step)."""
    from utils.data.colour import take_colour

    def next_step() -> int:
        imgs, targets, *rest = next(batches)  # then paths, shapes and a TaskBatch's extras
        step(imgs, targets, take_colour(rest[2:]))
        return len(imgs)

    for _ in range(warmup):
        next_step()
    _sync(device)
    start = time.perf_counter()
    images = sum(next_step() for _ in range(steps))
    _sync(device)
    return images / (time.perf_counter() - start)


def endless(loader: torch.utils.data.DataLoader) -> Iterator:
    """The loader's batches epoch after epoch (a new epoch's order each time)."""
    from utils.data.loader import set_epoch

    epoch = 0
    while True:
        set_epoch(loader, epoch)
        yield from loader
        epoch += 1


def build_loader(opt: argparse.Namespace, workers: int, colour_later: bool) -> torch.utils.data.DataLoader:
    """train.py's training loader on the generated COCO-like set (its batches handed back to the workers once
    copied into pinned memory, as train.py's are on CUDA; ``colour_later``: the colour change left to the step)."""
    from utils.data.loader import create_dataloader
    from utils.data.samples import DatasetOptions
    from utils.data.synthetic import ensure_synthetic
    from utils.hyp import load_hyp

    root = ensure_synthetic(opt.out / "set", n_train=opt.images, n_val=1, img_size=(480, 640), seed=0)
    options = DatasetOptions(img_size=opt.img, batch_size=opt.batch, augment=True, hyp=load_hyp(), nc=3, seed=0,
                             defer_colour=colour_later)
    return create_dataloader(root / "images" / "train", options, workers=workers, shuffle=True, recycle=True)[0]


def measure(cfg: str, opt: argparse.Namespace, loader: torch.utils.data.DataLoader, workers: int,
            device: torch.device) -> Throughput:
    """One model: model only, end to end, the loader alone."""
    from benchmarks.bench_train import make_batch
    from utils.data.colour import COLOUR_KEY

    step = training_step(cfg, opt.img, device)[0]
    imgs, targets = make_batch(opt.batch, opt.img, 0)[:2]
    imgs, targets = imgs.to(device), targets.to(device)
    gains = (1 + torch.rand(opt.batch, 3, device=device) * 0.4 - 0.2) if loader.dataset.colour_later else None
    resident = (lambda: (imgs, targets, (), (), {COLOUR_KEY: gains})) if gains is not None else \
        (lambda: (imgs, targets))
    model_only = images_per_second(step, iter(resident, None), opt.steps, opt.warmup, device)
    end_to_end = images_per_second(step, endless(loader), opt.steps, opt.warmup, device)
    batches = endless(loader)
    next(batches)
    start, images = time.perf_counter(), 0
    for _ in range(opt.steps):
        images += len(next(batches)[0])
    loader_rate = images / (time.perf_counter() - start)
    return Throughput(cfg, opt.img, opt.batch, model_only, end_to_end, loader_rate, workers)


def table(rows: list[Throughput]) -> list[str]:
    """One line per model: images/s of each kind and end to end over model only."""
    lines = [f"{'model':<10}{'img':>5}{'batch':>6}{'model only':>12}{'end to end':>12}{'ratio':>7}"
             f"{'loader':>10}{'workers':>9}"]
    for r in rows:
        lines.append(f"{r.model:<10}{r.img:>5}{r.batch:>6}{r.model_only:>12.1f}{r.end_to_end:>12.1f}"
                     f"{r.ratio:>7.2f}{r.loader:>10.1f}{r.workers:>9}")
    return lines


def main(opt: argparse.Namespace) -> list[Throughput]:
    from utils.device import available_cores, select_device
    from utils.training.builder import colour_in_step
    from utils.training.config import RunConfig

    device = select_device(opt.device)
    workers = opt.workers or max(available_cores() - 1, 1)
    loader = build_loader(opt, workers, colour_in_step(RunConfig(colour_on=opt.colour_on), device))  # as train.py
    rows = [measure(cfg, opt, loader, workers, device) for cfg in opt.models]
    print("\n".join(table(rows)), flush=True)
    return rows


if __name__ == "__main__":
    main(parse_opt())
