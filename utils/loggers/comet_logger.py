"""``--loggers comet``: the run in Comet, online (COMET_API_KEY) or as an offline experiment (COMET_START_ONLINE=false:
an archive in COMET_OFFLINE_DIRECTORY, else <run folder>/comet, sent later with ``comet upload``).

Comet's own variables work (COMET_API_KEY, COMET_PROJECT_NAME, COMET_WORKSPACE, COMET_START_ONLINE, ...). Comet's
automatic logging (code, git, console, framework hooks) is off: the hook sends what every tracker gets.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from utils.hooks import HookBase
from utils.loggers.registry import LoggerContext
from utils.loggers.tracking import RunInfo, Tracker, TrackerHook, file_folder, require


class CometTracker(Tracker):
    name = "comet"

    def __init__(self, comet_ml: Any) -> None:
        self.comet_ml = comet_ml
        self.experiment: Any = None

    def start(self, run: RunInfo, resume_id: str | None) -> str:
        offline_directory = os.environ.get("COMET_OFFLINE_DIRECTORY") or str(run.save_dir / "comet")
        Path(offline_directory).mkdir(parents=True, exist_ok=True)  # Comet refuses a folder that does not exist
        config = self.comet_ml.ExperimentConfig(
            name=run.name, offline_directory=offline_directory, tags=[run.group] if run.group else None,
            log_code=False, log_graph=False, parse_args=False, auto_param_logging=False, auto_metric_logging=False,
            auto_output_logging=False, log_git_metadata=False, log_git_patch=False, auto_log_co2=False,
            display_summary_level=0, log_env_details=False, log_env_host=False, log_env_gpu=False, log_env_cpu=False,
            log_env_network=False, log_env_disk=False)  # the hook sends the environment; Comet's own probe uses DNS
        self.experiment = self.comet_ml.start(
            project_name=os.environ.get("COMET_PROJECT_NAME") or run.project.lower(), experiment_key=resume_id,
            mode="get_or_create" if resume_id else "create", experiment_config=config)
        return str(self.experiment.get_key())

    def log_params(self, params: dict[str, Any]) -> None:
        self.experiment.log_parameters(params)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.experiment.log_metrics(metrics, step=step, epoch=step)

    def log_images(self, key: str, paths: list[Path], step: int) -> None:
        for path in paths:
            self.experiment.log_image(str(path), name=f"{key}/{path.name}", step=step)

    def log_files(self, paths: list[Path], folder: str, kind: str) -> None:
        for path in paths:
            if kind == "model":
                self.experiment.log_model(path.stem, str(path), file_name=path.name, overwrite=True)
            elif kind == "plots" and path.suffix.lower() in (".jpg", ".png"):
                self.experiment.log_image(str(path), name=f"{folder}/{path.name}")
            else:
                self.experiment.log_asset(str(path), file_name=f"{file_folder(path, folder, kind)}/{path.name}")

    def log_summary(self, metrics: dict[str, float]) -> None:
        self.experiment.log_others({f"final/{k}": v for k, v in metrics.items()})

    def finish(self, cancelled: bool) -> None:
        self.experiment.end()


def CometLogger(context: LoggerContext) -> HookBase:  # noqa: N802 - a factory named like the hook it builds
    """The Comet hook (registry.LOGGERS); a one-line error when comet_ml is not installed."""
    return TrackerHook(CometTracker(require("comet_ml", "comet")), context)
