"""``--loggers mlflow``: the run in MLflow (a tracking server, or a local store), through MlflowClient.

MLflow's own variables choose where: MLFLOW_TRACKING_URI (e.g. http://127.0.0.1:5000; unset: MLflow's local
default), MLFLOW_EXPERIMENT_NAME (else the project name, 'YOLOv5' by default). Metrics keep results.csv's names,
one step per epoch; plots, validation images and weights are artifacts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from utils.hooks import HookBase
from utils.loggers.registry import LoggerContext
from utils.loggers.tracking import RunInfo, Tracker, TrackerHook, file_folder, require

MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter's value
MAX_BATCH_PARAMS = 100  # MLflow's limit on parameters in one log_batch call


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, mlflow: Any) -> None:
        self.mlflow = mlflow
        self.client: Any = None
        self.run_id = ""

    def start(self, run: RunInfo, resume_id: str | None) -> str:
        self.client = self.mlflow.MlflowClient()
        if resume_id:
            self.client.update_run(resume_id, status="RUNNING")
            self.run_id = resume_id
            return resume_id
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or run.project
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        tags = {"save_dir": str(run.save_dir), **({"group": run.group} if run.group else {})}
        self.run_id = self.client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        return self.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        entries = [self.mlflow.entities.Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in params.items()]
        for first in range(0, len(entries), MAX_BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=entries[first:first + MAX_BATCH_PARAMS])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        entries = [self.mlflow.entities.Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=entries)

    def log_images(self, key: str, paths: list[Path], step: int) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), artifact_path=f"{key.lower()}/epoch{step}")

    def log_files(self, paths: list[Path], folder: str, kind: str) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), artifact_path=file_folder(path, folder, kind))

    def log_summary(self, metrics: dict[str, float]) -> None:
        self.client.set_tag(self.run_id, "final_metrics",
                            ", ".join(f"{k}={v:.6g}" for k, v in metrics.items()))

    def finish(self, cancelled: bool) -> None:
        self.client.set_terminated(self.run_id, status="KILLED" if cancelled else "FINISHED")


def MlflowLogger(context: LoggerContext) -> HookBase:  # noqa: N802 - a factory named like the hook it builds
    """The MLflow hook (registry.LOGGERS); a one-line error when mlflow is not installed."""
    return TrackerHook(MlflowTracker(require("mlflow", "mlflow")), context)
