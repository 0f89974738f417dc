"""Console logging set up once per process: rank 0 talks, other ranks only report errors.

Call sites use ``LOGGER.info(...)`` and never check the rank themselves.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

LOGGER = logging.getLogger("yolo")

_COLORS = {
    "black": "\033[30m", "red": "\033[31m", "green": "\033[32m", "yellow": "\033[33m",
    "blue": "\033[34m", "magenta": "\033[35m", "cyan": "\033[36m", "white": "\033[37m",
    "bright_blue": "\033[94m", "bold": "\033[1m", "underline": "\033[4m", "end": "\033[0m",
}


def use_color(stream: Any = None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set."""
    stream = stream or sys.stdout
    return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()


def colorstr(*args: str) -> str:
    """``colorstr('blue', 'bold', 'text')`` -> highlighted text (default blue bold); plain when not a TTY."""
    *styles, text = args if len(args) > 1 else ("blue", "bold", args[0])
    if not use_color():
        return str(text)
    return "".join(_COLORS[s] for s in styles) + f"{text}" + _COLORS["end"]


def setup_logging(rank: int = 0, verbose: bool = True) -> logging.Logger:
    """Rank 0 logs INFO to stdout; other ranks log only errors (to stderr), tagged with their rank."""
    LOGGER.handlers.clear()
    LOGGER.propagate = False
    if rank in (0, -1):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.setLevel(logging.INFO if verbose else logging.WARNING)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[rank {rank}] %(message)s"))
        LOGGER.setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")  # a warning that matters is shown once, by rank 0
    LOGGER.addHandler(handler)
    return LOGGER


def format_options(options: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())


def print_options(script: str, options: Mapping[str, Any] | Any) -> None:
    """``train: weights=..., cfg=..., data=...`` once at start, the script's name highlighted."""
    opts = options if isinstance(options, Mapping) else vars(options)
    LOGGER.info(f"{colorstr(script + ':')} {format_options(opts)}")
