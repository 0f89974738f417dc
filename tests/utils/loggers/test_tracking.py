"""What every tracker is sent and when (the TrackerHook, driven through a Tracker that records the calls), naming,
YOLOv5's tracker flags, and the one-line error for a tracker package that is not installed."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from models.yolo import Model
from tests.helpers import ROOT
from utils.loggers.registry import LoggerContext, LoggerError, add_logger_flags, build_loggers
from utils.loggers.tracker_queue import CANCELLED_FLUSH_S, FLUSH_S
from utils.loggers.tracking import RunInfo, Tracker, TrackerHook, file_folder, run_options


class RecordingTracker(Tracker):
    """A Tracker (the extension point each tool implements) that keeps every call."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def start(self, run: RunInfo, resume_id: str | None) -> str:
        self.calls.append(("start", resume_id))
        return resume_id or "run-1"

    def log_params(self, params: dict[str, Any]) -> None:
        self.calls.append(("params", params))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.calls.append(("metrics", (step, metrics)))

    def log_files(self, paths: list[Path], folder: str, kind: str) -> None:
        self.calls.append(("files", (folder, sorted(p.name for p in paths))))

    def log_summary(self, metrics: dict[str, float]) -> None:
        self.calls.append(("summary", metrics))

    def finish(self, cancelled: bool) -> None:
        self.calls.append(("finish", cancelled))


def fake_trainer(tiny_cfg: dict, save_dir: Path, **options: Any) -> SimpleNamespace:
    opt = argparse.Namespace(epochs=3, img_size=64, project=str(save_dir.parent), **options)
    model = Model(tiny_cfg)
    return SimpleNamespace(opt=opt, hyp={"lr0": 0.01}, device=torch.device("cpu"), model_without_ddp=model,
                           save_dir=save_dir)


def test_the_hook_sends_the_run_and_a_resumed_run_continues_it(tiny_cfg, tmp_path):
    save_dir = tmp_path / "runs" / "exp"
    (save_dir / "weights").mkdir(parents=True)
    (save_dir / "weights" / "best.pt").write_bytes(b"weights")
    (save_dir / "results.png").write_bytes(b"png")
    (save_dir / "weights" / "last.pt").write_bytes(b"weights")
    images, labels = tmp_path / "d" / "images" / "val", tmp_path / "d" / "labels" / "val"
    for folder, name in ((images, "a.jpg"), (labels, "a.txt")):
        folder.mkdir(parents=True)
        (folder / name).write_bytes(b"x")
    trainer = fake_trainer(tiny_cfg, save_dir)
    trainer.val_loader = SimpleNamespace(dataset=SimpleNamespace(im_files=[str(images / "a.jpg")],
                                                                 label_files=[str(labels / "a.txt")]))
    context = LoggerContext(save_dir, {**vars(trainer.opt), "bbox_interval": 100, "save_period": 1,
                                       "upload_dataset": "val"})
    tracker = RecordingTracker()
    hook = TrackerHook(tracker, context)
    hook.before_train(trainer)
    hook.after_epoch(trainer, 0, {"metrics/mAP_0.5": 0.5})
    hook.after_train(trainer)
    hook.close(trainer, cancelled=False)
    kinds = [kind for kind, _ in tracker.calls]
    assert kinds == ["start", "params", "files", "metrics", "files", "summary", "files", "files", "finish"]
    assert tracker.calls[2] == ("files", ("dataset", ["a.jpg", "a.txt"]))  # --upload_dataset val
    assert tracker.calls[3] == ("metrics", (0, {"metrics/mAP_0.5": 0.5}))
    assert tracker.calls[4] == ("files", ("weights", ["last.pt"]))  # every --save-period epochs
    params = tracker.calls[1][1]
    assert params["epochs"] == 3 and params["hyp/lr0"] == 0.01 and params["env/world_size"] == 1
    assert params["model/parameters"] == sum(p.numel() for p in trainer.model_without_ddp.parameters())
    assert params["model/gflops"] > 0
    assert ("files", ("weights", ["best.pt"])) in tracker.calls and ("files", ("plots", ["results.png"])) in \
        tracker.calls
    assert hook.state_dict() == {"run_id": "run-1"}

    resumed_tracker = RecordingTracker()
    resumed = TrackerHook(resumed_tracker, context)
    resumed.load_state_dict(hook.state_dict())
    resumed.before_train(trainer)
    resumed.close(trainer, cancelled=True)
    assert resumed_tracker.calls[0] == ("start", "run-1")
    assert "params" not in [kind for kind, _ in resumed_tracker.calls]  # the run keeps the parameters it began with
    assert resumed_tracker.calls[-1] == ("finish", True)


