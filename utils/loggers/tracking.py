"""What every tracker (MLflow, W&B, ClearML, Comet) is sent, and when: one hook drives a small Tracker per tool.

The hook runs on the main process only (the registry builds none elsewhere). It gathers the run's options,
hyperparameters, model summary and environment at ``before_train``, each epoch's results.csv row at
``after_epoch``, validation images with predicted boxes every ``--bbox_interval`` epochs, and at ``close`` the
plots, the final metrics and the weights. Every call to the tool goes through a TrackerQueue, so a tracker that
is slow or down never holds training; at the end a run's trackers finish side by side against one deadline
(TrackerGroup). The tool's run id is kept in the checkpoints: a resumed run continues it.
"""

from __future__ import annotations

import dataclasses
import importlib
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import cv2
import numpy as np
import torch

from utils.distributed import comm as dist
from utils.evaluation.evaluate import model_contract
from utils.evaluation.task_outputs import outputs_of
from utils.hooks import LOGGER_PRIORITY, HookBase, TrainerView
from utils.log import LOGGER, colorstr
from utils.loggers.registry import LoggerContext, LoggerError
from utils.loggers.tracker_queue import CANCELLED_FLUSH_S, FLUSH_S, TrackerQueue
from utils.paths import derived_path
from utils.plots.annotate import draw_detections
from utils.tasks.contract import postprocess

INSTALL_HINT = "pip install -r requirements-trackers.txt"
START_WAIT_S = 10.0  # the first checkpoint waits this long at most for a tracker's run id
VAL_IMAGES = 4  # validation images drawn with their predicted boxes every --bbox_interval epochs
PLOT_PATTERNS = ("labels*.jpg", "train_batch*.jpg", "val_batch*.jpg", "results.png", "confusion_matrix.png",
                 "*_curve.png")


def require(package: str, logger: str) -> ModuleType:
    """Import a tracker's package, or a one-line LoggerError saying how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise LoggerError(f"--loggers {logger} needs the '{package}' package ({e}); install it with "
                          f"'{INSTALL_HINT}'") from None


def run_options(trainer: Any) -> dict[str, Any]:
    """The run's options as a dict, from the frozen ``trainer.config`` where it exists, else ``trainer.opt``."""
    config = getattr(trainer, "config", None)
    if config is not None and callable(getattr(config, "options", None)):  # RunConfig: the flags by name
        return config.options()
    if config is not None and dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(vars(trainer.opt))


@dataclass(frozen=True)
class RunInfo:
    """How a run is named in a tracker: project (experiment), run name, group (--evolve's generations)."""

    project: str
    name: str
    group: str | None
    save_dir: Path
    options: dict[str, Any]

    @staticmethod
    def of(context: LoggerContext) -> RunInfo:
        """YOLOv5's naming: project 'YOLOv5' unless --project names a folder of its own; run = the run folder.
        A generation of --evolve is '<evolve folder>/genN', grouped under the evolve folder."""
        options, save_dir = context.options, Path(context.save_dir)
        project_path = Path(str(options.get("project") or "runs/train"))
        project = "YOLOv5" if project_path.parts[-2:] == ("runs", "train") else project_path.name
        if options.get("evolve"):
            return RunInfo(project, f"{save_dir.parent.name}/{save_dir.name}", save_dir.parent.name, save_dir,
                           options)
        return RunInfo(project, save_dir.name, None, save_dir, options)


class Tracker:
    """One tool's calls; each method runs on the queue's thread. ``start`` opens a run (or continues
    ``resume_id``) and returns its id; files are sent as a list with the folder they belong under."""

    name = "tracker"

    def start(self, run: RunInfo, resume_id: str | None) -> str:
        raise NotImplementedError

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_images(self, key: str, paths: list[Path], step: int) -> None:
        pass

    def log_files(self, paths: list[Path], folder: str, kind: str) -> None:
        """``kind``: 'plots', 'model' or 'dataset' (W&B and ClearML keep models and data sets apart)."""

    def log_summary(self, metrics: dict[str, float]) -> None:
        pass

    def finish(self, cancelled: bool) -> None:
        pass


