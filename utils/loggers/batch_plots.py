"""train_batch0..2.jpg: the first training batches of a run with their boxes, as a hook."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from utils.hooks import HookBase, StepInfo, TrainerView
from utils.loggers.background import BackgroundTasks
from utils.plots.figures import plot_images


class TrainBatchPlots(HookBase):
    """train_batch0..2.jpg: the first batches of the run's first epoch with their boxes, drawn in the background
    (main process only: ``background`` is disabled elsewhere)."""

    def __init__(self, background: BackgroundTasks, save_dir: Path, names: Sequence[str], count: int = 3) -> None:
        self.background, self.save_dir, self.names, self.count = background, Path(save_dir), list(names), count
        self.first_epoch: int | None = None

    def before_train(self, trainer: TrainerView) -> None:
        self.first_epoch = None if trainer.state.samples_seen else trainer.state.epoch  # not a resumed epoch

    def after_step(self, trainer: TrainerView, step: StepInfo) -> None:
        if step.epoch == self.first_epoch and step.batch < self.count:
            self.background.submit(plot_images, step.imgs.detach().cpu().clone(), step.targets.detach().cpu().clone(),
                                   step.paths, self.save_dir / f"train_batch{step.batch}.jpg", self.names)