def test_run_names_follow_yolov5(tmp_path):
    default = RunInfo.of(LoggerContext(tmp_path / "runs" / "train" / "exp3", {"project": "/x/runs/train"}))
    assert (default.project, default.name, default.group) == ("YOLOv5", "exp3", None)
    custom = RunInfo.of(LoggerContext(tmp_path / "detector" / "exp", {"project": str(tmp_path / "detector")}))
    assert custom.project == "detector"
    evolve = RunInfo.of(LoggerContext(tmp_path / "exp-evolve" / "gen2", {"evolve": 5}))
    assert (evolve.name, evolve.group) == ("exp-evolve/gen2", "exp-evolve")


def test_run_options_prefer_the_frozen_config():
    @dataclasses.dataclass(frozen=True)
    class Config:
        epochs: int = 5

    assert run_options(SimpleNamespace(config=Config(), opt=argparse.Namespace(epochs=1))) == {"epochs": 5}
    assert run_options(SimpleNamespace(opt=argparse.Namespace(epochs=1))) == {"epochs": 1}


def test_dataset_files_keep_their_split_folders():
    assert file_folder(Path("/d/images/val/a.jpg"), "dataset", "dataset") == "dataset/images/val"
    assert file_folder(Path("/d/labels/train/a.txt"), "dataset", "dataset") == "dataset/labels/train"
    assert file_folder(Path("/d/weights/best.pt"), "weights", "model") == "weights"


def test_yolov5_tracker_flags_are_accepted():
    parser = argparse.ArgumentParser()
    add_logger_flags(parser)
    opt = parser.parse_args(["--loggers", "mlflow", "--loggers", "wandb", "comet", "--entity", "team",
                             "--bbox_interval", "2", "--upload_dataset", "val", "--artifact_alias", "v3"])
    assert opt.loggers == ["mlflow", "wandb", "comet"]
    assert (opt.entity, opt.bbox_interval, opt.upload_dataset, opt.artifact_alias) == ("team", 2, "val", "v3")
    defaults = parser.parse_args(["--upload_dataset"])
    assert (defaults.upload_dataset, defaults.bbox_interval, defaults.artifact_alias) == (True, -1, "latest")


@pytest.mark.parametrize(("logger", "package"), [("mlflow", "mlflow"), ("wandb", "wandb"), ("clearml", "clearml"),
                                                 ("comet", "comet_ml")])
