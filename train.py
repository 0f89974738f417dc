"""Train a YOLO detector on one process, or on many with torch.distributed.

    python train.py                                                   # synthetic data, CPU or one GPU
    python train.py --data coco128.yaml --cfg yolov5s --img 640 --batch-size 16
    python train.py --batch-size 64 --device 0,1                        # 2 processes, one per GPU (torch's launcher)
    torchrun --nproc_per_node 2 train.py --batch-size 64 --device 0,1   # the same with torchrun; batch is the total
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT train.py ...

The story: options -> the run configuration (utils/training/config.py) -> the run folder, the checkpoint to resume
and the hyperparameters -> the trainer (utils/training/builder.py: data, model, optimizer, DDP, hooks, loggers) ->
its epoch loop (utils/training/loop.py: train, validate, log, checkpoint, stop early) -> teardown.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import utils.distributed.openmp  # noqa: F401  first: it sets OpenMP's wait before torch loads

# isort: split
import torch

from utils import api
from utils.cli import DISTRIBUTED, Parser, add_flags, distributed_session, peer_lost, project_dir, square_size
from utils.distributed import ray_train
from utils.distributed.elastic import elastic_store_warning
from utils.distributed.signals import StopRequested, signal_name
from utils.hooks import HookBase, load_hook
from utils.log import LOGGER, print_options
from utils.loggers.registry import add_logger_flags
from utils.training.builder import COLOUR_PLACES, DEFAULT_CFG, build_trainer, prepare_run
from utils.training.config import RunConfig
from utils.training.evolve import evolve
from utils.training.fitness import fitness
from utils.training.loop import Trainer
from utils.training.optim import AUTO, OPTIMIZERS
from utils.training.resume import RunFinished
from utils.training.run_plan import forget_run_dir

AMP_MODES = ("auto", "on", "off")


def _add_speed_flags(p: argparse.ArgumentParser) -> None:
    """How training runs fast: precision, memory layout, where the colour change runs, compiling, multi-scale."""
    p.add_argument("--amp", choices=AMP_MODES, default="auto",
                   help="mixed precision (float16 on CUDA, bfloat16 on the CPU) where its output matches float32's: "
                   "auto = only where it is faster (CUDA, CPUs with AMX)")
    p.add_argument("--channels-last", action="store_true",
                   help="train in channels_last (NHWC) memory format on CUDA too (the CPU always trains channels_last)")
    p.add_argument("--colour-on", choices=COLOUR_PLACES, default="auto",
                   help="where training images get their random HSV colour change: auto = on the GPU when training "
                   "on CUDA (the loader's CPU cores do less), else in the loader")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (also under DDP): faster steps after minutes of compiling")
    p.add_argument("--multi-scale", action="store_true", help="vary the image size by +/- 50%% per step")


def build_parser() -> argparse.ArgumentParser:
    """train.py's parser: the reference's flags plus the DDP ones."""
    p = Parser(prog="train.py", description="Train a YOLO detector (DDP-ready).")
    add_flags(p, "weights", "trust_weights")
    p.add_argument("--cfg", default="", help=f"model YAML (path or name in models/); '' = the model of --weights, "
                   f"else {DEFAULT_CFG}")
    add_flags(p, "data")
    p.add_argument("--hyp", default="", help="hyperparameter YAML (path or name in data/hyps); '' = the model "
                   "family's: YOLOv5 hyp.synthetic.yaml for the built-in synthetic set, else hyp.scratch.yaml; "
                   "anchor-free families hyp.anchor-free.yaml")
    p.add_argument("--hyp-set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="set hyperparameters over the hyp file's: --hyp-set lr0=0.002 fliplr=0 (ultralytics' "
                   "lr0=0.002 fliplr=0 words mean this)")
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
    _add_speed_flags(p)
    add_flags(p, "single_cls")
    p.add_argument("--fraction", type=float, default=1.0,
                   help="train on this share of the training images (the first of them in file order; a "
                        "classifier's: the first of each class's), 0 < F <= 1")
    p.add_argument("--optimizer", choices=[AUTO, *OPTIMIZERS], default=AUTO,
                   help="auto = the hyp file's 'optimizer' entry, else AdamW with lr0 from the class count for "
                   "short runs and SGD for long ones (docs/training-recipe.md)")
    p.add_argument("--adam", dest="optimizer", action="store_const", const="Adam",
                   help=argparse.SUPPRESS)  # YOLOv5 up to v6.1: --adam is --optimizer Adam
    p.add_argument("--sync-bn", action="store_true", help="synchronised BatchNorm across ranks (DDP)")
    add_flags(p, "workers", "project", "name", "exist_ok")
    p.add_argument("--cos-lr", action="store_true", help="cosine LR schedule")
    p.add_argument("--linear-lr", dest="cos_lr", action="store_false",
                   help=argparse.SUPPRESS)  # YOLOv5 v5-v6.0: --linear-lr, the linear schedule (our default)
    p.add_argument("--batch-scaling", action="store_true",
                   help="above a total batch of 64, the large-batch rule for lr0, warmup and EMA (docs/cluster.md)")
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
    return p


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """Training options; ``argv=None`` reads sys.argv."""
    p = build_parser()
    opt = square_size(p, p.parse_args(argv))
    if not 0 < opt.fraction <= 1:
        p.error(f"--fraction {opt.fraction}: give the share of the training images, 0 < F <= 1")
    opt.project = project_dir(opt, "train")
    return opt


@dataclass
class TrainResult:
    """What a training run returns: the last validation's metrics (precision, recall, mAP_0.5, mAP_0.5:0.95; the
    same on every rank), the run folder and the hyperparameters it trained with (after --optimizer auto's rule).
    With --evolve: the fittest generation's."""

    metrics: dict[str, float]
    save_dir: Path
    hyp: dict


def main(opt: argparse.Namespace, hooks: Sequence[HookBase] = ()) -> TrainResult:
    """Join the process group, train (or evolve), and always tear the group down outside train().
    ``hooks`` are added to those of ``--hook`` (for callers in Python)."""
    with distributed_session(opt) as device:
        if (elastic_line := elastic_store_warning()) is not None:  # rank 0 talks
            LOGGER.warning(elastic_line)
        user_hooks = [*(load_hook(spec) for spec in opt.hook), *hooks]  # before the run folder: a bad one leaves none
        defaults = RunConfig.from_options(parse_opt([]))
        try:
            config, hyp = prepare_run(RunConfig.from_options(opt), defaults=defaults)
        except RunFinished as done:  # --resume of a run with no epoch left: say so, train nothing
            LOGGER.info(done.message)
            return TrainResult(done.metrics, done.save_dir, done.hyp)
        print_options("train", config.options(), defaults.options())
        if not config.evolve:
            return train(hyp, config, device, user_hooks)
        generations: list[TrainResult] = []

        def generation(h: dict, c: RunConfig, d: torch.device) -> tuple[dict[str, float], dict]:
            generations.append(train(h, c, d, user_hooks))
            return generations[-1].metrics, generations[-1].hyp

        evolve(hyp, config, device, generation)
        return max(generations, key=lambda r: fitness(r.metrics))


def run(*, nproc_per_node: int | None = None, ray_workers: int = 0, ray_address: str = "", ray_storage: str = "",
        ray_max_failures: int = 0, hooks: Sequence[HookBase] = (), **options: Any) -> TrainResult:
    """train.py from Python: ``train.run(data="coco128.yaml", epochs=3, img_size=640)`` takes the command line's
    option names (utils/api.py) and returns rank 0's TrainResult. As on the command line, ``nproc_per_node=N``
    (N > 1) or several GPUs in ``device`` ("0,1") start one process per GPU (or N on the CPU) on this machine with
    torch's elastic launcher, as ``torchrun --standalone --nproc_per_node N train.py`` does; ``hooks`` then reach
    every process as pickled copies. ``ray_workers=N`` trains on N workers of Ray Train's TorchTrainer instead
    (``ray_train_loop``; docs/ray.md): on the cluster at ``ray_address`` ('' = a local one, started and stopped
    here), checkpoints in ``ray_storage``, the worker group restarted up to ``ray_max_failures`` times. Errors are
    the UserErrors the command line prints."""
    if ray_workers:
        if nproc_per_node not in (None, 1):
            raise api.OptionError("train.run(): give nproc_per_node or ray_workers, not both (Ray starts processes)")
        opt = api.parse(parse_opt, api.to_argv(build_parser(), options, "train"), "train")
        value = api.ray_launch(ray_train_loop, options, hooks, opt.device, opt.backend, opt.ddp_timeout,
                               ray_workers, ray_address, ray_storage, ray_max_failures)
        return TrainResult(dict(value["metrics"]), Path(value["save_dir"]), dict(value["hyp"]))
    argv = api.to_argv(build_parser(), {**options, "nproc_per_node": nproc_per_node}, "train")
    opt = api.parse(parse_opt, argv, "train")
    processes = api.processes(opt)
    if processes == 1:
        return main(opt, hooks)
    return api.launch(_launched, processes, argv, tuple(hooks))


def ray_train_loop(config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``, for a TorchTrainer you build yourself:
    ``TorchTrainer(train.ray_train_loop, train_loop_config={"data": "coco128.yaml", "epochs": 3}, ...)``. ``config``
    holds train.run()'s options (and ``hooks``: HookBase objects). The process group is Ray's; every checkpoint and
    every epoch's results.csv row is reported to Ray; a worker group Ray restarted resumes from Ray's latest
    checkpoint by itself. The last report carries rank 0's result (utils/distributed/ray_train.py)."""
    options = dict(config)
    hooks = tuple(options.pop("hooks", ()))
    save_dir: list[Path] = []

    def work() -> dict[str, Any]:
        opt = api.parse(parse_opt, api.to_argv(build_parser(), options, "train"), "train")
        opt.device = ray_train.worker_device()
        opt.resume = ray_train.restore_run(opt.project) or opt.resume  # a restarted group: Ray's last checkpoint
        result = main(opt, (*hooks, ray_train.RayReport()))
        save_dir.append(result.save_dir)
        return {"metrics": result.metrics, "save_dir": str(result.save_dir), "hyp": result.hyp}

    outcome = api.outcome(work)
    ray_train.report_outcome(outcome.value, outcome.error, save_dir[0] if save_dir else None)


def _launched(argv: list[str], hooks: tuple[HookBase, ...]) -> api.RankOutcome:
    """One process of ``run(nproc_per_node=N)``."""
    return api.outcome(lambda: main(parse_opt(argv), hooks))


def train(hyp: dict, config: RunConfig, device: torch.device, hooks: Sequence[HookBase] = ()) -> TrainResult:
    """Build the run and train it for ``config.epochs`` (all ranks); returns the final metrics (same on every rank)
    and the hyperparameters the run trained with (``hyp`` after --optimizer auto's rule, as hyp.yaml records)."""
    trainer = build_trainer(config, hyp, device, hooks)
    try:
        with trainer.stop:  # SIGTERM/SIGINT/SIGUSR1: save last.pt at the next step every rank agrees on
            result = TrainResult(trainer.fit(), Path(config.save_dir), dict(trainer.hyp))
        forget_run_dir(config)  # finished: a later torchrun job with the same --rdzv-id starts a new run
        return result
    except RuntimeError as e:  # a data-loader worker killed anyway (before it could ignore the signal)
        if trainer.stop.requested and "DataLoader worker" in str(e):
            raise StopRequested(trainer.stop.signum, f"stopped by {signal_name(trainer.stop.signum)}: a data-loader "
                                f"worker ended before the step could be saved; {trainer.saved_text()}") from None
        if (lost := peer_lost(e)) is not None:  # a peer is gone: say so before the teardown below
            raise lost from None
        raise
    finally:
        teardown(trainer, cancelled=trainer.stop.requested or sys.exc_info()[0] is not None)


def teardown(trainer: Trainer, cancelled: bool) -> None:
    """Finish the background plots (a stopped run does not wait for queued ones) and close every hook."""
    try:
        trainer.background.close(cancel=trainer.stop.requested)
    finally:
        trainer.hooks.close(trainer.view, cancelled)


if __name__ == "__main__":
    sys.exit(api.command_line(__file__, parse_opt, main))
