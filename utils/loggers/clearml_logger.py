"""``--loggers clearml``: the run as a ClearML task, on a server (``clearml-init`` writes ~/clearml.conf) or offline
(CLEARML_OFFLINE_MODE=1: a session archive under CLEARML_CACHE_DIR/offline, sent later with
``clearml-task --import-offline-session`` or ``Task.import_offline_session``).

ClearML's own configuration and variables work (clearml.conf, CLEARML_API_HOST, CLEARML_OFFLINE_MODE, ...).
ClearML's automatic patching of frameworks, argparse, the console and resources and its repository detection are
off: the hook sends what every tracker gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from utils.hooks import HookBase
from utils.loggers.registry import LoggerContext
from utils.loggers.tracking import RunInfo, Tracker, TrackerHook, file_folder, require

# Task.init's auto_connect_frameworks as a dict: every framework binding off, and no repository detection (a thread
# that imports the script's packages, TensorFlow among them, while training imports its own: a circular-import race)
FRAMEWORKS_OFF = {name: False for name in ("hydra", "joblib", "scikit", "matplotlib", "tensorflow", "tensorboard",
                                            "tfdefines", "pytorch", "megengine", "xgboost", "catboost", "fastai",
                                            "lightgbm", "gradio", "detect_repository")}
SUBPROCESS_SETTING = "development.report_use_subprocess"  # clearml.conf: sdk.development.report_use_subprocess


class ClearmlTracker(Tracker):
    name = "clearml"

    def __init__(self, clearml: Any) -> None:
        self.clearml = clearml
        self.task: Any = None

    def start(self, run: RunInfo, resume_id: str | None) -> str:
        report_in_threads(self.clearml)
        self.task = self.clearml.Task.init(
            project_name=run.project, task_name=run.name, tags=[run.group] if run.group else None,
            reuse_last_task_id=resume_id or False,  # a resumed run continues its task with iterations = epochs,
            continue_last_task=0 if resume_id else False,  # not offset past the last one reported (ClearML's default)
            auto_connect_frameworks=FRAMEWORKS_OFF,
            auto_connect_arg_parser=False, auto_connect_streams=False, auto_resource_monitoring=False)
        return str(self.task.id)

    def log_params(self, params: dict[str, Any]) -> None:
        groups: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            section, _, name = key.rpartition("/")
            groups.setdefault(section or "options", {})[name] = value
        for section, values in groups.items():
            self.task.connect(values, name=section)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        logger = self.task.get_logger()
        for key, value in metrics.items():
            title, _, series = key.rpartition("/")
            logger.report_scalar(title or key, series, float(value), iteration=step)

    def log_images(self, key: str, paths: list[Path], step: int) -> None:
        logger = self.task.get_logger()
        for path in paths:
            logger.report_image(key, path.stem, iteration=step, local_path=str(path))

    def log_files(self, paths: list[Path], folder: str, kind: str) -> None:
        for path in paths:  # artifacts (an OutputModel needs a server: it fails in offline mode)
            self.task.upload_artifact(f"{file_folder(path, folder, kind)}/{path.name}", artifact_object=str(path),
                                      wait_on_upload=True)  # on the queue's thread, not in Task.close

    def log_summary(self, metrics: dict[str, float]) -> None:
        logger = self.task.get_logger()
        for key, value in metrics.items():
            logger.report_single_value(key, float(value))

    def finish(self, cancelled: bool) -> None:
        self.task.close()


def report_in_threads(clearml: Any) -> None:
    """ClearML's reporter on threads of this process, unless clearml.conf sets it (report_use_subprocess).

    On Linux ClearML forks a reporting process by default: forking a training process (torch's threads, a CUDA
    context) from the queue's thread is unsafe, and closing that process took 11 s here, against 1.3 s on threads.
    """
    from clearml.config import config

    if config.get(SUBPROCESS_SETTING, None) is None and hasattr(clearml.Task, "_report_subprocess_enabled"):
        clearml.Task._report_subprocess_enabled = False


def ClearmlLogger(context: LoggerContext) -> HookBase:  # noqa: N802 - a factory named like the hook it builds
    """The ClearML hook (registry.LOGGERS); a one-line error when clearml is not installed."""
    return TrackerHook(ClearmlTracker(require("clearml", "clearml")), context)
