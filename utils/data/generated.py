"""Generated data sets that delete only what they made: the one mechanism behind every built-in generated set
(utils/data/synthetic.py for detection, utils/tasks/segment/synthetic.py for segments, and every other task's set).

A generator describes what it writes once and hands its writer over::

    SET = GeneratedSet("synthetic-pose", own_files=re.compile(r"(images|labels)/(train|val)/\\d{5}\\.(jpg|txt)"))
    header = {"version": 1, "task": "pose", "spec": {...}, "names": [...]}  # what identifies one set
    counts = {"images/train": 512, "labels/train": 512, "images/val": 128, "labels/val": 128}
    SET.ensure(root, header, counts, lambda: SET.generate(root, header, write), "512 + 128 pose images")
    # all ranks call ensure; write(folder) fills a new folder with the images and labels

What the mechanism promises, for every generator that uses it:

- **A set is only written into a folder it creates.** ``write(folder)`` fills a new temporary sibling of ``root``
  (``mkdtemp``); the mechanism then adds the marker file ``.yolo-generated`` (naming the generator) and the
  manifest ``synthetic.json`` (the header, and every file written with its size and SHA-256), and renames the
  folder to ``root`` in one step, so a crash never leaves a half-written set that looks complete.
- **An existing ``root`` is replaced only when it is empty or a set this mechanism made**: it carries the marker,
  and every entry in it is a file its manifest lists that is still as written (same size and SHA-256) under a
  name the generator writes (``own_files``), a label cache the scan made for it (``derived``), the marker or the
  manifest. Exactly those files are removed, then the folders left empty.
- **Anything else is refused before anything is removed**, in one GeneratedSetError line naming the entry: a
  file of the user's, a file they edited, a symlink, a folder without the marker (a stranger's bundle holding a
  ``synthetic.json``, a set of an older version). A complete set matching the header is reused as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.distributed import comm as dist
from utils.errors import UserError
from utils.log import LOGGER, colorstr

MARKER = ".yolo-generated"  # JSON {"generator": kind}: the folder is a set this mechanism made
MANIFEST = "synthetic.json"  # the header, "generator" and "files": {relative name: {"size": n, "sha256": hex}}
MAX_MANIFEST = 32 << 20  # 100,000 images and their labels take about 15 MB of manifest
MAX_MARKER = 4096
LABEL_CACHES = re.compile(r"labels/[\w-]+(\.[\w-]+)?\.cache(\.d/.+)?")  # what the label scan writes into a set


class GeneratedSetError(UserError):
    """A generated set cannot be written where it was asked for (a folder holding anything it did not make)."""


def _read_json(path: Path, limit: int) -> dict:
    """The JSON mapping in ``path`` ({} when it is missing, a symlink, too large, not JSON or not a mapping)."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > limit:
            return {}
        found = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def file_record(path: Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of a file, read in pieces."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def _walk(root: Path) -> list[tuple[str, Path]]:
    """Every entry under ``root`` as (relative '/'-name, path), folders before what they hold; symlinks are
    listed, never followed."""
    entries = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs) + sorted(files):
            path = Path(folder) / name
            entries.append((path.relative_to(root).as_posix(), path))
    return entries


