"""Downloading a missing data set, as a data YAML's ``download`` key names it, without trusting the YAML.

``download_dataset(spec, root)`` is the one entry point (data formats reuse it). ``spec`` is a URL, a list of URLs,
or ``{url, dir}`` mappings. Every entry is checked before anything is fetched: http:// or https:// only; a plain
file name taken from the URL (letters, digits, ``._-``, no leading dot); ``dir`` relative and inside the data set's
folder, or ``..`` (its parent, for archives that hold the folder itself, as coco128.zip does: then every member of
the archive must lie under the folder's own name). Each download is capped in bytes, written to a temporary name
and renamed; archives are extracted only when their members stay inside the destination and their expanded size
is in proportion to the archive.
"""

from __future__ import annotations

import os
import re
import tempfile
import urllib.parse
import zipfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from utils import http_fetch
from utils.data.errors import DataError
from utils.log import LOGGER
from utils.paths import confined, data_home
from utils.safe_yaml import shown

MAX_DOWNLOAD_BYTES = 64 << 30  # COCO's train2017.zip is 19 GB
MAX_EXPANSION = 200  # an archive may expand to this many times its size (label text compresses about 10:1)
MAX_ENTRIES = 256  # Objects365 lists 97 archives
TIMEOUT_S = 60.0
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def download_dataset(spec: Any, root: Path, max_bytes: int = MAX_DOWNLOAD_BYTES,
                     homes: Sequence[Path] | None = None) -> list[Path]:
    """Fetch (and unzip) what ``spec`` names into the data set's folder ``root``; the folders written to.

    ``root`` must lie inside one of ``homes`` (default: the data home, $YOLO_DATA_DIR), so a YAML cannot aim a
    download at ``~/.ssh``. Raises DataError (one line) for a refused entry before fetching anything, and for a
    failed download.
    """
    root = Path(root).resolve()
    homes = [Path(h).resolve() for h in (homes if homes is not None else [data_home()])]
    if not any(root == h or h in root.parents for h in homes) or root.name.startswith("."):
        raise DataError(f"a download into {root} is refused: a data set that downloads itself must live under "
                        f"{' or '.join(map(str, homes))} (set YOLO_DATA_DIR), in a folder not starting with '.'")
    entries = spec if isinstance(spec, list) else [spec]
    if len(entries) > MAX_ENTRIES:
        raise DataError(f"download lists {len(entries)} entries (at most {MAX_ENTRIES})")
    plans = [plan_entry(entry, root) for entry in entries]
    for url, dest, only in plans:
        folder = root if only is not None else dest  # where the fetched file itself goes: never root's parent
        folder.mkdir(parents=True, exist_ok=True)
        name = file_name(url)
        if name.endswith(".zip"):
            LOGGER.info(f"Downloading {url} into {dest} ...")
            archive = fetch_to_temporary(url, folder, name, max_bytes)
            try:
                safe_extract(archive, dest, only=only)
            finally:
                archive.unlink(missing_ok=True)
        else:
            LOGGER.info(f"Downloading {url} to {folder / name} ...")
            fetch_to_file(url, folder / name, max_bytes)
    return [dest for _, dest, _ in plans]


def plan_entry(entry: Any, root: Path) -> tuple[str, Path, str | None]:
    """(URL, destination folder, folder name every archive member must start with or None) of one entry."""
    if isinstance(entry, dict):
        url, where = entry.get("url"), entry.get("dir")
    else:
        url, where = entry, None
    check_url(url)
    if where is None or where == "..":
        return url, root.parent, root.name  # the archive holds the data set's folder itself
    if not isinstance(where, str) or PurePosixPath(where).is_absolute():
        raise DataError(f"download 'dir' {shown(where)} must be a folder inside the data set (relative), or "
                        "'..' for an archive that holds the data set's folder")
    return url, confined(where, root, "download 'dir'", DataError), None


