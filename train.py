"""Train a YOLO detector on one process, or on many with torch.distributed.

    python train.py                                                   # synthetic data, CPU or one GPU
    python train.py --data coco128.yaml --cfg yolov5s --img 640 --batch-size 16
    torchrun --nproc_per_node 2 train.py --batch-size 64 --device 0,1   # batch is the total over ranks
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT train.py ...
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import yaml

import utils.dist as dist
from models.yolo import Model
from utils.callbacks import EarlyStopping, TrainWriters, progress_header
from utils.checkpoint import (
    load_checkpoint,
    load_first_good,
    new_checkpoint,
    save_checkpoint,
    save_run_checkpoints,
    to_plain,
)
from utils.cli import add_distributed_flags, distributed_session, run_main
from utils.errors import UserError
from utils.logging import LOGGER, colorstr, print_options
from utils.loss import ComputeLoss
from utils.optim import (
    LRSchedule,
    ModelEMA,
    Stepper,
    accumulate_steps,
    build_optimizer,
    describe_groups,
    scaled_weight_decay,
    unwrap,
)
from utils.paths import ROOT, increment_path
from utils.resume import (
    RUNTIME_OPTIONS,
    SaveInterval,
    TrainPosition,
    adapt_to_world_size,
    gather_rng_states,
    pack_train_state,
    plan_run,
    restore_rng_state,
    resume_options,
    rng_state_for,
    unpack_train_state,
)
from utils.signals import GracefulStop

DEFAULT_HYP = ROOT / "data" / "hyps" / "hyp.scratch.yaml"
SYNTHETIC_HYP = ROOT / "data" / "hyps" / "hyp.synthetic.yaml"  # tuned so the no-argument run converges in minutes
OPTIMIZERS = ("SGD", "Adam", "AdamW")
REQUIRED_HYP = ("lr0", "lrf", "momentum", "weight_decay", "box", "cls", "obj", "anchor_t")
DEFAULT_CFG = "yolov5n"
FAULT_ENV = "YOLO_TEST_FAIL_AT"  # test hook: "RANK:EPOCH:BATCH[:raise|kill|term]" faults that rank mid-epoch
NAN_ENV = "YOLO_TEST_NAN_AT"  # test hook: "RANK:EPOCH:BATCH[:COUNT]" makes that rank's loss NaN for COUNT batches
NONFINITE_LIMIT = 3  # consecutive non-finite steps before reloading the last good checkpoint with half the LR
ALWAYS_RUNTIME = ("resume", "device", "backend", "trust_weights", "local_rank")  # never taken from a checkpoint


class TrainError(UserError, ValueError):
    """A training option that cannot work (batch size vs world size, image size, hyp file)."""


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """Training options (the reference's flags plus the DDP ones); ``argv=None`` reads sys.argv."""
    p = argparse.ArgumentParser(prog="train.py", description="Train a YOLO detector (DDP-ready).")
    p.add_argument("--weights", default="", help="initial weights (a .pt written by train.py); '' = from scratch")
    p.add_argument("--trust-weights", action="store_true", help="allow full unpickling of --weights (trusted only)")
    p.add_argument("--cfg", default="", help="model YAML (path or name in models/); '' = the model of --weights, "
                   f"else {DEFAULT_CFG}")
    p.add_argument("--data", default=str(ROOT / "data" / "synthetic.yaml"), help="dataset YAML")
    p.add_argument("--hyp", default="", help="hyperparameter YAML; '' = data/hyps/hyp.synthetic.yaml for the built-in "
                   "synthetic set (when present), else data/hyps/hyp.scratch.yaml")
    p.add_argument("--epochs", type=int, default=18)
    p.add_argument("--batch-size", type=int, default=16, help="total batch over all ranks")
    p.add_argument("--img-size", "--imgsz", "--img", dest="img_size", type=int, default=128,
                   help="train and val image size (pixels)")
    p.add_argument("--rect", action="store_true", help="rectangular training batches")
    p.add_argument("--resume", nargs="?", const=True, default=False, help="resume the latest run, or the given last.pt")
    p.add_argument("--nosave", action="store_true", help="only save the final checkpoint")
    p.add_argument("--noval", action="store_true", help="only validate the final epoch")
    p.add_argument("--noautoanchor", action="store_true", help="keep the model's anchors")
    p.add_argument("--cache", nargs="?", const="ram", default=None, help="cache images in 'ram' or on 'disk'")
    p.add_argument("--device", default="", help="'cpu', a GPU '0', or GPUs '0,1' (one per local rank)")
    p.add_argument("--multi-scale", action="store_true", help="vary the image size by +/- 50%% per step")
    p.add_argument("--single-cls", action="store_true", help="train every class as one")
    p.add_argument("--optimizer", choices=["", *OPTIMIZERS], default="",
                   help="'' = the hyp file's 'optimizer' entry, else SGD")
    p.add_argument("--sync-bn", action="store_true", help="synchronised BatchNorm across ranks (DDP)")
    p.add_argument("--workers", type=int, default=8, help="max dataloader workers per rank")
    p.add_argument("--project", default=str(ROOT / "runs" / "train"), help="save to project/name")
    p.add_argument("--name", default="exp")
    p.add_argument("--exist-ok", action="store_true", help="reuse project/name instead of incrementing")
    p.add_argument("--cos-lr", action="store_true", help="cosine LR schedule")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--patience", type=int, default=100, help="epochs without improvement before stopping")
    p.add_argument("--freeze", nargs="+", type=int, default=[0], help="freeze the first N layers, or layers i j k")
    p.add_argument("--save-period", type=int, default=-1, help="also save epoch{N}.pt every N epochs")
    p.add_argument("--save-interval-steps", type=int, default=0, help="also save last.pt every N batches (mid-epoch)")
    p.add_argument("--save-interval-minutes", type=float, default=0.0, help="also save last.pt every M minutes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--evolve", type=int, nargs="?", const=300, default=0, help="evolve hyperparameters over N runs")
    add_distributed_flags(p)
    return p.parse_args(argv)


def main(opt: argparse.Namespace) -> None:
    """Join the process group, train (or evolve), and always tear the group down outside train()."""
    with distributed_session(opt) as device:
        opt, hyp = prepare_run(opt)
        print_options("train", opt)
        if opt.evolve:
            evolve(hyp, opt, device)
        else:
            train(hyp, opt, device)


def prepare_run(opt: argparse.Namespace) -> tuple[argparse.Namespace, dict]:
    """Run folder and checkpoint to resume (decided once on rank 0, every rank calls it after init), then the
    hyps and optimizer. A resumed run (--resume, or an elastic restart with no flag) takes the checkpoint's
    options and hyps, except the runtime flags given on the command line."""
    hyp = None
    if not opt.evolve:
        plan = plan_run(opt)
        if plan.resume_from:
            opt, hyp = resumed_options(opt, plan.resume_from, plan.reason)
        opt.save_dir = str(plan.save_dir)
    check_world_batch(opt.batch_size, dist.get_world_size())
    opt.hyp = opt.hyp or str(default_hyp_file(opt.data))
    hyp = load_hyp(hyp or opt.hyp)
    opt.optimizer = opt.optimizer or str(hyp.get("optimizer", "SGD"))
    if opt.optimizer not in OPTIMIZERS:
        raise TrainError(f"optimizer {opt.optimizer!r} (from {opt.hyp}) is not one of {', '.join(OPTIMIZERS)}")
    return opt, hyp


def resumed_options(opt: argparse.Namespace, resume_from: Path, reason: str) -> tuple[argparse.Namespace, dict]:
    """The options and hyps of the checkpoint to resume (last.pt, else best.pt when last.pt is damaged); runtime
    flags (device, workers, save intervals, ...) come from the command line when given there."""
    path, ckpt = load_first_good([resume_from, resume_from.with_name("best.pt")], trusted=opt.trust_weights)
    defaults = vars(parse_opt([]))
    given = {k for k in RUNTIME_OPTIONS if k in defaults and getattr(opt, k, None) != defaults[k]}
    opt = resume_options(opt, ckpt.get("opt") or {}, keep=tuple(given | set(ALWAYS_RUNTIME)))
    opt.weights = opt.resume = str(path)
    LOGGER.info(f"Resuming ({reason}) from {path}")
    return opt, ckpt.get("hyp") or {}


def check_world_batch(batch_size: int, world_size: int) -> None:
    if batch_size < 1 or batch_size % world_size:
        raise TrainError(f"--batch-size {batch_size} must be a positive multiple of the world size {world_size} "
                         "(it is the total over all ranks)")


def default_hyp_file(data: str) -> Path:
    """The hyp file used without --hyp: the synthetic set's tuned one for the built-in data, else the scratch one."""
    synthetic = Path(data).name == "synthetic.yaml" and SYNTHETIC_HYP.is_file()
    return SYNTHETIC_HYP if synthetic else DEFAULT_HYP


def load_hyp(path: str | Path | dict) -> dict:
    """Hyperparameters from a YAML file (or a dict), checked for the keys training needs."""
    if isinstance(path, dict):
        hyp = dict(path)
    else:
        if not Path(path).is_file():
            raise TrainError(f"--hyp {path} not found")
        hyp = yaml.safe_load(Path(path).read_text()) or {}
    missing = [k for k in REQUIRED_HYP if k not in hyp]
    if missing:
        raise TrainError(f"--hyp {path} lacks {', '.join(missing)}")
    return hyp


@dataclass
class Run:
    """Everything one training run holds; built once by ``setup`` and read by the loop."""

    opt: argparse.Namespace
    hyp: dict
    device: torch.device
    save_dir: Path
    model: nn.Module  # DDP-wrapped under DDP
    stepper: Stepper
    ema: ModelEMA
    compute_loss: ComputeLoss
    train_loader: Any
    val_loader: Any
    names: list[str]
    writers: TrainWriters
    amp: bool
    stopper: EarlyStopping
    start_epoch: int = 0
    best_fitness: float = 0.0
    grid: int = 32
    save_enabled: bool = True  # checkpoints are written by the main process only
    is_coco: bool = False
    start_samples: int = 0  # samples (all ranks) of start_epoch already done by a mid-epoch checkpoint
    batch_offset: int = 0  # batches of the current epoch done before this process started it
    rng_state: dict | None = None  # restored just before the first resumed batch

    @property
    def core(self) -> nn.Module:
        return unwrap(self.model)


def train(hyp: dict, opt: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """Train for ``opt.epochs`` (all ranks); returns the final metrics (same on every rank)."""
    run = setup(hyp, opt, device)
    try:
        return fit(run)
    finally:
        run.writers.close()


def setup(hyp: dict, opt: argparse.Namespace, device: torch.device) -> Run:
    """Run folder, data, model, optimizer, EMA and DDP wrapper; every rank builds the same model."""
    from utils.datasets import load_data_config

    check_world_batch(opt.batch_size, dist.get_world_size())
    if opt.sync_bn and dist.get_world_size() > 1 and device.type != "cuda":
        raise TrainError("--sync-bn needs CUDA (torch's SyncBatchNorm does not run on CPU); drop it for CPU/gloo runs")
    save_dir = setup_run_dir(opt, hyp)
    seed_everything(opt.seed)  # the same on every rank: identical initial weights
    data_cfg = load_data_config(opt.data)
    nc, names = (1, ["item"]) if opt.single_cls else (data_cfg.nc, list(data_cfg.names))
    model, ckpt = build_model(opt, nc, names, device)
    grid = max(int(model.stride.max()), 32)
    if opt.img_size % grid:
        raise TrainError(f"--img-size {opt.img_size} must be a multiple of the model's largest stride {grid}")
    train_loader, train_set, val_loader = build_data(opt, hyp, data_cfg, grid, nc)
    if not opt.noautoanchor and not opt.resume:
        from utils.anchors import check_anchors

        check_anchors(train_set, model, thr=hyp["anchor_t"], img_size=opt.img_size)  # rank 0 decides, broadcast
    dist.check_agreement(fingerprint(model, opt, hyp, train_set))
    amp = decide_amp(model, device)
    ema = ModelEMA(model)
    stepper = build_stepper(model, opt, hyp, len(train_loader), ema, amp)
    model = wrap_ddp(model, opt, device)
    stepper.model = model
    main_process = dist.is_main_process()
    writers = TrainWriters(save_dir, enabled=main_process)
    writers.background.submit(_plot_labels, train_set, names, save_dir)
    run = Run(opt=opt, hyp=hyp, device=device, save_dir=save_dir, model=model, stepper=stepper, ema=ema,
              compute_loss=ComputeLoss(unwrap(model), hyp, opt.img_size, opt.label_smoothing),
              train_loader=train_loader, val_loader=val_loader, names=names, writers=writers, amp=amp,
              stopper=EarlyStopping(opt.patience), grid=grid, save_enabled=main_process,
              is_coco=bool(data_cfg.is_coco))
    if opt.resume and ckpt is not None:
        restore_training_state(run, ckpt)
    return run


def setup_run_dir(opt: argparse.Namespace, hyp: dict) -> Path:
    """runs/train/exp{N}, chosen by rank 0 and broadcast; rank 0 writes opt.yaml and hyp.yaml there."""
    save_dir = getattr(opt, "save_dir", None)
    if not save_dir:
        chosen = str(increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok)) \
            if dist.is_main_process() else None
        save_dir = dist.broadcast_object(chosen)
    opt.save_dir = str(save_dir)
    save_dir = Path(save_dir)
    if dist.is_main_process():
        (save_dir / "weights").mkdir(parents=True, exist_ok=True)
        (save_dir / "opt.yaml").write_text(yaml.safe_dump(to_plain(vars(opt)), sort_keys=False))
        (save_dir / "hyp.yaml").write_text(yaml.safe_dump(to_plain(hyp), sort_keys=False))
    LOGGER.info(colorstr("hyperparameters: ") + ", ".join(f"{k}={v}" for k, v in hyp.items()))
    return save_dir


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(opt: argparse.Namespace, nc: int, names: list[str],
                device: torch.device) -> tuple[Model, dict | None]:
    """A model from --cfg (or the checkpoint's YAML), with the matching tensors of --weights transferred."""
    ckpt = load_checkpoint(opt.weights, trusted=opt.trust_weights) if opt.weights else None
    cfg = opt.cfg or (ckpt["model_yaml"] if ckpt else DEFAULT_CFG)
    model = Model(cfg, nc=nc)
    model.names = list(names)
    if ckpt is not None:
        skip_anchors = bool(opt.cfg) and not opt.resume  # a given --cfg brings its own anchors
        own = model.state_dict()
        matched = {k: v for k, v in ckpt["model"].items()
                   if k in own and v.shape == own[k].shape and not (skip_anchors and "anchors" in k)}
        model.load_state_dict(matched, strict=False)
        model.detect.clear_grid_cache()
        LOGGER.info(f"Transferred {len(matched)}/{len(own)} items from {opt.weights}")
    freeze_layers(model, opt.freeze)
    return model.to(device), ckpt


def freeze_layers(model: Model, freeze: list[int]) -> None:
    """``--freeze N`` freezes layers 0..N-1; ``--freeze i j k`` freezes those layers."""
    layers = list(range(freeze[0])) if len(freeze) == 1 else list(freeze)
    prefixes = tuple(f"model.{i}." for i in layers)
    frozen = 0
    for name, param in model.named_parameters():
        if prefixes and name.startswith(prefixes):
            param.requires_grad_(False)
            frozen += 1
    if frozen:
        LOGGER.info(f"Froze {frozen} tensors in layers {layers}")


def build_data(opt: argparse.Namespace, hyp: dict, data_cfg: Any, grid: int, nc: int) -> tuple[Any, Any, Any]:
    """Train loader (distributed sampler, augmented) and the sharded val loader; batch is per rank."""
    from utils.loader import create_dataloader

    batch = opt.batch_size // dist.get_world_size()
    common = dict(hyp=hyp, cache=opt.cache, workers=opt.workers, seed=opt.seed, single_cls=opt.single_cls, nc=nc)
    train_loader, train_set = create_dataloader(data_cfg.train, opt.img_size, batch, grid, augment=True,
                                                rect=opt.rect, prefix=colorstr("train: "), shuffle=not opt.rect,
                                                **common)
    val_loader, _ = create_dataloader(data_cfg.val, opt.img_size, batch * 2, grid, rect=True, pad=0.5,
                                      prefix=colorstr("val: "), shard_eval=True, **common)
    labels = np.concatenate(train_set.labels, 0) if len(train_set.labels) else np.zeros((0, 5))
    if len(labels) and labels[:, 0].max() >= nc:
        raise TrainError(f"{opt.data}: label class {int(labels[:, 0].max())} exceeds nc={nc}")
    LOGGER.info(f"Using {train_loader.num_workers} dataloader workers and batch {batch} per rank, "
                f"{dist.get_world_size()} ranks")
    return train_loader, train_set, val_loader


def fingerprint(model: Model, opt: argparse.Namespace, hyp: dict, dataset: Any) -> dict[str, Any]:
    """What every rank must agree on before training: model size, config, data and hyp hashes."""
    def digest(obj: Any) -> str:
        return hashlib.sha1(yaml.safe_dump(to_plain(obj), sort_keys=True).encode()).hexdigest()[:12]

    options = {k: v for k, v in vars(opt).items() if k not in ("local_rank", "save_dir")}
    data = [len(dataset), [str(Path(f).name) for f in dataset.im_files],
            [round(float(np.asarray(lb).sum()), 3) for lb in dataset.labels]]
    return {"params": sum(p.numel() for p in model.parameters()), "config": digest(model.yaml),
            "anchors": digest(model.detect.anchors.tolist()), "data": digest(data), "hyp": digest(hyp),
            "options": digest(options)}


def decide_amp(model: Model, device: torch.device) -> bool:
    """Mixed precision on CUDA when autocast output matches fp32 closely; checked on rank 0, broadcast."""
    usable = False
    if device.type == "cuda" and dist.is_main_process():
        probe = torch.rand(1, 3, 64, 64, device=device)
        model.eval()
        with torch.no_grad():
            ref = model(probe)
            with torch.amp.autocast("cuda"):
                low = model(probe)
        model.train()
        usable = bool(torch.allclose(ref.float(), low.float(), atol=0.1, rtol=0.1))
    usable = bool(dist.broadcast_object(usable))
    if device.type == "cuda":
        LOGGER.info(f"AMP: {'enabled' if usable else 'disabled (autocast output differs)'}")
    return usable


def build_stepper(model: Model, opt: argparse.Namespace, hyp: dict, batches_per_epoch: int, ema: ModelEMA,
                  amp: bool) -> Stepper:
    """Optimizer with decay scaled to the nominal batch, LR schedule with warmup, AMP scaler and EMA."""
    accumulate = accumulate_steps(opt.batch_size)
    decay = scaled_weight_decay(hyp["weight_decay"], opt.batch_size, accumulate)
    optimizer = build_optimizer(model, opt.optimizer, hyp["lr0"], hyp["momentum"], decay)
    LOGGER.info(f"{colorstr('optimizer:')} {describe_groups(optimizer)}; accumulate {accumulate} batches, "
                f"weight_decay {decay:g}")
    schedule = LRSchedule(hyp, opt.epochs, batches_per_epoch, cosine=opt.cos_lr, accumulate=accumulate)
    return Stepper(model, optimizer, schedule, ema=ema, amp=amp)


def wrap_ddp(model: Model, opt: argparse.Namespace, device: torch.device) -> nn.Module:
    """DistributedDataParallel (device_ids on CUDA only), SyncBatchNorm with --sync-bn; as is for one process."""
    if dist.get_world_size() == 1:
        return model
    if opt.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        LOGGER.info("Using SyncBatchNorm()")
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, output_device=device_ids and device_ids[0])