@dataclass(frozen=True)
class GeneratedSet:
    """One generator's rules: its ``kind`` (recorded in the marker and the manifest), the names it writes
    (``own_files``, relative '/'-paths; fullmatch) and the files other code derives inside a set (``derived``)."""

    kind: str
    own_files: re.Pattern[str]
    derived: re.Pattern[str] = LABEL_CACHES

    def is_complete(self, root: Path, header: Mapping[str, Any], counts: Mapping[str, int]) -> bool:
        """Whether ``root`` holds a complete set of ``header``: its manifest agrees on every header key (and on the
        generator, where it names one), and each folder of ``counts`` holds that many entries. Reads only."""
        manifest = _read_json(root / MANIFEST, MAX_MANIFEST)
        if any(manifest.get(key) != value for key, value in header.items()):
            return False
        if manifest.get("generator", self.kind) != self.kind:
            return False
        try:
            return all(len(os.listdir(root / folder)) == count for folder, count in counts.items())
        except OSError:
            return False

    def _ours(self, root: Path) -> bool:
        return isinstance(_read_json(root / MARKER, MAX_MARKER).get("generator"), str)

    def _verified(self, root: Path, name: object, record: object) -> bool:
        """Whether the manifest's ``name`` is one this generator writes, lies in ``root`` through no symlink, and
        is a plain file still holding what was written (``record``: size and SHA-256)."""
        if not isinstance(name, str) or not self.own_files.fullmatch(name) or not isinstance(record, dict):
            return False
        path = root / name
        try:
            if path.resolve() != root.resolve() / name or path.is_symlink() or not path.is_file():
                return False
            return path.stat().st_size == record.get("size") and file_record(path) == record
        except (OSError, ValueError):
            return False

    def removable(self, root: Path) -> list[Path]:
        """What regenerating at ``root`` removes (files, then folders, deepest first): nothing for a missing or
        empty folder. GeneratedSetError (one line, nothing touched) when ``root`` is not a folder, not a set of
        ours, or holds an entry that is not listed, not as written, or a symlink. Reads only."""
        if root.is_symlink() or (root.exists() and not root.is_dir()):
            raise GeneratedSetError(f"generated set: {root} exists and is not a folder; choose another path")
        entries = _walk(root) if root.exists() else []
        if not entries:
            return []
        refuse = (f"generated set: {root} is not empty and holds {{}}; a set is generated only into a new or empty "
                  "folder or a set of its own, never over other files: choose another path or move them away")
        if not self._ours(root):
            raise GeneratedSetError(refuse.format(f"{entries[0][0]!r} but no {MARKER} file (the generator did not "
                                                  "make it)"))
        listed = _read_json(root / MANIFEST, MAX_MANIFEST).get("files")
        listed = listed if isinstance(listed, dict) else {}
        own_folders = {parent for name in listed if isinstance(name, str) and self.own_files.fullmatch(name)
                       for parent in map(str, Path(name).parents) if parent != "."}
        files, folders = [], []
        for name, path in entries:
            if not path.is_symlink() and path.is_dir():
                if name not in own_folders and not self.derived.fullmatch(f"{name}/x"):
                    raise GeneratedSetError(refuse.format(f"{name!r}, a folder the generator did not make"))
                folders.append(path)
            elif name in (MARKER, MANIFEST) or (self.derived.fullmatch(name) and not path.is_symlink()) \
                    or self._verified(root, name, listed.get(name)):
                files.append(path)
            else:
                raise GeneratedSetError(refuse.format(f"{name!r}, a file the generator did not make or that changed "
                                                      "since it made it"))
        return [*files, *sorted(folders, key=lambda p: len(p.parts), reverse=True)]

    def generate(self, root: Path, header: Mapping[str, Any], write: Callable[[Path], None]) -> Path:
        """``write(folder)`` into a new temporary sibling of ``root``, the marker and manifest added, then renamed
        to ``root``; what ``removable`` lists is removed first (its refusal comes before anything is written)."""
        self.removable(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp", dir=root.parent))  # new: nobody else's
        try:
            write(tmp)
            files = {name: file_record(path) for name, path in _walk(tmp) if path.is_file()}
            strays = [name for name in files if not self.own_files.fullmatch(name)]
            if strays:
                raise RuntimeError(f"{self.kind} wrote {strays[0]!r}, not one of its own names")
            (tmp / MANIFEST).write_text(json.dumps({**header, "generator": self.kind, "files": files}, indent=1))
            (tmp / MARKER).write_text(json.dumps({"generator": self.kind}) + "\n")
            self._replace(root, tmp, header)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # made by mkdtemp above: only this call's own files
        return root

    def _replace(self, root: Path, tmp: Path, header: Mapping[str, Any]) -> None:
        """Clear an earlier set of ours at ``root`` (checked again just before) and rename ``tmp`` into place."""
        if root.exists():
            for path in [*self.removable(root), root]:
                with contextlib.suppress(OSError):  # a folder not empty stays, and the rename below fails
                    path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        try:
            tmp.rename(root)
        except OSError:  # another process (not in our group) finished first, or something appeared there
            manifest = _read_json(root / MANIFEST, MAX_MANIFEST)
            if manifest.get("generator") != self.kind or any(manifest.get(k) != v for k, v in header.items()):
                raise GeneratedSetError(f"generated set: could not move the new set into {root} (something else "
                                        "is writing there); try again") from None

    def ensure(self, root: Path, header: Mapping[str, Any], counts: Mapping[str, int], generate: Callable[[], Any],
               what: str) -> Path:
        """``root`` holding a complete set of ``header``: when it does not, ``generate()`` (this set's ``generate``
        with the generator's writer) runs on local rank 0 while the other ranks wait (zero-first); ``what`` names the
        set in the log line. A refusal is raised on every rank alike. All ranks must call it."""
        if not self.is_complete(root, header, counts):
            self.removable(root)
        with dist.zero_first(local=True):
            if dist.is_local_main_process() and not self.is_complete(root, header, counts):
                LOGGER.info(f"{colorstr('synthetic:')} generating {what} into {root} ...")
                generate()
        return root
