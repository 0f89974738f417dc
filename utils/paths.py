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


def _resolved(path: object, base: Path, what: str, error: type[UserError]) -> Path:
    """``path`` (relative to ``base`` unless absolute, ``~`` expanded) resolved; one ``error`` line when it is not a
    usable path (not a string, empty, a NUL byte, a symlink loop)."""
    shown = repr(str(path)[:200]) if isinstance(path, (str, Path)) else f"of type {type(path).__name__}"
    try:
        if not isinstance(path, (str, Path)) or not str(path):
            raise ValueError("not a path")
        return (base / Path(path).expanduser()).resolve()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        raise error(f"{what} {shown} is not a usable path; refused") from None


def _inside(resolved: Path, root: Path) -> bool:
    return resolved == root or root in resolved.parents


def confined(path: str | Path, root: str | Path, what: str = "path",
             error: type[UserError] = UserError) -> Path:
    """``path`` (relative to ``root`` unless absolute) resolved, and refused with a one-line ``error`` (a UserError)
    unless it lies inside ``root``: the one rule for every path read from a file (a data YAML, a list, an
    annotation). A value that is not a path (not a string, a NUL byte, a symlink loop) is refused the same way."""
    root = Path(root).resolve()
    resolved = _resolved(path, root, what, error)
    if not _inside(resolved, root):
        raise error(f"{what} {str(path)[:200]!r} leads outside {root}; refused")
    return resolved


def confined_to_any(path: str | Path, roots: list[Path], what: str = "path",
                    error: type[UserError] = UserError) -> Path:
    """``path`` (relative to the first of ``roots`` unless absolute) resolved, when it lies inside one of ``roots``;
    one ``error`` line naming them otherwise (a data set's ``path``: beside its YAML or in the data home)."""
    resolved_roots = [Path(r).resolve() for r in roots]
    resolved = _resolved(path, resolved_roots[0], what, error)
    if not any(_inside(resolved, root) for root in resolved_roots):
        raise error(f"{what} {str(path)[:200]!r} leads outside {' and '.join(map(str, resolved_roots))}; refused")
    return resolved
