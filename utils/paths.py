"""Project paths, run folders (``runs/train/exp``, ``exp2``, ...) and the paths of what a run writes.

The one rule for run folders (train.py, test.py, detect.py, --evolve, every launcher and resume): a run writes into a
new folder ``<project>/<name>{N}`` it creates itself (``new_run_folder``), marked with a ``.yolo-run`` file, or into
an existing folder of ours only when asked (``--exist-ok``, a resume), which must carry that marker. ``--name`` is
one folder name (``check_run_name``). What a run derives from an input's name (labels, crops, feature maps, saved
images) goes through ``derived_path``: sanitised names, and a path checked to stay inside its run folder.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
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


# ------------------------------------------------------------------------------------------------ run folders
RUN_MARKER = ".yolo-run"  # written into every run folder this project creates; --exist-ok reuses only those
RUN_MARKER_HEAD = "yolo run folder"  # the marker's first line
RUN_MARKER_TEXT = f"{RUN_MARKER_HEAD}\nMade by this YOLO trainer: --exist-ok and resumes reuse only such folders.\n"
MAX_RUN_NAME = 128  # characters of a --name (and at most MAX_RUN_NAME_BYTES bytes in UTF-8)
MAX_RUN_NAME_BYTES = 200
MAX_MARKER_BYTES = 4096


class RunFolderError(UserError, ValueError):
    """A run folder that cannot be used: a --name that is not one folder name, a --project that is not a usable
    folder, an existing folder this project did not make."""


def check_run_name(name: object, what: str = "--name") -> str:
    """``name`` when it is one printable folder name of 1..MAX_RUN_NAME characters that does not start with '.'
    (so never ``.``, ``..`` or a hidden folder) and holds no path separator or control character (NUL, newline);
    one RunFolderError line otherwise."""
    problem = ""
    if not isinstance(name, str) or not name:
        problem = "is empty" if name == "" else "is not a string"
    elif name in (".", ".."):
        problem = "would be the project folder or its parent"
    elif "/" in name or "\\" in name:
        problem = "holds a path separator"
    elif not name.isprintable():
        problem = "holds a control character (NUL, newline, ...)"
    elif name.startswith("."):
        problem = "starts with '.'"
    elif len(name) > MAX_RUN_NAME or len(name.encode("utf-8")) > MAX_RUN_NAME_BYTES:
        problem = f"is longer than {MAX_RUN_NAME} characters"
    if problem:
        shown = repr(name[:60]) if isinstance(name, str) else f"of type {type(name).__name__}"
        raise RunFolderError(f"{what} {shown} {problem}: give one folder name, created inside --project")
    return name


def is_run_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder (not a symlink) this project made: it holds our marker file (a plain file)."""
    folder, marker = Path(path), Path(path) / RUN_MARKER
    try:
        return (not folder.is_symlink() and folder.is_dir() and not marker.is_symlink() and marker.is_file()
                and marker.stat().st_size <= MAX_MARKER_BYTES
                and marker.read_text("utf-8", "replace").split("\n", 1)[0] == RUN_MARKER_HEAD)
    except (OSError, ValueError):
        return False