def _plot_labels(dataset: Any, names: list[str], save_dir: Path) -> None:
    from utils.plots import plot_labels

    labels = np.concatenate(dataset.labels, 0) if len(dataset.labels) else np.zeros((0, 5), np.float32)
    plot_labels(labels, names, save_dir)


def fit(run: Run) -> dict[str, float]:
    """The epoch loop: train, validate (every rank, sharded), log, checkpoint, stop early. All ranks call it."""
    from utils.engine import train_one_epoch

    opt, start, t0 = run.opt, run.start_epoch, time.time()
    LOGGER.info(f"Image sizes {opt.img_size} train, {opt.img_size} val\nLogging results to {run.save_dir}\n"
                f"Starting training for {opt.epochs} epochs...")
    metrics, epoch = dict.fromkeys(("precision", "recall", "mAP_0.5", "mAP_0.5:0.95"), 0.0), start - 1
    with GracefulStop() as stop:  # SIGTERM/SIGINT: save last.pt at the next batch boundary, then stop
        guard = NonFiniteGuard(run)
        on_batch = batch_hook(run, stop, SaveInterval(opt.save_interval_steps, opt.save_interval_minutes), guard)
        for epoch in range(start, opt.epochs):
            final = epoch == opt.epochs - 1
            sizes = begin_epoch(run, epoch)
            LOGGER.info(progress_header())
            if run.rng_state is not None:  # the last thing before the first resumed batch
                restore_rng_state(run.rng_state)
                run.rng_state = None
            mean_loss = train_one_epoch(run.model, run.train_loader, run.stepper, loss_for(run, epoch),
                                        device=run.device, epoch=epoch, epochs=opt.epochs, img_size=opt.img_size,
                                        amp=run.amp, step_sizes=sizes, loss_scale=dist.get_world_size(),
                                        show_progress=run.writers.enabled, on_nonfinite=guard.skipped,
                                        on_batch=lambda i, imgs, targets, paths, e=epoch: on_batch(e, i, imgs,
                                                                                                  targets, paths))
            losses = dist.all_reduce_mean(mean_loss.detach().clone()).tolist()
            if not opt.noval or final:
                metrics = validate(run, final)
            fitness_value = fitness_of(metrics)
            run.best_fitness = max(run.best_fitness, fitness_value)
            run.writers.epoch_end(epoch, losses, list(metrics.values()), run.stepper.lrs())
            save_checkpoints(run, epoch, fitness_value, final)
            guard.end_epoch(epoch)
            if stop.should_stop():  # a signal during validation: last.pt was just written
                stop.raise_stop()
            if decide_stop(run.stopper, epoch, fitness_value):
                break
    hours = (time.time() - t0) / 3600
    LOGGER.info(f"\n{epoch - start + 1} epochs completed in {hours:.3f} hours.")
    run.writers.background.submit(_plot_results, run.save_dir / "results.csv")
    LOGGER.info(f"Results saved to {colorstr('bold', str(run.save_dir))}")
    return metrics