class TrackerHook(HookBase):
    """Sends the run to one Tracker through a TrackerQueue (see the module docstring)."""

    priority = LOGGER_PRIORITY

    def __init__(self, tracker: Tracker, context: LoggerContext) -> None:
        self.tracker, self.context, self.run = tracker, context, RunInfo.of(context)
        self.state_key = tracker.name
        self.queue = TrackerQueue(tracker.name)
        self.group = TrackerGroup.of(context)
        self.group.hooks.append(self)
        self.closed = False
        self.run_id: str | None = None
        self.started = threading.Event()  # start_run returned (or failed)
        self.resume_id: str | None = None
        self.last_metrics: dict[str, float] = {}
        options = context.options
        self.upload_dataset = options.get("upload_dataset") or False
        self.save_period = int(options.get("save_period") or -1)
        interval = int(options.get("bbox_interval") or -1)
        self.bbox_interval = interval if interval > 0 else max(int(options.get("epochs") or 1) // 10, 1)

    # -- state kept in checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The run id, for the checkpoint; a tracker still starting gets START_WAIT_S to name its run."""
        if not self.queue.failed:
            self.started.wait(START_WAIT_S)
        run_id = self.run_id or self.resume_id
        return {"run_id": run_id} if run_id else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume_id = str(state["run_id"]) if state.get("run_id") else None

    # -- events
    def before_train(self, trainer: TrainerView) -> None:
        self.queue.submit(self.start_run)
        if self.resume_id is None:  # a continued run keeps the parameters it was started with
            self.queue.submit(self.tracker.log_params, run_parameters(trainer))
        if self.upload_dataset:
            self.queue.submit(self.tracker.log_files, *dataset_files(trainer, self.upload_dataset))

    def start_run(self) -> None:
        """Open the tool's run, or continue the one the checkpoint named (on the queue's thread)."""
        try:
            self.run_id = self.tracker.start(self.run, self.resume_id)
        finally:
            self.started.set()
        verb = "continuing" if self.resume_id == self.run_id else "logging to"
        LOGGER.info(f"{colorstr(self.tracker.name + ': ')}{verb} run {self.run_id}")

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        self.last_metrics = {k: float(v) for k, v in metrics.items()}
        self.queue.submit(self.tracker.log_metrics, dict(self.last_metrics), epoch)
        if (epoch + 1) % self.bbox_interval == 0 and not self.queue.failed:
            folder = self.run.save_dir / "tracking" / f"val_epoch{epoch}"
            self.queue.submit(self.tracker.log_images, "Validation", self.group.drawn(trainer, folder), epoch)
        last = self.run.save_dir / "weights" / "last.pt"
        if self.save_period > 0 and (epoch + 1) % self.save_period == 0 and last.exists():
            self.queue.submit(self.tracker.log_files, [last], "weights", "model")

    def after_train(self, trainer: TrainerView) -> None:
        if self.last_metrics:
            self.queue.submit(self.tracker.log_summary, dict(self.last_metrics))
        best = self.run.save_dir / "weights" / "best.pt"
        if best.exists():
            self.queue.submit(self.tracker.log_files, [best], "weights", "model")

    def close(self, trainer: TrainerView, cancelled: bool) -> None:
        """End the run: this run's trackers all finish side by side (see TrackerGroup)."""
        self.group.close(trainer, cancelled)

    def send_end(self, plots: list[Path], cancelled: bool) -> None:
        """Queue the plots and the end of the run, then the queue's end marker (the group waits for it)."""
        if plots:
            self.queue.submit(self.tracker.log_files, plots, "plots", "plots")
        self.queue.submit(self.tracker.finish, cancelled, always=True)
        self.queue.end()
        self.closed = True


class TrackerGroup:
    """The trackers of one run (one LoggerContext). At close each tracker ends its run on its own queue's thread,
    all at once, against ONE deadline (``--tracker-timeout``, at most CANCELLED_FLUSH_S after a stop signal): a
    run with four trackers exits as soon as one would. A tracker still busy then is abandoned with one warning.
    The validation images they log are drawn once for all of them."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.hooks: list[TrackerHook] = []
        self.drawings: tuple[Path, list[Path]] | None = None  # the last folder drawn and its images

    def drawn(self, trainer: TrainerView, folder: Path) -> list[Path]:
        """draw_predictions into ``folder`` by the first tracker that asks, the same images for the others: drawing
        again would rewrite files that an earlier tracker's thread may be reading."""
        if self.drawings is None or self.drawings[0] != folder:
            self.drawings = folder, draw_predictions(trainer, folder)
        return list(self.drawings[1])

    @staticmethod
    def of(context: LoggerContext) -> TrackerGroup:
        """The group of the run ``context`` describes (made by its first tracker)."""
        given = context.options.get("tracker_timeout")
        return context.shared.setdefault("trackers", TrackerGroup(FLUSH_S if given is None else float(given)))

    def timeout_for(self, cancelled: bool) -> float:
        """The seconds the trackers get together: ``--tracker-timeout``, at most CANCELLED_FLUSH_S after a stop."""
        return min(self.timeout_s, CANCELLED_FLUSH_S) if cancelled else self.timeout_s

    def close(self, trainer: TrainerView, cancelled: bool) -> None:
        """End every tracker not yet closed: the plots that exist (after the background plotting finished)."""
        open_hooks = [hook for hook in self.hooks if not hook.closed]
        if not open_hooks:
            return
        background = getattr(trainer, "background", None)
        if background is not None and not cancelled:
            background.close()  # the plots drawn in the background are written before they are sent
        save_dir = open_hooks[0].run.save_dir
        plots = sorted({p for pattern in PLOT_PATTERNS for p in save_dir.glob(pattern)})
        timeout_s = self.timeout_for(cancelled)
        deadline = time.monotonic() + timeout_s
        for hook in open_hooks:
            hook.send_end(plots, cancelled)
        for hook in open_hooks:
            hook.queue.wait(deadline, timeout_s)


def run_parameters(trainer: TrainerView) -> dict[str, Any]:
    """Options, hyperparameters (``hyp/<name>``), the model summary and the environment, as plain values."""
    model = trainer.model_without_ddp
    options = run_options(trainer)
    params: dict[str, Any] = {k: _plain(v) for k, v in options.items()}
    params.update({f"hyp/{k}": _plain(v) for k, v in trainer.hyp.items()})
    params["model/parameters"] = int(sum(p.numel() for p in model.parameters()))
    try:
        params["model/gflops"] = round(float(model.flops(int(options.get("img_size") or 640))), 4)
    except Exception as e:  # noqa: BLE001 - a summary figure must not stop training
        LOGGER.info(f"GFLOPs not counted: {e}")
    device = trainer.device
    params.update({"env/torch": torch.__version__, "env/python": platform.python_version(),
                   "env/device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "env/cuda": torch.version.cuda or "none", "env/world_size": dist.get_world_size(),
                   "env/launcher": dist.read_env().launcher})
    return params


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def dataset_files(trainer: TrainerView, which: bool | str) -> tuple[list[Path], str, str]:
    """--upload_dataset: the images and label files of train and val (``val``: only val's)."""
    loaders = [("val", trainer.val_loader)] if which == "val" else [("train", trainer.train_loader),
                                                                     ("val", trainer.val_loader)]
    files: list[Path] = []
    for _, loader in loaders:
        dataset = loader.dataset
        files += [Path(f) for f in dataset.im_files]
        files += [Path(f) for f in dataset.label_files if Path(f).exists()]
    return sorted(set(files)), "dataset", "dataset"


def file_folder(path: Path, folder: str, kind: str) -> str:
    """Where a sent file goes in the tracker: ``folder``; a data set's files keep their images/<split> or
    labels/<split> folders (train and val may hold files of the same name)."""
    if kind != "dataset":
        return folder
    parts = Path(path).parent.parts
    top = max((i for i, part in enumerate(parts) if part in ("images", "labels")), default=len(parts))
    return "/".join((folder, *parts[top:]))


@torch.no_grad()
def draw_predictions(trainer: TrainerView, folder: Path, count: int = VAL_IMAGES) -> list[Path]:
    """The EMA model's boxes on the first ``count`` validation images (post-processed as its head's contract says,
    what its task predicts beyond them drawn under them), drawn and written to ``folder``."""
    model = trainer.ema_model
    contract = model_contract(model)
    outputs = outputs_of(contract.task)
    dataset = trainer.val_loader.dataset
    parameter = next(model.parameters())
    folder.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    written = []
    try:
        for index in range(min(count, len(dataset))):
            img, _, path, *_ = dataset[index]
            batch = img.to(parameter.device, parameter.dtype).unsqueeze(0) / 255
            output = model(batch)
            rows, others = (output[0], tuple(output[1:])) if isinstance(output, (list, tuple)) else (output, ())
            det = postprocess(rows.float(), contract, conf_thres=0.001, iou_thres=0.6, max_det=30)[0].cpu()
            bgr = np.ascontiguousarray(img.numpy().transpose(1, 2, 0)[:, :, ::-1])
            hw = tuple(img.shape[1:])  # in the input's own pixels: no letterbox to undo
            results = outputs.image(det, others, 0, hw, det[:, :4], hw, ((1.0, 1.0), (0.0, 0.0)))
            bgr = outputs.draw(bgr, det[:, :6].numpy(), results)
            if outputs.draw_labelled(bgr, det[:, :6].numpy(), results, trainer.names, 1, False, False) is None:
                draw_detections(bgr, det[:, :4].numpy(), det[:, 5].numpy(), det[:, 4].numpy(), trainer.names,
                                line_thickness=1)
            target = derived_path(folder, Path(path).stem, suffix=".jpg")
            _write_jpg(target, bgr)
            written.append(target)
    finally:
        model.train(was_training)
    return written


def _write_jpg(path: Path, bgr: np.ndarray) -> None:
    if not cv2.imwrite(str(path), bgr):
        raise OSError(f"cannot write {path}")