def mark_run_folder(path: str | Path) -> None:
    """Write our marker into ``path`` (a folder this project created, or an older run folder a resume adopts); an
    existing file of that name is never replaced or followed (a symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(Path(path) / RUN_MARKER, flags, 0o644)
    except FileExistsError:
        if is_run_folder(path):
            return
        raise RunFolderError(f"{path} holds a {RUN_MARKER} that is not ours; refused (move it away)") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(RUN_MARKER_TEXT)


def project_folder(project: str | Path, what: str = "--project") -> Path:
    """The project folder, resolved and created when missing (a user's choice: any folder); one RunFolderError line
    when it is not a usable path or cannot be a folder."""
    folder = _resolved(project, Path.cwd(), what, RunFolderError)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderError(f"{what} {str(project)[:200]!r} cannot be a folder: {e.strerror or e}") from None
    return folder


def _next_free(project: Path, name: str) -> Path:
    """``project/name``, else ``project/name{N}`` with N one more than the largest taken (2 at least)."""
    if not os.path.lexists(project / name):
        return project / name
    pattern = re.compile(rf"{re.escape(name)}(\d+)")
    used = [int(m.group(1)) for entry in os.listdir(project) if (m := pattern.fullmatch(entry))]
    return project / f"{name}{max(used, default=1) + 1}"


def new_run_folder(project: str | Path, name: object, exist_ok: bool = False) -> Path:
    """The run folder of a new run: ``<project>/<name>`` (or ``<name>{N}``, the next free number), created now (a
    folder that appears meanwhile is never adopted) and marked as ours. ``exist_ok``: an existing
    ``<project>/<name>`` is reused only when it carries our marker (RunFolderError otherwise). Returns it resolved."""
    name = check_run_name(name)
    folder = project_folder(project)
    if exist_ok and os.path.lexists(folder / name):
        if not is_run_folder(folder / name):
            raise RunFolderError(f"--exist-ok: {folder / name} exists but was not made by this project (it has no "
                                 f"{RUN_MARKER} file), so nothing is written there; choose another --name, or drop "
                                 "--exist-ok for a new numbered folder")
        return folder / name
    for _ in range(1000):
        path = _next_free(folder, name)
        try:
            path.mkdir()
        except FileExistsError:
            continue  # another run took it meanwhile: the next number
        except OSError as e:
            raise RunFolderError(f"cannot create the run folder {path}: {e.strerror or e}") from None
        mark_run_folder(path)
        return path
    raise RunFolderError(f"no free run folder named {name}N in {folder}; choose another --name")


def discard_if_unused(path: str | Path | None) -> bool:
    """Remove a run folder of ours that holds nothing but our marker and empty folders (a run that failed before
    writing anything); True when removed. Anything else in it keeps it whole."""
    if path is None or not is_run_folder(path):
        return False
    folder = Path(path)
    entries = sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True)
    if any(p.is_symlink() or (not p.is_dir() and p != folder / RUN_MARKER) for p in entries):
        return False
    try:
        for entry in entries:
            entry.unlink() if entry == folder / RUN_MARKER else entry.rmdir()
        folder.rmdir()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def discarded_on_failure(folder: str | Path | None, enabled: bool = True) -> Iterator[None]:
    """A run that fails inside the block before writing anything leaves no run folder behind: ``folder`` goes when
    it holds nothing but our marker and empty folders (``discard_if_unused``; only where ``enabled``, rank 0)."""
    try:
        yield
    except BaseException:
        if enabled:
            discard_if_unused(folder)
        raise


# ----------------------------------------------------------------------------------- outputs inside a run folder
def safe_stem(text: str, fallback: str, limit: int = 100) -> str:
    """``text`` as one harmless file name: path separators and characters that are not printable (NUL, newlines)
    become ``_``, no leading dot or space, at most ``limit`` characters; ``fallback`` when nothing is left (``..``,
    the stem of an image named ``...jpg``)."""
    safe = "".join(c if c.isprintable() and c not in "/\\" else "_" for c in str(text)[:limit])
    return safe.strip().lstrip(".").lstrip() or fallback


def derived_path(run_dir: str | Path, *parts: str, suffix: str = "") -> Path:
    """``run_dir/part/.../last_part{suffix}`` for an output named after an input (labels/<stem>.txt, crops,
    feature maps, saved images and videos): every part made one safe name (safe_stem; an empty one becomes
    ``_``), and the path, resolved, checked to lie inside ``run_dir`` (RunFolderError otherwise)."""
    names = [safe_stem(part, "_") for part in parts]
    if names:
        names[-1] += suffix
    return confined(Path(run_dir).joinpath(*names), run_dir, "output path", RunFolderError)