def decide_stop(stopper: EarlyStopping, epoch: int, fitness_value: float) -> bool:
    """Early stopping decided by rank 0 and broadcast, so every rank leaves the loop together. All ranks call it."""
    return bool(dist.broadcast_object(stopper(epoch, fitness_value) if dist.is_main_process() else None))


def _set_epoch(loader: Any, epoch: int) -> None:
    from utils.loader import set_epoch

    set_epoch(loader, epoch)


def step_sizes(run: Run, epoch: int) -> list[int] | None:
    """With --multi-scale, the image size of every step of this epoch: drawn on rank 0, broadcast once."""
    if not run.opt.multi_scale:
        return None
    sizes = None
    if dist.is_main_process():
        rng = random.Random(run.opt.seed * 1000 + epoch)
        low, high = int(run.opt.img_size * 0.5), int(run.opt.img_size * 1.5) + run.grid
        sizes = [max(rng.randrange(low, high) // run.grid * run.grid, run.grid) for _ in range(len(run.train_loader))]
    return dist.broadcast_object(sizes)


def begin_epoch(run: Run, epoch: int) -> list[int] | None:
    """Select the epoch's sample order; in the first epoch of a mid-epoch resume, skip the batches already done.
    Returns the multi-scale sizes of the batches that remain (None without --multi-scale). All ranks call it."""
    from utils.loader import set_start

    _set_epoch(run.train_loader, epoch)
    sizes = step_sizes(run, epoch)  # drawn for the whole epoch, so a resumed epoch gets the same sizes
    run.batch_offset = run.start_samples // run.opt.batch_size
    if run.start_samples:
        set_start(run.train_loader, run.start_samples)
        run.start_samples = 0
    return sizes[run.batch_offset:] if sizes is not None else None


def batch_hook(run: Run, stop: GracefulStop, interval: SaveInterval, guard: NonFiniteGuard) -> Any:
    """After each batch (all ranks): plot the first three batches of the first epoch (main process, in the
    background); the test-only fault injection (env ``YOLO_TEST_FAIL_AT``); then, on a signal or when
    --save-interval-* is due, a mid-epoch last.pt (and StopRequested after a signal)."""
    fault = _test_spec(FAULT_ENV)

    def on_batch(epoch: int, i: int, imgs: torch.Tensor, targets: torch.Tensor, paths: Any) -> None:
        i += run.batch_offset  # the batch's index in the whole epoch
        guard.batch_done()
        if epoch == run.start_epoch and i < 3 and not run.batch_offset:
            run.writers.background.submit(_plot_batch, imgs.detach().cpu().clone(), targets.detach().cpu().clone(),
                                          paths, run.save_dir / f"train_batch{i}.jpg", run.names)
        if fault and (int(fault[0]), int(fault[1])) == (epoch, i):
            _inject_fault(fault[2] if len(fault) > 2 else "raise", epoch, i)
        if stop.should_stop() or interval.due(run.stepper.iteration):  # collectives: the same batch everywhere
            write_checkpoint(run, epoch - 1, epoch, (i + 1) * run.opt.batch_size)
            if stop.signum:
                stop.raise_stop()

    return on_batch


def _test_spec(env: str) -> list[str] | None:
    """The fields after RANK of a test hook ``RANK:...`` for this rank, on the first attempt only; else None."""
    spec = os.environ.get(env, "")
    if not spec or dist.restart_count() > 0:
        return None
    rank, *fields = spec.split(":")
    return fields if int(rank) == dist.get_rank() else None


def _inject_fault(action: str, epoch: int, batch: int) -> None:
    """Test hook: 'raise' an error, 'kill' this process (SIGKILL) or 'term' it (SIGTERM, a graceful stop)."""
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    else:
        raise RuntimeError(f"rank {dist.get_rank()}: test fault injected at epoch {epoch} batch {batch}")


def loss_for(run: Run, epoch: int) -> Any:
    """``run.compute_loss``; with the test hook ``YOLO_TEST_NAN_AT=RANK:EPOCH:BATCH[:COUNT]``, one whose loss is
    NaN on that rank for COUNT batches from BATCH of EPOCH (first attempt only)."""
    spec = _test_spec(NAN_ENV)
    if spec is None or int(spec[0]) != epoch:
        return run.compute_loss
    first, count = int(spec[1]), int(spec[2]) if len(spec) > 2 else 1
    batches = itertools.count(run.batch_offset)

    def poisoned(preds: Any, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss, items = run.compute_loss(preds, targets)
        return (loss * float("nan"), items) if first <= next(batches) < first + count else (loss, items)

    return poisoned


class NonFiniteGuard:
    """Counts steps skipped for a non-finite loss (the same on every rank: the engine decides collectively) and,
    after NONFINITE_LIMIT in a row, reloads the last good checkpoint with half the learning rate."""

    def __init__(self, run: Run) -> None:
        self.run, self.in_epoch, self.total, self.in_a_row, self.flagged = run, 0, 0, 0, False

    def skipped(self, i: int) -> None:
        self.in_epoch, self.total, self.in_a_row, self.flagged = self.in_epoch + 1, self.total + 1, \
            self.in_a_row + 1, True
        if self.in_a_row >= NONFINITE_LIMIT:
            reload_last_good(self.run, self.in_a_row)
            self.in_a_row = 0

    def batch_done(self) -> None:
        """After every batch: a finite one ends a run of non-finite steps."""
        self.in_a_row = self.in_a_row if self.flagged else 0
        self.flagged = False

    def end_epoch(self, epoch: int) -> None:
        """One line per epoch on rank 0: resident memory, and the steps skipped for a non-finite loss."""
        skipped = f"; skipped {self.in_epoch} steps with a non-finite loss ({self.total} in all)" \
            if self.in_epoch else ""
        LOGGER.info(f"Epoch {epoch}: resident memory {resident_mb():.0f} MB{skipped}")
        self.in_epoch = 0


def reload_last_good(run: Run, in_a_row: int) -> None:
    """Weights, EMA and optimizer of the last good last.pt (the data position and schedule go on) with every
    group's learning rate halved. All ranks call it, together (storage shared by the ranks, as for resume)."""
    from utils.checkpoint import CheckpointError
    from utils.resume import ResumeError

    stepper = run.stepper
    initial_lrs = [g["initial_lr"] for g in stepper.optimizer.param_groups]
    counters = stepper.iteration, stepper.steps
    try:
        path, ckpt = load_first_good([run.save_dir / "weights" / "last.pt"])
        unpack_train_state(ckpt["train_state"], model=run.core, stepper=stepper)
        source = f"reloaded {path}"
    except (CheckpointError, ResumeError, KeyError):
        source = "no checkpoint to reload yet, weights kept"
    stepper.iteration, stepper.steps = counters
    stepper.last_step = stepper.iteration - 1  # a fresh accumulation starts with the next batch
    stepper.optimizer.zero_grad(set_to_none=True)
    for group, lr in zip(stepper.optimizer.param_groups, initial_lrs):
        group["initial_lr"] = lr * 0.5
    LOGGER.warning(f"WARNING: non-finite loss in {in_a_row} steps in a row: {source}; learning rate halved to "
                   f"{initial_lrs[0] * 0.5:g}")


def resident_mb() -> float:
    """This process's resident memory in MB (VmRSS of /proc/self/status; 0 where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _plot_batch(imgs: torch.Tensor, targets: torch.Tensor, paths: Any, fname: Path, names: list[str]) -> None:
    from utils.plots import plot_images

    plot_images(imgs, targets, paths, fname, names)


def _plot_results(csv_path: Path) -> None:
    from utils.plots import plot_results

    plot_results(csv_path)


def validate(run: Run, final: bool) -> dict[str, float]:
    """Distributed validation of the EMA model on every rank's shard; the same numbers on every rank."""
    from utils.engine import evaluate

    result = evaluate(run.ema.ema, run.val_loader, device=run.device, names=run.names, single_cls=run.opt.single_cls,
                      half=run.amp, save_dir=run.save_dir, plots=final and run.writers.enabled,
                      is_coco=run.is_coco and final)
    return {"precision": float(result.mp), "recall": float(result.mr), "mAP_0.5": float(result.map50),
            "mAP_0.5:0.95": float(result.map)}


def fitness_of(metrics: dict[str, float]) -> float:
    """0.1 mAP@.5 + 0.9 mAP@.5:.95 of a validate() dict (how best.pt is chosen)."""
    from utils.metrics import fitness

    return fitness(list(metrics.values()))


def train_state(run: Run, epoch: int, samples_seen: int) -> dict[str, Any]:
    """What exact resume needs beyond the EMA weights: the position (epoch in progress, samples of it done), raw
    weights and pending gradients, optimizer/scaler/EMA/counters, early-stopping state and every rank's RNG
    states. All ranks call it (the RNG states are gathered)."""
    position = TrainPosition(epoch=epoch, samples_seen=samples_seen, batch_size=run.opt.batch_size,
                             world_size=dist.get_world_size(), accumulate=run.stepper.schedule.accumulate)
    return pack_train_state(position, gather_rng_states(), grads_of=run.core, model=run.core, stepper=run.stepper,
                            stopper=run.stopper)


def write_checkpoint(run: Run, completed_epoch: int, epoch: int, samples_seen: int, *, is_best: bool = False,
                     period_name: str | None = None) -> None:
    """last.pt (the EMA weights plus the exact-resume state at ``epoch``/``samples_seen``), then a stripped
    best.pt when ``is_best`` and ``period_name`` as a copy of last.pt. All ranks call it; the main process writes."""
    state = train_state(run, epoch, samples_seen)
    if not run.save_enabled:
        return
    weights = run.save_dir / "weights"
    ckpt = new_checkpoint(run.core, state_dict=run.ema.ema.state_dict(), epoch=completed_epoch,
                          best_fitness=run.best_fitness, opt=vars(run.opt), hyp=run.hyp, train_state=state)
    save_run_checkpoints(ckpt, weights, period_name=period_name)
    if is_best:  # after last.pt, so the two are never both missing
        save_checkpoint({k: v for k, v in ckpt.items() if k != "train_state"}, weights / "best.pt")


def save_checkpoints(run: Run, epoch: int, fitness_value: float, final: bool) -> None:
    """End of epoch: last.pt (only the final one with --nosave), best.pt on a new best fitness, epoch{N}.pt
    every --save-period epochs. All ranks call it; written atomically by the main process."""
    if run.opt.nosave and not final:
        return
    period = run.opt.save_period > 0 and (epoch + 1) % run.opt.save_period == 0
    write_checkpoint(run, epoch, epoch + 1, 0, is_best=fitness_value >= run.best_fitness,
                     period_name=f"epoch{epoch}.pt" if period else None)


def restore_training_state(run: Run, ckpt: dict) -> None:
    """Continue a run from a checkpoint's train_state: weights, pending gradients, optimizer, EMA, schedule,
    epoch and sample position, RNG (restored later, before the first batch); adapted to this world size."""
    state = ckpt.get("train_state")
    if not state:
        raise TrainError("--resume: the checkpoint has no training state (it is a final or stripped one)")
    position = unpack_train_state(state, grads_of=run.core, model=run.core, stepper=run.stepper, stopper=run.stopper)
    position, _ = adapt_to_world_size(position, dist.get_world_size())  # logs what changed
    run.start_epoch, run.start_samples = position.epoch, position.samples_seen
    run.best_fitness = float(ckpt["best_fitness"])
    run.rng_state = rng_state_for(state, dist.get_rank(), dist.get_world_size())
    dropped = run.writers.csv.drop_from(position.epoch)  # rows written after this checkpoint, before a crash
    LOGGER.info(f"Resuming from epoch {run.start_epoch} of {run.opt.epochs}, batch {position.step_in_epoch}, "
                f"in {run.save_dir}" + (f" (dropped {dropped} later rows of results.csv)" if dropped else ""))


# Hyperparameter evolution: key -> (mutation gain, lower bound, upper bound); gain 0 keeps the value fixed.
EVOLVE_BOUNDS = {
    "lr0": (1, 1e-5, 1e-1), "lrf": (1, 0.01, 1.0), "momentum": (0.3, 0.6, 0.98), "weight_decay": (1, 0.0, 0.001),
    "warmup_epochs": (1, 0.0, 5.0), "warmup_momentum": (1, 0.0, 0.95), "warmup_bias_lr": (1, 0.0, 0.2),
    "box": (1, 0.02, 0.2), "cls": (1, 0.2, 4.0), "cls_pw": (1, 0.5, 2.0), "obj": (1, 0.2, 4.0),
    "obj_pw": (1, 0.5, 2.0), "iou_t": (0, 0.1, 0.7), "anchor_t": (1, 2.0, 8.0), "fl_gamma": (0, 0.0, 2.0),
    "hsv_h": (1, 0.0, 0.1), "hsv_s": (1, 0.0, 0.9), "hsv_v": (1, 0.0, 0.9), "degrees": (1, 0.0, 45.0),
    "translate": (1, 0.0, 0.9), "scale": (1, 0.0, 0.9), "shear": (1, 0.0, 10.0), "perspective": (0, 0.0, 0.001),
    "flipud": (1, 0.0, 1.0), "fliplr": (0, 0.0, 1.0), "mosaic": (1, 0.0, 1.0), "mixup": (1, 0.0, 1.0)}


def mutate(base: dict, history: list[tuple[float, dict]], rng: np.random.Generator,
           probability: float = 0.8, sigma: float = 0.2) -> dict:
    """A new hyp: a parent picked among the 5 fittest (fitness-weighted), each gene scaled by ~N(1, sigma)."""
    if not history:
        return dict(base)
    top = sorted(history, key=lambda h: h[0], reverse=True)[:5]
    weights = np.array([f for f, _ in top]) - min(f for f, _ in top) + 1e-6
    parent = top[rng.choice(len(top), p=weights / weights.sum())][1]
    keys = [k for k in EVOLVE_BOUNDS if k in parent]
    gains = np.array([EVOLVE_BOUNDS[k][0] for k in keys], dtype=float)
    factors = np.ones(len(keys))
    while len(keys) and np.all(factors == 1):  # mutate until something changes
        mask = rng.random(len(keys)) < probability
        factors = (gains * mask * rng.standard_normal(len(keys)) * rng.random() * sigma + 1).clip(0.3, 3.0)
    child = dict(parent)
    for key, factor in zip(keys, factors):
        low, high = EVOLVE_BOUNDS[key][1:]
        child[key] = round(float(np.clip(parent[key] * factor, low, high)), 5)
    return child


def evolve(base_hyp: dict, opt: argparse.Namespace, device: torch.device) -> dict:
    """--evolve N: N short runs (final-epoch validation only, final checkpoint only), each with hyps mutated
    from the fittest so far; writes evolve.csv and hyp_evolve.yaml (the best). All ranks call it."""
    opt.noval, opt.nosave = True, True
    chosen = str(increment_path(Path(opt.project) / f"{opt.name}-evolve", exist_ok=opt.exist_ok)) \
        if dist.is_main_process() else None
    evolve_dir = Path(dist.broadcast_object(chosen))
    rng, history = np.random.default_rng(opt.seed), []
    for generation in range(opt.evolve):
        hyp = dist.broadcast_object(mutate(base_hyp, history, rng) if dist.is_main_process() else None)
        run_opt = argparse.Namespace(**{**vars(opt), "save_dir": str(evolve_dir / f"gen{generation}")})
        metrics = train(hyp, run_opt, device)
        history.append((fitness_of(metrics), hyp))
        if dist.is_main_process():
            _write_evolution(evolve_dir, history, metrics)
    LOGGER.info(f"Hyperparameter evolution finished: {len(history)} runs; best hyps in {evolve_dir}/hyp_evolve.yaml")
    return max(history, key=lambda h: h[0])[1]


def _write_evolution(evolve_dir: Path, history: list[tuple[float, dict]], metrics: dict[str, float]) -> None:
    """Append the latest generation to evolve.csv and rewrite hyp_evolve.yaml with the fittest hyps."""
    fit, hyp = history[-1]
    csv_path = evolve_dir / "evolve.csv"
    keys = [k for k, v in hyp.items() if isinstance(v, (int, float))]
    header = "" if csv_path.exists() else ",".join(["fitness", *metrics, *keys]) + "\n"
    with open(csv_path, "a") as f:
        f.write(header + ",".join(f"{v:.5g}" for v in [fit, *metrics.values(), *(float(hyp[k]) for k in keys)]) + "\n")
    best_fit, best = max(history, key=lambda h: h[0])
    text = f"# Hyperparameter evolution: best fitness {best_fit:.5g} of {len(history)} runs\n"
    (evolve_dir / "hyp_evolve.yaml").write_text(text + yaml.safe_dump(to_plain(best), sort_keys=False))


if __name__ == "__main__":
    sys.exit(run_main(main, parse_opt(), "train"))
