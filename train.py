"""Train a YOLO detector on one process, or on many with torch.distributed.

    python train.py                                                   # synthetic data, CPU or one GPU
    python train.py --data coco128.yaml --cfg yolov5s --img 640 --batch-size 16
    torchrun --nproc_per_node 2 train.py --batch-size 64 --device 0,1   # batch is the total over ranks
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT train.py ...

The story: options -> the run folder and hyperparameters -> set-up (data, model, optimizer, DDP, hooks) ->
the epoch loop (train, validate, log, checkpoint, stop early) -> teardown. The loops themselves live in
utils/training/engine.py, checkpoints and resume in utils/training/resume.py; hooks (utils/hooks.py) plug into the loop.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import yaml

import utils.distributed.comm as dist
from models.yolo import Model
from utils.cli import DISTRIBUTED, add_flags, distributed_session, project_dir, run_main, square_size
from utils.data.config import load_data_config
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader, image_weights, set_epoch, set_start, set_weights
from utils.distributed.signals import GracefulStop, StopRequested, signal_name
from utils.errors import UserError
from utils.evaluation.evaluate import EvalOptions, evaluate
from utils.hooks import HookBase, Hooks, load_hook
from utils.hyp import default_hyp_file, load_hyp
from utils.log import LOGGER, colorstr, print_options
from utils.loggers.registry import LoggerContext, add_logger_flags, build_loggers
from utils.loggers.writers import TrainBatchPlots, TrainWriters, progress_header
from utils.plots.figures import plot_labels, plot_results
from utils.training.amp import decide_amp
from utils.training.autoanchor import check_anchors
from utils.training.engine import NonFiniteGuard, Trainer, train_one_epoch
from utils.training.evolve import evolve
from utils.training.fingerprint import fingerprint
from utils.training.fitness import EarlyStopping, fitness
from utils.training.loss import ComputeLoss
from utils.training.optim import (
    OPTIMIZERS,
    LRSchedule,
    ModelEMA,
    WeightUpdater,
    accumulate_steps,
    build_optimizer,
    describe_groups,
    freeze_layers,
    scaled_weight_decay,
    unwrap,
)
from utils.training.resume import (
    Checkpointer,
    SaveInterval,
    plan_run,
    reload_last_good,
    restore_training_state,
    resume_options,
    shared_checkpoint,
)
from utils.training.train_state import restore_rng_state
from utils.weights.checkpoint import to_plain

DEFAULT_CFG = "yolov5n"
AMP_MODES = ("auto", "on", "off")


class TrainError(UserError, ValueError):
    """A training option that cannot work (batch size vs world size, image size, hyp file)."""


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """Training options (the reference's flags plus the DDP ones); ``argv=None`` reads sys.argv."""
    p = argparse.ArgumentParser(prog="train.py", description="Train a YOLO detector (DDP-ready).")
    add_flags(p, "weights", "trust_weights")
    p.add_argument("--cfg", default="", help=f"model YAML (path or name in models/); '' = the model of --weights, "
                   f"else {DEFAULT_CFG}")
    add_flags(p, "data")
    p.add_argument("--hyp", default="", help="hyperparameter YAML (path or name in data/hyps); '' = "
                   "hyp.synthetic.yaml for the built-in synthetic set, else hyp.scratch.yaml")
    p.add_argument("--epochs", type=int, default=18, help="epochs to train")
    add_flags(p, "batch_size", "img_size", batch_size=16, img_size=[128])
    p.add_argument("--rect", action="store_true", help="rectangular training batches")
    p.add_argument("--image-weights", action="store_true",
                   help="sample images by class-balancing weights (rare classes and low-mAP classes more often)")
    p.add_argument("--quad", action="store_true", help="quad batches: every 4 images become one of twice the size")
    p.add_argument("--noplots", action="store_true", help="write no plots (labels, batches, results, curves)")
    p.add_argument("--resume", nargs="?", const=True, default=False, help="resume the latest run, or the given last.pt")
    p.add_argument("--nosave", action="store_true", help="only save the final checkpoint")
    p.add_argument("--noval", action="store_true", help="only validate the final epoch")
    p.add_argument("--noautoanchor", action="store_true", help="keep the model's anchors")
    p.add_argument("--cache", nargs="?", const="ram", default=None, choices=["ram", "disk"],
                   help="cache images in 'ram' or on 'disk' (bare flag = ram)")
    add_flags(p, "device")
    p.add_argument("--amp", choices=AMP_MODES, default="auto",
                   help="mixed precision (float16 on CUDA, bfloat16 on the CPU) where its output matches float32's: "
                   "auto = only where it is faster (CUDA, CPUs with AMX)")
    p.add_argument("--channels-last", action="store_true",
                   help="train in channels_last (NHWC) memory format, which oneDNN's CPU convolutions prefer")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (also under DDP): faster steps after minutes of compiling")
    p.add_argument("--multi-scale", action="store_true", help="vary the image size by +/- 50%% per step")
    add_flags(p, "single_cls")
    p.add_argument("--optimizer", choices=["", *OPTIMIZERS], default="",
                   help="'' = the hyp file's 'optimizer' entry, else SGD")
    p.add_argument("--sync-bn", action="store_true", help="synchronised BatchNorm across ranks (DDP)")
    add_flags(p, "workers", "project", "name", "exist_ok")
    p.add_argument("--cos-lr", action="store_true", help="cosine LR schedule")
    p.add_argument("--label-smoothing", type=float, default=0.0, help="label smoothing epsilon for the class targets")
    p.add_argument("--patience", type=int, default=100, help="epochs without improvement before stopping")
    p.add_argument("--freeze", nargs="+", type=int, default=[0], help="freeze the first N layers, or layers i j k")
    p.add_argument("--save-period", type=int, default=-1, help="also save epoch{N}.pt every N epochs")
    p.add_argument("--save-interval-steps", type=int, default=0, help="also save last.pt every N batches (mid-epoch)")
    p.add_argument("--save-interval-minutes", type=float, default=0.0, help="also save last.pt every M minutes")
    p.add_argument("--seed", type=int, default=0, help="global seed (model init, data order, augmentation)")
    p.add_argument("--evolve", type=int, nargs="?", const=300, default=0,
                   help="evolve hyperparameters over N runs (bare flag = 300)")
    p.add_argument("--hook", action="append", default=[], metavar="MODULE:FACTORY(...)",
                   help="add a training hook built by a factory in an importable module (repeatable)")
    add_logger_flags(p)
    add_flags(p, *DISTRIBUTED)
    opt = square_size(p, p.parse_args(argv))
    opt.project = project_dir(opt, "train")
    return opt


def main(opt: argparse.Namespace, hooks: Sequence[HookBase] = ()) -> None:
    """Join the process group, train (or evolve), and always tear the group down outside train().
    ``hooks`` are added to those of ``--hook`` (for callers in Python)."""
    with distributed_session(opt) as device:
        opt, hyp = prepare_run(opt)
        print_options("train", opt)
        user_hooks = [*(load_hook(spec) for spec in opt.hook), *hooks]
        if opt.evolve:
            evolve(hyp, opt, device, lambda h, o, d: train(h, o, d, user_hooks))
        else:
            train(hyp, opt, device, user_hooks)


def prepare_run(opt: argparse.Namespace) -> tuple[argparse.Namespace, dict]:
    """Run folder and checkpoint to resume (decided once on rank 0), then the hyps and optimizer. A resumed run
    (--resume, an elastic restart, a requeued Slurm job) takes the checkpoint's options and hyps, except the
    runtime flags given on the command line. All ranks must call it."""
    hyp = None
    if not opt.evolve:
        plan = plan_run(opt)
        if plan.resume_from:
            opt, hyp = resumed_options(opt, plan.resume_from, plan.reason)
        opt.save_dir = str(plan.save_dir)
    dist.batch_per_rank(opt.batch_size)
    opt.hyp = opt.hyp or str(default_hyp_file(opt.data))
    hyp = load_hyp(hyp or opt.hyp)
    opt.optimizer = opt.optimizer or str(hyp.get("optimizer", "SGD"))
    if opt.optimizer not in OPTIMIZERS:
        raise TrainError(f"optimizer {opt.optimizer!r} (from {opt.hyp}) is not one of {', '.join(OPTIMIZERS)}")
    return opt, hyp


def resumed_options(opt: argparse.Namespace, resume_from: Path, reason: str) -> tuple[argparse.Namespace, dict]:
    """The options and hyps of the checkpoint to resume (last.pt, else best.pt when last.pt is damaged; read by
    rank 0); runtime flags (device, workers, save intervals, ...) come from the command line when given there."""
    path, ckpt = shared_checkpoint([resume_from, resume_from.with_name("best.pt")], trusted=opt.trust_weights)
    opt = resume_options(opt, ckpt.get("opt") or {}, defaults=vars(parse_opt([])))
    opt.weights = opt.resume = str(path)
    LOGGER.info(f"Resuming ({reason}) from {path}")
    return opt, ckpt.get("hyp") or {}


def train(hyp: dict, opt: argparse.Namespace, device: torch.device,
          hooks: Sequence[HookBase] = ()) -> dict[str, float]:
    """Train for ``opt.epochs`` (all ranks); returns the final metrics (same on every rank)."""
    trainer = setup(hyp, opt, device, hooks)
    try:
        with trainer.stop:  # SIGTERM/SIGINT/SIGUSR1: save last.pt at the next step every rank agrees on
            return fit(trainer)
    except RuntimeError as e:  # a data-loader worker killed anyway (before it could ignore the signal)
        if trainer.stop.requested and "DataLoader worker" in str(e):
            raise StopRequested(trainer.stop.signum, f"stopped by {signal_name(trainer.stop.signum)}: a data-loader "
                                f"worker ended before the step could be saved; {saved_text(trainer)}") from None
        raise
    finally:
        cancelled = trainer.stop.requested or sys.exc_info()[0] is not None
        trainer.writers.close(cancel=trainer.stop.requested)  # a stopped run does not wait for queued plots
        trainer.hooks.close(trainer, cancelled)


def saved_text(t: Trainer) -> str:
    """What --resume will continue from, for the messages of a run stopped outside the steps."""
    if t.saved_position is None:
        return "no last.pt was written yet, so the run starts again"
    epoch, samples = t.saved_position
    where = f"the start of epoch {epoch}" if not samples else f"epoch {epoch}, batch {samples // t.opt.batch_size}"
    return f"last.pt holds {where}; continue with --resume"


def setup(hyp: dict, opt: argparse.Namespace, device: torch.device, hooks: Sequence[HookBase] = ()) -> Trainer:
    """Run folder, data, model, optimizer, EMA, DDP wrapper and hooks; every rank builds the same model."""
    dist.batch_per_rank(opt.batch_size)
    if opt.sync_bn and dist.get_world_size() > 1 and device.type != "cuda":
        raise TrainError("--sync-bn needs CUDA (torch's SyncBatchNorm does not run on CPU); drop it for CPU/gloo runs")
    seed_everything(opt.seed)  # the same on every rank: identical initial weights
    data_cfg = load_data_config(opt.data)
    nc, names = (1, ["item"]) if opt.single_cls else (data_cfg.nc, list(data_cfg.names))
    model, ckpt = build_model(opt, nc, names, device)
    grid = max(int(model.stride.max()), 32)
    if opt.img_size % grid:
        rounded = -(-opt.img_size // grid) * grid
        LOGGER.warning(f"WARNING: --img-size {opt.img_size} must be a multiple of the model's largest stride {grid}, "
                       f"using {rounded}")
        opt.img_size = rounded
    save_dir = write_run_files(opt, hyp)
    train_loader, train_set, val_loader = build_data(opt, hyp, data_cfg, grid, nc)
    if not opt.noautoanchor and not opt.resume:
        check_anchors(train_set, model, thr=hyp["anchor_t"], img_size=opt.img_size)  # rank 0 decides, broadcast
    dist.check_agreement(fingerprint(model, opt, hyp, train_set))
    amp = decide_amp(model, device, opt.amp)
    ema = ModelEMA(model)
    updater = build_updater(model, opt, hyp, len(train_loader), ema, scaler=amp and device.type == "cuda")
    model = updater.model = dist.wrap_ddp(model, device, opt.sync_bn)
    model = compile_model(model, opt)  # the forward only: the updater keeps the DDP module for no_sync and its grads
    main_process = dist.is_main_process()
    writers = TrainWriters(save_dir, enabled=main_process)
    plots = main_process and not opt.noplots
    if plots:
        writers.background.submit(plot_labels, train_set.labels, names, save_dir)
    interval = SaveInterval(opt.save_interval_steps, opt.save_interval_minutes)
    builtin = [Checkpointer(enabled=main_process, interval=interval),
               *([TrainBatchPlots(writers.background, save_dir, names)] if plots else [])]
    trackers = [n for n in (opt.loggers or []) if n not in ("csv", "tensorboard")]  # TEMPORARY wiring (trackers)
    builtin += build_loggers(trackers, LoggerContext(save_dir, vars(opt), main_process)) if trackers else []
    trainer = Trainer(opt=opt, hyp=hyp, device=device, save_dir=save_dir, model=model, updater=updater, ema=ema,
                      compute_loss=ComputeLoss(unwrap(model), hyp, opt.img_size, opt.label_smoothing),
                      train_loader=train_loader, val_loader=val_loader, names=names, writers=writers,
                      hooks=Hooks([*builtin, *hooks]), amp=amp, stopper=EarlyStopping(opt.patience),
                      stop=GracefulStop(), save_interval=interval, grid=grid, is_coco=bool(data_cfg.is_coco),
                      plots=plots, maps=np.zeros(nc))
    trainer.guard = NonFiniteGuard(lambda in_a_row: reload_last_good(trainer, in_a_row))
    if opt.resume and ckpt is not None:
        restore_training_state(trainer, ckpt)
    return trainer


def write_run_files(opt: argparse.Namespace, hyp: dict) -> Path:
    """The run folder (chosen by plan_run, or given by --evolve) with opt.yaml and hyp.yaml, written by rank 0."""
    save_dir = Path(opt.save_dir)
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
    """A model from --cfg (or the checkpoint's YAML), with the matching tensors of --weights transferred
    (rank 0 reads the file and shares it). All ranks must call it."""
    ckpt = shared_checkpoint([opt.weights], trusted=opt.trust_weights)[1] if opt.weights else None
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
    return model.to(device, memory_format=torch.channels_last if opt.channels_last else torch.preserve_format), ckpt


def build_data(opt: argparse.Namespace, hyp: dict, data_cfg: Any, grid: int, nc: int) -> tuple[Any, Any, Any]:
    """Train loader (distributed sampler, augmented) and the sharded val loader; batch is per rank."""
    batch = dist.batch_per_rank(opt.batch_size)
    common = DatasetOptions(img_size=opt.img_size, batch_size=batch, stride=grid, hyp=hyp, cache=opt.cache,
                            seed=opt.seed, single_cls=opt.single_cls, nc=nc)
    train_options = DatasetOptions(**{**vars(common), "augment": True, "rect": opt.rect, "prefix": colorstr("train: ")})
    train_loader, train_set = create_dataloader(data_cfg.train, train_options, workers=opt.workers,
                                                shuffle=not opt.rect, quad=opt.quad)
    val_options = DatasetOptions(**{**vars(common), "batch_size": batch * 2, "rect": True, "pad": 0.5,
                                    "prefix": colorstr("val: ")})
    val_loader, _ = create_dataloader(data_cfg.val, val_options, workers=opt.workers, shard_eval=True)
    LOGGER.info(f"Using {train_loader.num_workers} dataloader workers and batch {batch} per rank, "
                f"{dist.get_world_size()} ranks")
    return train_loader, train_set, val_loader


def build_updater(model: Model, opt: argparse.Namespace, hyp: dict, batches_per_epoch: int, ema: ModelEMA,
                  scaler: bool) -> WeightUpdater:
    """Optimizer with decay scaled to the nominal batch, LR schedule with warmup, EMA, and the gradient scaler
    with ``scaler`` (float16 needs it; bfloat16 has float32's range)."""
    accumulate = accumulate_steps(opt.batch_size)
    decay = scaled_weight_decay(hyp["weight_decay"], opt.batch_size, accumulate)
    optimizer = build_optimizer(model, opt.optimizer, hyp["lr0"], hyp["momentum"], decay)
    LOGGER.info(f"{colorstr('optimizer:')} {describe_groups(optimizer)}; accumulate {accumulate} batches, "
                f"weight_decay {decay:g}")
    schedule = LRSchedule(hyp, opt.epochs, batches_per_epoch, cosine=opt.cos_lr, accumulate=accumulate)
    return WeightUpdater(model, optimizer, schedule, ema=ema, amp=scaler)


def compile_model(model: nn.Module, opt: argparse.Namespace) -> nn.Module:
    """``model`` (DDP-wrapped under DDP) under torch.compile with --compile, as is otherwise."""
    if not opt.compile:
        return model
    LOGGER.info("torch.compile: the first steps compile the model (minutes on a CPU), the steps after are faster")
    return torch.compile(model)


def fit(t: Trainer) -> dict[str, float]:
    """The epoch loop: train, validate (every rank, sharded), log, checkpoint, stop early. All ranks call it."""
    opt, start, t0 = t.opt, t.start_epoch, time.time()
    LOGGER.info(f"Image sizes {opt.img_size} train, {opt.img_size} val\nLogging results to {t.save_dir}\n"
                f"Starting training for {opt.epochs} epochs...")
    metrics, epoch = dict.fromkeys(("precision", "recall", "mAP_0.5", "mAP_0.5:0.95"), 0.0), start - 1
    t.hooks.before_train(t)
    for epoch in range(start, opt.epochs):
        final = epoch == opt.epochs - 1
        sizes = begin_epoch(t, epoch)
        LOGGER.info(progress_header())
        mean_loss = train_one_epoch(t, epoch, sizes)
        losses = dist.all_reduce_mean(mean_loss.detach().clone()).tolist()
        with t.stop.immediate(f"while validating epoch {epoch}; {saved_text(t)}"):
            if not opt.noval or final:
                metrics = validate(t, final)
        fitness_value = fitness(list(metrics.values()))
        t.best_fitness = max(t.best_fitness, fitness_value)
        t.writers.epoch_end(epoch, losses, list(metrics.values()), t.updater.lrs())
        t.updater.share_pending_grads(dist.all_reduce_mean)  # a checkpoint holds what every rank accumulated
        with t.stop.immediate(f"while saving the checkpoints of epoch {epoch}; every file is whole (old or new), "
                              f"continue with --resume"):
            row = dict(zip(t.writers.csv.columns[1:], [*losses, *metrics.values(), *t.updater.lrs()]))
            t.hooks.after_epoch(t, epoch, row)  # the Checkpointer first: last.pt, best.pt
        t.guard.end_epoch(epoch)
        if t.stop.agreed:  # a stop voted during the epoch, still waiting for a point to save: last.pt just was
            t.stop.raise_stop(epoch + 1, 0)
        if dist.main_decides(lambda e=epoch, f=fitness_value: t.stopper(e, f)):  # every rank leaves together
            break
    LOGGER.info(f"\n{epoch - start + 1} epochs completed in {(time.time() - t0) / 3600:.3f} hours.")
    t.hooks.after_train(t)
    if t.plots:
        t.writers.background.submit(plot_results, t.save_dir / "results.csv")
    LOGGER.info(f"Results saved to {colorstr('bold', str(t.save_dir))}")
    return metrics


def step_sizes(t: Trainer, epoch: int) -> list[int] | None:
    """With --multi-scale, the image size of every step of this epoch: drawn on rank 0, broadcast once."""
    if not t.opt.multi_scale:
        return None

    def draw() -> list[int]:
        rng = random.Random(t.opt.seed * 1000 + epoch)
        low, high = int(t.opt.img_size * 0.5), int(t.opt.img_size * 1.5) + t.grid
        return [max(rng.randrange(low, high) // t.grid * t.grid, t.grid) for _ in range(len(t.train_loader))]

    return dist.main_decides(draw)


def begin_epoch(t: Trainer, epoch: int) -> list[int] | None:
    """Select the epoch's sample order; in the first epoch of a mid-epoch resume, skip the batches already done
    and restore the RNG states saved with them. Returns the multi-scale sizes of the batches that remain (None
    without --multi-scale). All ranks must call it."""
    set_epoch(t.train_loader, epoch)
    if t.opt.image_weights:  # the same weights on every rank (from the labels and the gathered mAPs)
        set_weights(t.train_loader, image_weights(t.train_loader.dataset.labels, len(t.names), t.maps))
    sizes = step_sizes(t, epoch)  # drawn for the whole epoch, so a resumed epoch gets the same sizes
    t.batch_offset = t.start_samples // t.opt.batch_size
    t.hooks.before_epoch(t, epoch)
    if t.start_samples:
        set_start(t.train_loader, t.start_samples)
        t.start_samples = 0
    if t.rng_state is not None:  # the last thing before the first resumed batch
        restore_rng_state(t.rng_state)
        t.rng_state = None
    return sizes[t.batch_offset:] if sizes is not None else None


def validate(t: Trainer, final: bool) -> dict[str, float]:
    """Distributed validation of the EMA model on every rank's shard; the same numbers on every rank."""
    options = EvalOptions(single_cls=t.opt.single_cls, half=t.amp, save_dir=t.save_dir, plots=final and t.plots,
                          is_coco=t.is_coco and final)
    result = evaluate(t.ema.ema, t.val_loader, t.device, t.names, options)
    t.maps = result.maps  # per-class mAP, for --image-weights
    return {"precision": float(result.mp), "recall": float(result.mr), "mAP_0.5": float(result.map50),
            "mAP_0.5:0.95": float(result.map)}


if __name__ == "__main__":
    sys.exit(run_main(main, parse_opt(), "train"))
