"""TensorBoard event files in the run folder, as a logger hook (``--loggers tensorboard``): every results.csv
column of every epoch, keyed by its column name."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

from utils.hooks import LOGGER_PRIORITY, HookBase, TrainerView
from utils.log import LOGGER, colorstr
from utils.loggers.registry import LoggerContext


class TensorBoardLogger(HookBase):
    """A SummaryWriter opened when training starts (after a resume was found good), closed with the run."""

    priority = LOGGER_PRIORITY

    def __init__(self, context: LoggerContext) -> None:
        self.log_dir = Path(context.save_dir)
        self.writer: Any = None

    def before_train(self, trainer: TrainerView) -> None:
        self.open()

    def open(self) -> None:
        """The event file and the one-line hint of how to view it."""
        if "tensorflow" not in sys.modules:  # scalars need no TensorFlow: its import would cost ~5-15 s of CPU
            sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        from torch.utils.tensorboard import SummaryWriter  # slow import, only where used

        logging.getLogger("tensorboard").setLevel(logging.WARNING)
        self.writer = SummaryWriter(str(self.log_dir))
        LOGGER.info(f"{colorstr('tensorboard: ')}Start with 'tensorboard --logdir {self.log_dir.parent}', "
                    "view at http://localhost:6006/")

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, epoch)
            self.writer.flush()

    def close(self, trainer: TrainerView, cancelled: bool) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
