"""One way to build a training run: ``prepare_run`` (run folder, checkpoint to resume, the model's family and its
hyperparameters) and ``build_trainer`` (data, model, the family's loss, optimizer, EMA, DDP wrapper, hooks, the
resumed state), used alike by train.py, the benchmarks and the tests. The model's head names its family
(utils/training/families.py), which brings the loss, the default hyperparameters and the keys they must hold;
anchors (autoanchor) exist only for anchor-based heads.

Nothing is written into the run folder (opt.yaml, hyp.yaml, results.csv, events, plots) before the checkpoint a
run resumes is read and restored: a resume that cannot work leaves the folder as it was.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import yaml

from models.yolo import Model
from utils.data.config import DEFAULT_DATA, DataError, load_data_config
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader
from utils.distributed import comm as dist
from utils.distributed.signals import GracefulStop
from utils.errors import UserError
from utils.hooks import HookBase, Hooks
from utils.hyp import load_hyp, override_hyp
from utils.log import LOGGER, colorstr
from utils.loggers.background import BackgroundTasks
from utils.loggers.batch_plots import TrainBatchPlots
from utils.loggers.registry import LoggerContext, build_loggers
from utils.plots.figures import plot_labels
from utils.tasks.registry import BASE_TASK, get_task
from utils.training.amp import decide_amp
from utils.training.autoanchor import check_anchors
from utils.training.autobatch import AUTO_BATCH, auto_batch
from utils.training.checkpointer import Checkpointer, SaveInterval
from utils.training.config import RunConfig
from utils.training.early_stop import EarlyStopping
from utils.training.engine import NonFiniteReload, align_to_gradients, train_memory_format
from utils.training.families import Family, get_family
from utils.training.fingerprint import fingerprint
from utils.training.loop import Trainer
from utils.training.optim import (
    AUTO,
    OPTIMIZERS,
    LRSchedule,
    ModelEMA,
    OptimizerChoice,
    WeightUpdater,
    accumulate_steps,
    batch_scaling,
    build_optimizer,
    choose_optimizer,
    describe_groups,
    freeze_layers,
    scaled_weight_decay,
    unwrap,
)
from utils.training.resume import check_unfinished, resume_options, shared_checkpoint, shared_resumable
from utils.training.run_plan import discarded_if_start_fails, plan_run
from utils.training.train_state import TrainPosition, TrainState
from utils.weights.checkpoint import recorded_family, to_plain

DEFAULT_CFG = "yolov5n"


class TrainError(UserError, ValueError):
    """A training option that cannot work (batch size vs world size, image size, hyp file, optimizer)."""


@dataclass
class TrainData:
    """What a run trains and validates on: the loaders (batch per rank), the training set (labels for AutoAnchor,
    --image-weights and the start-up agreement; None for fixed batches), the class names."""

    train_loader: Any
    val_loader: Any
    dataset: Any
    names: list[str]
    is_coco: bool = False


def prepare_run(config: RunConfig, defaults: RunConfig) -> tuple[RunConfig, dict]:
    """Run folder and checkpoint to resume (decided once on rank 0), then the model's family, its hyps and the
    optimizer. A resumed run (--resume, an elastic restart, a requeued Slurm job) takes the checkpoint's options
    and hyps, except the runtime flags given on the command line (``defaults``: the parser's, to tell them). All
    ranks must call it."""
    if config.evolve:
        return choose_hyp(config, None, None)
    plan = plan_run(config)
    with discarded_if_start_fails(config.replace(save_dir=str(plan.save_dir))):
        hyp, ckpt = None, None
        if plan.resume_from:
            path, ckpt = shared_resumable(plan.resume_from, trusted=config.trust_weights)
            config = resume_options(config, ckpt.get("opt") or {}, defaults).replace(weights=str(path),
                                                                                     resume=str(path))
            hyp = ckpt.get("hyp") or {}
            check_unfinished(ckpt, config, Path(plan.save_dir))
            LOGGER.info(f"Resuming ({plan.reason}) from {path}")
        return choose_hyp(config.replace(save_dir=str(plan.save_dir)), hyp, ckpt)


def choose_hyp(config: RunConfig, hyp: dict | None, ckpt: dict | None) -> tuple[RunConfig, dict]:
    """The model's family, its hyps (a resumed run's ``hyp``, else --hyp or the family's) and the optimizer; the
    built-in set of the model's task when no --data is given. All ranks must call it."""
    if config.batch_size != AUTO_BATCH:  # else measured when the model is built (build_trainer)
        dist.batch_per_rank(config.batch_size)
    family_name, task = model_kind(config, ckpt)
    family = get_family(family_name)
    built_in = DEFAULT_DATA.parent / get_task(task).default_data  # the built-in set with what the task needs
    if built_in != DEFAULT_DATA and Path(config.data or DEFAULT_DATA) == DEFAULT_DATA:
        config = config.replace(data=str(built_in))
        LOGGER.info(f"A {task} model without --data trains on {built_in.name}")
    config = config.replace(hyp=config.hyp or str(family.default_hyp_file(config.data)))
    hyp = override_hyp(load_hyp(hyp or config.hyp, family.required_hyp, family.name), config.hyp_set)
    config = config.replace(optimizer=config.optimizer if config.optimizer not in ("", AUTO) else
                            str(hyp.get("optimizer", AUTO)))
    if config.optimizer not in (AUTO, *OPTIMIZERS):
        raise TrainError(f"optimizer {config.optimizer!r} (from {config.hyp}) is not one of "
                         f"{', '.join((AUTO, *OPTIMIZERS))}")
    return config, hyp


def model_kind(config: RunConfig, ckpt: dict | None = None) -> tuple[str, str]:
    """(family, task) of the model a run trains, as its head names them: --cfg's, else the checkpoint's record (a
    checkpoint from before they were recorded: a YOLOv5 detector), else the default model's. All ranks must call
    it (rank 0 reads --weights and shares it)."""
    if not config.cfg and ckpt is None and config.weights:
        ckpt = shared_checkpoint([config.weights], trusted=config.trust_weights)[1]
    if not config.cfg and ckpt is not None:
        return recorded_family(ckpt)
    head = Model(config.cfg or DEFAULT_CFG).head
    return str(head.family), str(head.task)


def build_trainer(config: RunConfig, hyp: dict, device: torch.device, hooks: Sequence[HookBase] = (),
                  data: TrainData | None = None) -> Trainer:
    """The run (``data``: its batches, else loaded from --data): every rank builds the same model; a resumed run
    restores its state before the run folder is written. ``--batch-size -1``: AutoBatch (utils.training.autobatch)
    once the model is built. All ranks must call it."""
    with discarded_if_start_fails(config):  # a start that fails leaves no empty run folder
        return assemble_trainer(config, hyp, device, hooks, data)


def assemble_trainer(config: RunConfig, hyp: dict, device: torch.device, hooks: Sequence[HookBase],
                     data: TrainData | None) -> Trainer:
    """build_trainer's work: the parts, the resumed state restored, then the run files written."""
    if config.sync_bn and dist.get_world_size() > 1 and device.type != "cuda":
        raise TrainError("--sync-bn needs CUDA (torch's SyncBatchNorm does not run on CPU); drop it for CPU/gloo runs")
    seed_everything(config.seed)  # the same on every rank: identical initial weights
    data_cfg = load_data_config(config.data) if data is None else None
    names = data.names if data is not None else ["item"] if config.single_cls else list(data_cfg.names)
    data_options = data_cfg.task_options if data_cfg is not None else \
        getattr(getattr(data.dataset, "options", None), "task_options", None)
    model, ckpt = build_model(config, len(names), names, device, data_options)
    family = get_family(model.head.family)
    hyp = load_hyp(hyp, family.required_hyp, family.name)
    grid = max(int(model.stride.max()), 32)
    config = round_img_size(config, grid)
    if dist.get_world_size() > 1:  # DDP's gradient buckets take each parameter's strides
        align_to_gradients(model, device, grid * 2, config.channels_last)
    if config.batch_size == AUTO_BATCH:
        config = config.replace(batch_size=auto_batch(model, device, config.img_size))
    dist.batch_per_rank(config.batch_size)
    reserved = torch.get_num_threads() if device.type == "cpu" else 0  # the cores the CPU training threads need
    data = data or load_train_data(config, hyp, data_cfg, grid, len(data_cfg.names), reserved,
                                   task=model.head.task, recycle=device.type in ("cpu", "cuda"),  # labels checked
                                   colour_later=colour_in_step(config, device))
    if model.head.anchor_based and not config.noautoanchor and not config.resume and data.dataset is not None:
        check_anchors(data.dataset, model, thr=hyp["anchor_t"], img_size=config.img_size)  # rank 0 decides
    dist.check_agreement(fingerprint(model, config.options(), hyp, data.dataset))
    amp = decide_amp(model, device, config.amp)
    ema = ModelEMA(model)
    choice = choose_optimizer(config.optimizer, hyp, len(names), train_images(data, config.batch_size),
                              config.batch_size, config.epochs)
    updater = build_updater(model, config, choice, len(data.train_loader), ema, scaler=amp and device.type == "cuda")
    model = updater.model = dist.wrap_ddp(model, device, config.sync_bn)
    model = compile_model(model, config)  # the forward only: the updater keeps the DDP module for no_sync
    loss = family.loss_for(unwrap(model).head.task)(unwrap(model), {**hyp, "img_size": config.img_size,
                                                            "label_smoothing": config.label_smoothing})
    trainer = new_trainer(config, choice.hyp, device, model, updater, ema, family, loss, data, amp, grid)
    trainer.hooks = Hooks([NonFiniteReload(trainer.reload_last_good),
                           Checkpointer(trainer.save_checkpoint, trainer.save_interval),
                           *run_hooks(config, names, trainer.background, trainer.plots), *hooks])
    if config.resume and ckpt is not None:
        trainer.restore(ckpt)
    write_run_files(config, choice.hyp)  # only now: the resumed state is known good
    if trainer.plots and data.dataset is not None:
        trainer.background.submit(plot_labels, data.dataset.labels, names, trainer.save_dir)
    return trainer


def new_trainer(config: RunConfig, hyp: dict, device: torch.device, model: nn.Module, updater: WeightUpdater,
                ema: ModelEMA, family: Family, loss: Any, data: TrainData, amp: bool, grid: int) -> Trainer:
    """The Trainer of these parts, with the decisions taken once for this process (the main process shows the
    progress, plots and writes the checkpoints); its hooks are added by build_trainer."""
    main_process = dist.is_main_process()
    position = TrainPosition(batch_size=config.batch_size, world_size=dist.get_world_size(),
                             accumulate=updater.schedule.accumulate)
    return Trainer(config=config, hyp=hyp, device=device, save_dir=Path(config.save_dir), model=model,
                   updater=updater, ema=ema, family=family, compute_loss=loss, loss_names=tuple(loss.names),
                   loss=loss, train_loader=data.train_loader, val_loader=data.val_loader, names=data.names,
                   hooks=Hooks(), state=TrainState(position, maps=np.zeros(len(data.names))), amp=amp,
                   stopper=EarlyStopping(config.patience), stop=GracefulStop(elastic=bool(dist.torchrun_job_id())),
                   save_interval=SaveInterval(config.save_interval_steps, config.save_interval_minutes),
                   background=BackgroundTasks(main_process), grid=grid, is_coco=data.is_coco,
                   show_progress=main_process, plots=main_process and not config.noplots, saves=main_process)


def run_hooks(config: RunConfig, names: list[str], background: BackgroundTasks, plots: bool) -> list[HookBase]:
    """The loggers of --loggers (on the main process) and the training-batch plots."""
    save_dir, main_process = Path(config.save_dir), dist.is_main_process()
    loggers = build_loggers(config.loggers, LoggerContext(save_dir, config.options(), enabled=main_process))
    return [*loggers, *([TrainBatchPlots(background, save_dir, names)] if plots else [])]


def train_images(data: TrainData, batch_size: int) -> int:
    """How many images an epoch trains on (the batches' count times the batch for fixed batches given in code)."""
    return len(data.dataset) if data.dataset is not None else len(data.train_loader) * batch_size


def round_img_size(config: RunConfig, grid: int) -> RunConfig:
    """--img-size rounded up to a multiple of the model's largest stride (with a warning when it was not one)."""
    if config.img_size % grid == 0:
        return config
    rounded = -(-config.img_size // grid) * grid
    LOGGER.warning(f"WARNING: --img-size {config.img_size} must be a multiple of the model's largest stride {grid}, "
                   f"using {rounded}")
    return config.replace(img_size=rounded)


def write_run_files(config: RunConfig, hyp: dict) -> None:
    """The run folder (chosen by plan_run, or given by --evolve) with opt.yaml and hyp.yaml, written by rank 0."""
    save_dir = Path(config.save_dir)
    if dist.is_main_process():
        (save_dir / "weights").mkdir(parents=True, exist_ok=True)
        (save_dir / "opt.yaml").write_text(yaml.safe_dump(to_plain(config.options()), sort_keys=False))
        (save_dir / "hyp.yaml").write_text(yaml.safe_dump(to_plain(hyp), sort_keys=False))
    LOGGER.info(colorstr("hyperparameters: ") + ", ".join(f"{k}={v}" for k, v in hyp.items()))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(config: RunConfig, nc: int, names: list[str], device: torch.device,
                data_options: Mapping[str, Any] | None = None) -> tuple[Model, dict | None]:
    """A model from --cfg (or the checkpoint's YAML), with the matching tensors of --weights transferred
    (rank 0 reads the file and shares it); the keys of ``data_options`` (the data YAML's task keys) that its task
    builds models with (``Task.model_keys``: a pose set's kpt_shape) written into its config, as ``nc`` is. All
    ranks must call it."""
    ckpt = shared_checkpoint([config.weights], trusted=config.trust_weights)[1] if config.weights else None
    model = Model(config.cfg or (ckpt["model_yaml"] if ckpt else DEFAULT_CFG), nc=nc, img_size=config.img_size)
    settings = {k: v for k, v in (data_options or {}).items() if k in get_task(model.head.task).model_keys}
    if any(model.yaml.get(k) != v for k, v in settings.items()):  # the data decides (a new head where it differs)
        model = Model({**model.yaml, **settings}, nc=nc, img_size=config.img_size)
    model.names = list(names)
    if ckpt is not None:
        skip_anchors = bool(config.cfg) and not config.resume  # a given --cfg brings its own anchors (if any)
        own = model.state_dict()
        matched = {k: v for k, v in ckpt["model"].items()
                   if k in own and v.shape == own[k].shape and not (skip_anchors and "anchors" in k)}
        model.load_state_dict(matched, strict=False)
        clear = getattr(model.head, "clear_grid_cache", None)  # decode caches built from the old tensors
        if callable(clear):
            clear()
        LOGGER.info(f"Transferred {len(matched)}/{len(own)} items from {config.weights}")
    freeze_layers(model, list(config.freeze))
    return model.to(device, memory_format=train_memory_format(device, config.channels_last)), ckpt


COLOUR_PLACES = ("auto", "loader", "device")  # --colour-on: where the training images' HSV change runs


def colour_in_step(config: RunConfig, device: torch.device) -> bool:
    """Whether the training step changes the images' colour rather than the loader (--colour-on): auto on CUDA,
    where the GPU takes that work off the loader's cores; never with --quad, which tiles 4 images into one."""
    if config.colour_on == "device" and config.quad:
        raise TrainError("--colour-on device cannot be used with --quad (it tiles 4 images, each with its own colour "
                         "change, into one); use --colour-on loader")
    return config.colour_on == "device" or (config.colour_on == "auto" and device.type == "cuda" and not config.quad)


def load_train_data(config: RunConfig, hyp: dict, data_cfg: Any, grid: int, nc: int, reserved_cores: int = 0,
                    task: str = BASE_TASK, recycle: bool = False, colour_later: bool = False) -> TrainData:
    """Train loader (distributed sampler, augmented) and the sharded val loader of --data; batch is per rank;
    the workers get the rank's cores less ``reserved_cores`` (utils.data.loader.worker_count); with ``recycle``
    the training loop hands each batch back to the workers (utils.data.batch_memory.hand_back); the samples carry
    what the model's ``task`` trains on beside the boxes (its ``sample`` part). ``nc`` is the data set's class count,
    which its labels are checked against; with --single-cls they become class 0 after the check. With
    ``colour_later`` the training batches carry their HSV gains for the step to apply (colour_in_step)."""
    batch = dist.batch_per_rank(config.batch_size)
    common = DatasetOptions(img_size=config.img_size, batch_size=batch, stride=grid, hyp=hyp, cache=config.cache,
                            seed=config.seed, single_cls=config.single_cls, nc=nc, task=task,
                            task_options=dict(getattr(data_cfg, "task_options", None) or {}))
    train_options = DatasetOptions(**{**vars(common), "augment": True, "rect": config.rect,
                                      "prefix": colorstr("train: "), "fraction": config.fraction,
                                      "defer_colour": colour_later})
    train_loader, train_set = create_dataloader(data_cfg.train, train_options, workers=config.workers,
                                                shuffle=not config.rect, quad=config.quad,
                                                reserved_cores=reserved_cores, recycle=recycle)
    if getattr(train_set, "colour_later", False):  # a data set that leaves it (YoloDataset's pipeline)
        LOGGER.info(f"{train_options.prefix}colour changes (HSV) run in the training step, not in the loader")
    val_options = DatasetOptions(**{**vars(common), "batch_size": batch * 2, "rect": True, "pad": 0.5,
                                    "prefix": colorstr("val: ")})
    val_loader, val_set = create_dataloader(data_cfg.val, val_options, workers=config.workers, shard_eval=True,
                                            reserved_cores=reserved_cores)
    for split, dataset in (("train", train_set), ("val", val_set)):
        refuse_unlabelled(dataset, split, data_cfg.yaml_file)
    LOGGER.info(f"Using {train_loader.num_workers} dataloader workers and batch {batch} per rank, "
                f"{dist.get_world_size()} ranks")
    names = ["item"] if config.single_cls else list(data_cfg.names)
    return TrainData(train_loader, val_loader, train_set, names, is_coco=bool(data_cfg.is_coco))


def refuse_unlabelled(dataset: Any, split: str, yaml_file: Any) -> None:
    """DataError when not one image of a split has a label (some images without labels are background images,
    counted in the scan summary; all of them is a data set whose labels were not found). A streamed split, whose
    labels are read as it streams, is not checked here."""
    labels = getattr(dataset, "labels", None)
    if labels is None or any(len(rows) for rows in labels):
        return
    scan = getattr(dataset, "scan", None)
    counts = f" ({scan.missing} without a label file, {scan.empty} with an empty one)" if scan is not None else ""
    raise DataError(f"the {split} split of {yaml_file} has no labels: none of its {len(labels)} images has a "
                    f"box{counts}; put YOLO .txt files in labels/ next to images/ (docs/datasets.md)")


def build_updater(model: Model, config: RunConfig, choice: OptimizerChoice, batches_per_epoch: int,
                  ema: ModelEMA, scaler: bool) -> WeightUpdater:
    """Optimizer (``choice``: --optimizer as chosen for this run) with decay scaled to the nominal batch, lr0, warmup
    and ``ema``'s horizon by the large-batch rule (optim.BatchScaling; the hyp keeps the unscaled lr0, so a resume
    scales once), LR schedule with warmup, EMA, and the gradient scaler with ``scaler`` (float16 needs it; bfloat16
    has float32's range)."""
    hyp = choice.hyp
    accumulate = accumulate_steps(config.batch_size)
    decay = scaled_weight_decay(hyp["weight_decay"], config.batch_size, accumulate)
    rule = batch_scaling(choice.name, config.batch_size, enabled=config.batch_scaling)
    optimizer = build_optimizer(model, choice.name, hyp["lr0"] * rule.lr_factor, hyp["momentum"], decay)
    rule.scale_ema(ema)
    LOGGER.info(f"{colorstr('optimizer:')} {choice.reason}{rule.text(config.batch_size, choice.name)}"
                f"{describe_groups(optimizer)}; accumulate {accumulate} batches, weight_decay {decay:g}")
    schedule = LRSchedule(hyp, config.epochs, batches_per_epoch, cosine=config.cos_lr, accumulate=accumulate,
                          batch_scale=rule.k)
    return WeightUpdater(model, optimizer, schedule, ema=ema, amp=scaler)


def compile_model(model: nn.Module, config: RunConfig) -> nn.Module:
    """``model`` (DDP-wrapped under DDP) under torch.compile with --compile, as is otherwise."""
    if not config.compile:
        return model
    LOGGER.info("torch.compile: the first steps compile the model (minutes on a CPU), the steps after are faster")
    return torch.compile(model)
