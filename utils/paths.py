"""Project paths and run folders (``runs/train/exp``, ``exp2``, ...)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from utils.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
# Media the data sets and detect.py read, by file suffix (lower case).
IMG_SUFFIXES = frozenset({".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp"})
VID_SUFFIXES = frozenset({".asf", ".avi", ".gif", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".ts", ".wmv",
                          ".webm"})


def data_home() -> Path:
    """Where datasets live: $YOLO_DATA_DIR, else ``datasets/`` in the project (git-ignored)."""
    return Path(os.environ.get("YOLO_DATA_DIR", ROOT / "datasets"))


def increment_path(path: str | Path, exist_ok: bool = False, mkdir: bool = False) -> Path:
    """``runs/train/exp`` -> ``runs/train/exp{N}`` with the next free N (unless ``exist_ok``)."""
    path = Path(path)
    if path.exists() and not exist_ok:
        pattern = re.compile(rf"^{re.escape(path.stem)}(\d+)$")
        used = [int(m.group(1)) for p in path.parent.glob(f"{path.stem}*") if (m := pattern.match(p.stem))]
        path = path.with_name(f"{path.stem}{max(used, default=1) + 1}{path.suffix}")
    if mkdir:
        path.mkdir(parents=True, exist_ok=True)
    return path


def confined(path: str | Path, root: str | Path, what: str = "path") -> Path:
    """``path`` (relative to ``root`` unless absolute) resolved, and refused with a one-line UserError unless it
    lies inside ``root``: the one rule for every path read from a file (a data YAML, a list, an annotation)."""
    root = Path(root).resolve()
    resolved = (root / path).resolve()
    if resolved != root and root not in resolved.parents:
        raise UserError(f"{what} {str(path)[:200]!r} leads outside {root}; refused")
    return resolved
