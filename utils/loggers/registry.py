"""The loggers ``train.py --loggers`` chooses from: one name, one module, one hook each.

Each logger is a hook (utils/hooks.py) built by a factory that takes a LoggerContext. A logger's module (and the
package it talks to) is imported only when the logger is chosen, and only on the main process: other ranks
never import a tracking package. Adding a logger is one module plus one line in LOGGERS.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from utils.errors import UserError
from utils.hooks import HookBase
from utils.loggers.tracker_queue import CANCELLED_FLUSH_S, FLUSH_S

# name -> "module:factory"; the factory is called with a LoggerContext and returns a HookBase
LOGGERS: dict[str, str] = {
    "csv": "utils.loggers.results_csv:ResultsCsvLogger",
    "tensorboard": "utils.loggers.tensorboard:TensorBoardLogger",
    "mlflow": "utils.loggers.mlflow_logger:MlflowLogger",
    "wandb": "utils.loggers.wandb_logger:WandbLogger",
    "clearml": "utils.loggers.clearml_logger:ClearmlLogger",
    "comet": "utils.loggers.comet_logger:CometLogger",
}
DEFAULT_LOGGERS = ("csv", "tensorboard")
ALWAYS = "csv"  # results.csv is written whatever --loggers says


class LoggerError(UserError, ValueError):
    """A logger that cannot be chosen or built (unknown name, missing package)."""


@dataclass
class LoggerContext:
    """What a logger factory gets: where the run writes, its options, and whether this process logs at all."""

    save_dir: Path
    options: dict[str, Any] = field(default_factory=dict)  # the run's options (plain types)
    enabled: bool = True  # the main process; a disabled context builds nothing
    shared: dict[str, Any] = field(default_factory=dict)  # what the loggers of one run share (the trackers' closing)


def add_logger_flags(parser: argparse.ArgumentParser) -> None:
    """--loggers (repeatable, or several names at once) and YOLOv5's tracker flags, with their meaning."""
    parser.add_argument("--loggers", nargs="+", action="extend", default=None, metavar="NAME",
                        help=f"where training logs: {', '.join(LOGGERS)} (repeatable; default: "
                        f"{' '.join(DEFAULT_LOGGERS)}; results.csv is always written)")
    parser.add_argument("--entity", default=None, help="W&B entity (team or user); default: WANDB_ENTITY or yours")
    parser.add_argument("--bbox_interval", "--bbox-interval", type=int, default=-1,
                        help="trackers get validation images with predicted boxes every N epochs (-1: epochs/10)")
    parser.add_argument("--upload_dataset", "--upload-dataset", nargs="?", const=True, default=False,
                        help="send the data set (images and labels) to the trackers; 'val': the val split only")
    parser.add_argument("--artifact_alias", "--artifact-alias", default="latest",
                        help="alias (version name) of the model and data set artifacts the trackers keep")
    parser.add_argument("--tracker-timeout", "--tracker_timeout", type=_seconds, default=FLUSH_S, metavar="S",
                        help=f"seconds the trackers get together at the end of a run to send what is queued (at "
                        f"most {CANCELLED_FLUSH_S:g} after a stop signal)")


def _seconds(text: str) -> float:
    """A duration in seconds, zero or more (argparse prints the one-line error)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"expected seconds (a number, 0 or more), got {text!r}")
    return seconds


def chosen_loggers(names: Sequence[str] | None) -> list[str]:
    """The names to build, in order, each once (``None``: the defaults); unknown names are one-line errors.
    results.csv is always among them: it is the run's own record, kept whatever a tracker does."""
    chosen = list(dict.fromkeys([ALWAYS, *(names if names else DEFAULT_LOGGERS)]))
    unknown = [n for n in chosen if n not in LOGGERS]
    if unknown:
        raise LoggerError(f"--loggers: unknown {', '.join(unknown)} (choose from {', '.join(LOGGERS)})")
    return chosen


def build_loggers(names: Sequence[str] | None, context: LoggerContext) -> list[HookBase]:
    """The hooks of the chosen loggers; none where ``context.enabled`` is false (ranks other than 0)."""
    chosen = chosen_loggers(names)
    if not context.enabled:
        return []
    return [_factory(name)(context) for name in chosen]


def _factory(name: str) -> Any:
    module_name, _, factory_name = LOGGERS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise LoggerError(f"--loggers {name}: cannot import {module_name} ({e})") from None
    return getattr(module, factory_name)
