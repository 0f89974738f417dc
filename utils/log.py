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


def wrap_options(title: str, options: Mapping[str, Any], width: int = 120) -> list[str]:
    """``title k=v, k=v, ...`` broken between options into lines of at most ``width`` characters (an option longer
    than that gets a line of its own), the lines after the first indented under the first option."""
    indent, lines, line = " " * (len(title) + 1), [], title
    items = [f"{k}={v}" for k, v in options.items()]
    for i, item in enumerate(items):
        item += "," if i < len(items) - 1 else ""
        if line.strip() and len(line) + 1 + len(item) > width and line != title:
            lines.append(line)
            line = indent + item
        else:
            line += " " + item
    return [*lines, line]


def print_options(script: str, options: Mapping[str, Any] | Any, defaults: Mapping[str, Any] | None = None) -> None:
    """The options once at start, wrapped at 120 characters: those given (``train: epochs=3, img_size=64``), then,
    when ``defaults`` are known, the others (``defaults: weights=, ...``); the script's name highlighted."""
    opts = options if isinstance(options, Mapping) else vars(options)
    if defaults is None:
        given, rest = dict(opts), {}
    else:
        given = {k: v for k, v in opts.items() if k not in defaults or defaults[k] != v}
        rest = {k: v for k, v in opts.items() if k not in given}
    lines = wrap_options(f"{script}:", given) + (wrap_options("  defaults:", rest) if rest else [])
    lines[0] = lines[0].replace(f"{script}:", colorstr(script + ":"), 1)
    LOGGER.info("\n".join(lines))
