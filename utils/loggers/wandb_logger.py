"""``--loggers wandb``: the run in Weights & Biases (online with ``wandb login``, or WANDB_MODE=offline).

W&B's own variables work (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE, WANDB_API_KEY, ...); ``--entity`` sets the
entity as in YOLOv5. The run's files go to <run folder>/wandb; an offline run is sent later with ``wandb sync``.
Weights and the data set are W&B artifacts with the ``--artifact_alias`` alias.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from utils.hooks import HookBase
from utils.loggers.registry import LoggerContext
from utils.loggers.tracking import RunInfo, Tracker, TrackerHook, file_folder, require

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, wandb: Any, entity: str | None, alias: str) -> None:
        self.wandb, self.entity, self.alias = wandb, entity, alias
        self.run: Any = None

    def start(self, run: RunInfo, resume_id: str | None) -> str:
        self.run = self.wandb.init(project=os.environ.get("WANDB_PROJECT") or run.project, entity=self.entity,
                                   name=run.name, group=run.group, id=resume_id,
                                   resume="allow" if resume_id else None, dir=str(run.save_dir),
                                   job_type="Training", settings=self.wandb.Settings(console="off"))
        return str(self.run.id)

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, "epoch": step}, step=step)

    def log_images(self, key: str, paths: list[Path], step: int) -> None:
        self.run.log({f"{key}/{p.stem}": self.wandb.Image(str(p)) for p in paths}, step=step)  # sizes differ

    def log_files(self, paths: list[Path], folder: str, kind: str) -> None:
        if kind == "plots":
            images = [p for p in paths if p.suffix.lower() in IMAGE_SUFFIXES]
            self.run.log({f"Results/{p.stem}": self.wandb.Image(str(p)) for p in images})
            return
        artifact = self.wandb.Artifact(re.sub(r"[^\w.-]", "_", f"run_{self.run.id}_{kind}"), type=kind)
        for path in paths:
            artifact.add_file(str(path), name=f"{file_folder(path, folder, kind)}/{path.name}")
        aliases = [self.alias, *(p.stem for p in paths if kind == "model")]
        self.run.log_artifact(artifact, aliases=list(dict.fromkeys(aliases)))

    def log_summary(self, metrics: dict[str, float]) -> None:
        self.run.summary.update(metrics)

    def finish(self, cancelled: bool) -> None:
        self.run.finish(exit_code=1 if cancelled else 0)


def WandbLogger(context: LoggerContext) -> HookBase:  # noqa: N802 - a factory named like the hook it builds
    """The W&B hook (registry.LOGGERS); a one-line error when wandb is not installed."""
    options = context.options
    tracker = WandbTracker(require("wandb", "wandb"), options.get("entity"), options.get("artifact_alias") or "latest")
    return TrackerHook(tracker, context)