def test_a_missing_tracker_package_is_a_one_line_error(logger, package, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # what Python does for a package that is not installed
    with pytest.raises(LoggerError) as error:
        build_loggers([logger], LoggerContext(tmp_path))
    message = str(error.value)
    assert "\n" not in message and f"'{package}'" in message and "pip install -r requirements-trackers.txt" in message


def test_other_ranks_build_no_tracker(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # would fail if it were imported
    assert build_loggers(["wandb"], LoggerContext(tmp_path, enabled=False)) == []


class BlockedTracker(RecordingTracker):
    """A tracker whose end of run cannot finish (a server that stopped answering) until ``release`` is set."""

    def __init__(self, name: str, release: threading.Event) -> None:
        super().__init__()
        self.name, self.release = name, release
        self.finishing = threading.Event()

    def finish(self, cancelled: bool) -> None:
        self.finishing.set()
        self.release.wait()


def test_trackers_end_side_by_side_against_one_deadline(tmp_path, yolo_log):
    release = threading.Event()
    context = LoggerContext(tmp_path / "exp", {"tracker_timeout": 1.0})
    trackers = [BlockedTracker(name, release) for name in ("first", "second", "third")]
    hooks = [TrackerHook(tracker, context) for tracker in trackers]
    trainer = SimpleNamespace()
    try:
        start = time.monotonic()
        for hook in hooks:  # what Hooks.close does: each hook's close, one after the other
            hook.close(trainer, cancelled=False)
        closed_s = time.monotonic() - start
        assert all(tracker.finishing.is_set() for tracker in trackers)  # every end of run started at once
    finally:
        release.set()
    assert 1.0 <= closed_s < 2 * 1.0  # one deadline for the three (one after the other: 3 deadlines)
    for tracker in trackers:
        (warning,) = [line for line in yolo_log if line.startswith(f"WARNING: {tracker.name}:")]
        assert "gave up after 1 s" in warning
    assert all(hook.queue._thread.daemon for hook in hooks)  # an abandoned tracker cannot hold the process


def test_the_deadline_is_tracker_timeout_and_at_most_three_seconds_after_a_stop(tmp_path):
    def group(**options: Any) -> Any:
        return TrackerHook(RecordingTracker(), LoggerContext(tmp_path, options)).group

    assert (group().timeout_for(False), group().timeout_for(True)) == (FLUSH_S, CANCELLED_FLUSH_S)
    assert (group(tracker_timeout=60).timeout_for(False), group(tracker_timeout=60).timeout_for(True)) == (60, 3)
    assert group(tracker_timeout=0.5).timeout_for(True) == 0.5
    parser = argparse.ArgumentParser()
    add_logger_flags(parser)
    assert parser.parse_args(["--tracker-timeout", "2.5"]).tracker_timeout == 2.5
    assert parser.parse_args([]).tracker_timeout == FLUSH_S
    with pytest.raises(SystemExit):
        parser.parse_args(["--tracker-timeout", "-1"])


@pytest.mark.slow  # a process of its own (ClearML reads its configuration once per process)
def test_clearml_keeps_a_reporting_process_when_its_configuration_asks_for_one(tmp_path):
    """Without the setting ClearML reports from threads: tests/test_tracking.py's runs close it within the deadline."""
    config = tmp_path / "clearml.conf"
    config.write_text("sdk.development.report_use_subprocess: true\n")
    code = ("import clearml; from utils.loggers.clearml_logger import report_in_threads; report_in_threads(clearml); "
            "print(bool(clearml.Task._report_subprocess_enabled))")
    env = {**os.environ, "CLEARML_CONFIG_FILE": str(config), "HOME": str(tmp_path), "CLEARML_OFFLINE_MODE": "1"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip().splitlines()[-1:] == ["True"], result.stderr[-2000:]


class ImageTracker(RecordingTracker):
    """Keeps the images it is given, with their bytes as it read them."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def log_images(self, key: str, paths: list[Path], step: int) -> None:
        self.calls.append(("images", (step, [(p.name, p.read_bytes()) for p in paths])))


def test_the_trackers_of_a_run_log_the_validation_images_drawn_once(tiny_cfg, tmp_path):
    """Two trackers: the images are drawn once per epoch (a second drawing would rewrite the files the first
    tracker's thread may be reading) and both log the same files."""
    save_dir = tmp_path / "runs" / "exp"
    context = LoggerContext(save_dir, {"epochs": 2, "bbox_interval": 1})
    trackers = [ImageTracker(name) for name in ("first", "second")]
    hooks = [TrackerHook(tracker, context) for tracker in trackers]
    model = Model(tiny_cfg).eval()
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda module, inputs: forwards.append(len(inputs[0])))
    image = torch.full((3, 64, 64), 114, dtype=torch.uint8)
    trainer = SimpleNamespace(ema_model=model, names=["a", "b", "c"],
                              val_loader=SimpleNamespace(dataset=[(image, None, f"images/val/{i}.jpg", None)
                                                                  for i in range(3)]))
    for epoch in range(2):
        for hook in hooks:
            hook.after_epoch(trainer, epoch, {"metrics/mAP_0.5": 0.1})
    for hook in hooks:
        hook.close(trainer, cancelled=False)
    assert forwards == [1] * 6  # 3 images, 2 epochs: drawn once for both trackers
    logged = [[args for kind, args in tracker.calls if kind == "images"] for tracker in trackers]
    assert [step for step, _ in logged[0]] == [0, 1] and logged[0] == logged[1]
    assert [name for name, _ in logged[0][0][1]] == ["0.jpg", "1.jpg", "2.jpg"]
    assert (save_dir / "tracking" / "val_epoch1" / "2.jpg").read_bytes() == logged[1][1][1][2][1]