def check_url(url: Any) -> None:
    """http:// or https:// URLs with a host and a plain file name only (no file://, ftp://, data: ...)."""
    if not isinstance(url, str):
        raise DataError(f"download URL must be a string, got {type(url).__name__}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DataError(f"download URL {url[:120]!r}: only http:// and https:// URLs are fetched")
    file_name(url)


def file_name(url: str) -> str:
    """The file name a URL's path ends with, when it is a plain name (no dotfiles, separators or odd characters)."""
    name = PurePosixPath(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name
    if not SAFE_NAME.fullmatch(name):
        raise DataError(f"download URL {url[:120]!r}: the file name {name[:60]!r} is not a plain name (letters, "
                        "digits, '._-', not starting with a dot)")
    return name


def read_url(url: str, max_bytes: int, timeout: float = TIMEOUT_S) -> bytes:
    """The body of an http(s) URL, at most ``max_bytes`` (an image to decode, a small file); DataError (one line)."""
    try:
        return http_fetch.read_url(url, max_bytes, timeout)
    except http_fetch.FetchError as e:
        raise DataError(f"{url[:120]}: {e}") from None


def fetch_to_temporary(url: str, folder: Path, name: str, max_bytes: int = MAX_DOWNLOAD_BYTES) -> Path:
    """Download ``url`` into a new temporary file in ``folder`` (nobody else's file is opened); its path."""
    handle, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
    os.close(handle)
    tmp = Path(tmp_name)
    try:
        http_fetch.fetch_to_file(url, tmp, max_bytes, TIMEOUT_S, progress=name)
    except http_fetch.FetchError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"{url[:120]}: {e}") from None
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"download of {url[:120]} failed ({e.strerror or e}); fetch it by hand into {folder}") from None
    return tmp


def fetch_to_file(url: str, target: Path, max_bytes: int = MAX_DOWNLOAD_BYTES) -> Path:
    """Download ``url`` into ``target`` atomically (a new temporary file beside it, then linked to the name); a
    file already at ``target`` is never replaced (one DataError line instead)."""
    if target.exists() or target.is_symlink():
        raise DataError(f"{target} already exists and a download never replaces a file; remove it to fetch "
                        f"{url[:120]} again")
    tmp = fetch_to_temporary(url, target.parent, target.name, max_bytes)
    try:
        os.link(tmp, target)  # fails when the name exists: never replaces
    except FileExistsError:
        raise DataError(f"{target} already exists and a download never replaces a file") from None
    except OSError as e:  # a file system without hard links: the name was checked free above
        if target.exists() or target.is_symlink():
            raise DataError(f"{target} already exists and a download never replaces a file") from None
        try:
            os.rename(tmp, target)
        except OSError:
            raise DataError(f"download of {url[:120]} failed ({e.strerror or e}); fetch it by hand into "
                            f"{target.parent}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def safe_extract(zip_path: str | Path, dest: str | Path, only: str | None = None) -> list[Path]:
    """Extract a zip into ``dest``, refusing members that would land outside it (``../``, absolute paths, through
    symlinks), outside ``dest/only`` when given, or an archive that expands out of proportion to its size. A member
    whose file is already there is not written (the file is kept; one warning counts them)."""
    dest = Path(dest).resolve()
    inside = dest / only if only else dest
    kept = 0
    try:
        with zipfile.ZipFile(zip_path) as archive:
            members = archive.infolist()
            targets = []
            for member in members:
                target = (dest / member.filename).resolve()
                if target != inside and inside not in target.parents:
                    raise DataError(f"{zip_path}: member {member.filename[:120]!r} would be written outside "
                                    f"{inside}; refusing to extract")
                targets.append(target)
            expanded = sum(m.file_size for m in members)
            if expanded > MAX_EXPANSION * max(Path(zip_path).stat().st_size, 1 << 20):
                raise DataError(f"{zip_path}: expands to {expanded} bytes, over {MAX_EXPANSION} times its size; "
                                "refusing to extract")
            for member, target in zip(members, targets):
                if not member.is_dir() and (target.exists() or target.is_symlink()):
                    kept += 1  # never replaced
                    continue
                archive.extract(member, dest)
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError) as e:
        raise DataError(f"{zip_path}: cannot extract into {dest} ({type(e).__name__}: {str(e)[:200]})") from None
    if kept:
        LOGGER.warning(f"WARNING: {kept} file(s) of {Path(zip_path).name} were already in {dest} and were kept, "
                       "not replaced")
    return [dest / m.filename for m in members]
