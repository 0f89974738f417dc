"""Resolve ``--weights``: a file on disk as it is, or an official release name fetched once into a cache.

Release names: YOLOv5's ``yolov5{n,s,m,l,x}{,6,-seg}.pt`` (its v7.0 GitHub release) and ultralytics'
``yolov8{n,s,m,l,x}{,-seg,-pose}.pt``, ``yolo11{n,s,m,l,x}{,-seg,-pose}.pt`` (its assets release v8.3.0) and
``yolo26{n,s,m,l,x}{,-seg,-pose}.pt`` (v8.4.0); the classifiers and oriented-box models ``yolov8{n,...}-cls.pt``,
``yolo11{n,...}-obb.pt`` (v8.3.0) and ``yolo26{n,...}-cls.pt``, ``-obb.pt`` (v8.4.0).

User-facing settings (environment variables, read when a name is resolved, never at import):

    YOLO_WEIGHTS_DIR   where release weights are cached (default ``~/.cache/yolo-ddp/weights``)
    YOLO_WEIGHTS_URL   the base URL every release name is fetched from, a mirror (default: each name's release,
                       e.g. https://github.com/ultralytics/yolov5/releases/download/v7.0)

A URL as ``--weights`` is refused (only release names are fetched). Downloads are capped at MAX_WEIGHTS_BYTES and
go to a temporary name in the cache folder, are checked (length, zip structure), flushed to disk and
renamed, so a killed download never leaves a half file under the final name. Under torchrun use
:func:`attempt_download_once_per_node`: local rank 0 downloads while the other ranks of its machine wait.
The module does not import torch, so a download costs no torch start-up.
"""

from __future__ import annotations

import os
import re
import time
import zipfile
from pathlib import Path

from utils import http_fetch
from utils.atomic_files import fsync_dir, remove_dead_writers_files
from utils.errors import UserError
from utils.log import LOGGER

DEFAULT_URL = "https://github.com/ultralytics/yolov5/releases/download/v7.0"
ASSETS_URL = "https://github.com/ultralytics/assets/releases/download"  # ultralytics' release files, by tag
RELEASE_URLS = {  # release file name -> the folder URL it is fetched from when YOLO_WEIGHTS_URL is not set
    **{f"yolov5{size}{p6}.pt": DEFAULT_URL for p6 in ("", "6", "-seg") for size in "nsmlx"},
    **{f"{family}{size}{task}.pt": f"{ASSETS_URL}/v8.3.0" for family in ("yolov8", "yolo11") for size in "nsmlx"
       for task in ("", "-seg", "-pose")},
    **{f"{family}{size}{task}.pt": f"{ASSETS_URL}/{release}" for size in "nsmlx" for task in ("-cls", "-obb")
       for family, release in (("yolov8", "v8.3.0"), ("yolo11", "v8.3.0"), ("yolo26", "v8.4.0"))},
    **{f"yolo26{size}{task}.pt": f"{ASSETS_URL}/v8.4.0" for size in "nsmlx" for task in ("", "-seg", "-pose")},
}
RELEASE_NAMES = tuple(RELEASE_URLS)
MAX_WEIGHTS_BYTES = 2 << 30  # the largest release file (yolov5x6.pt) is 270 MB
URL_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")  # https://host/x.pt (a Path keeps it as https:/host/x.pt)


class DownloadError(UserError, RuntimeError):
    """Weights that are neither on disk nor downloadable; the message says where to put the file."""


def weights_dir() -> Path:
    """The cache folder of release weights: $YOLO_WEIGHTS_DIR, else ``~/.cache/yolo-ddp/weights``."""
    return Path(os.environ.get("YOLO_WEIGHTS_DIR") or Path.home() / ".cache" / "yolo-ddp" / "weights").expanduser()


def release_url(name: str) -> str:
    """Where release file ``name`` is fetched from: $YOLO_WEIGHTS_URL (a base URL) or the name's GitHub release."""
    return f"{(os.environ.get('YOLO_WEIGHTS_URL') or RELEASE_URLS.get(name, DEFAULT_URL)).rstrip('/')}/{name}"


def is_release_name(weights: str | Path) -> bool:
    """True for the official file names (``yolov5s.pt``, ``yolo11n.pt``, ...), wherever the path points."""
    return Path(weights).name in RELEASE_NAMES


def resolve_weights(weights: str | Path) -> Path:
    """Where ``weights`` is or would be put: the path itself when it exists or names a folder, else the cache.

    ``yolov5s.pt`` (a bare release name) -> ``$YOLO_WEIGHTS_DIR/yolov5s.pt``; ``path/to/yolov5s.pt`` stays there.
    Raises DownloadError when the file is missing and not a release name. Never downloads.
    """
    check_not_url(weights)
    path = Path(weights).expanduser()
    if path.is_file():
        return path
    if not is_release_name(path):
        raise DownloadError(f"weights {weights} not found, and it is not an official release name "
                            f"({', '.join(RELEASE_NAMES)})")
    return path if str(weights) != path.name else weights_dir() / path.name


def check_not_url(weights: str | Path) -> None:
    """Refuse ``--weights https://host/x.pt``: only official release names are downloaded (from $YOLO_WEIGHTS_URL,
    byte-capped); a URL would otherwise be taken for a local path such as ``./https:/host/x.pt``."""
    if URL_PREFIX.match(str(weights)) and not Path(weights).expanduser().exists():
        raise DownloadError(f"--weights {str(weights)[:200]}: URLs are not downloaded (only official release names "
                            "such as yolov5s.pt are); download the file yourself and pass its path")


def attempt_download(weights: str | Path, *, progress: bool = True, timeout: float = 30.0, attempts: int = 2) -> Path:
    """The local path of ``weights``, downloading an official release file (``yolov5s.pt``) when it is missing.

    Existing paths are returned unchanged. Raises DownloadError (one line: URL, reason, where to put the file).
    """
    path = resolve_weights(weights)
    if path.is_file():
        return path
    url = release_url(path.name)
    LOGGER.info(f"Downloading {url} to {path}")
    reason = ""
    for attempt in range(max(attempts, 1)):
        if attempt:
            LOGGER.warning(f"WARNING: download of {path.name} failed ({reason}); retrying ({attempt}/{attempts - 1})")
            time.sleep(min(2.0 ** (attempt - 1), 8.0))
        try:
            return download_file(url, path, progress=progress, timeout=timeout)
        except DownloadError as e:
            reason = str(e)
    raise DownloadError(f"could not download {path.name} from {url}: {reason}; put the file at {path}")


def attempt_download_once_per_node(weights: str | Path, *, progress: bool = True, timeout: float = 30.0,
                                   attempts: int = 2) -> Path:
    """:func:`attempt_download` by local rank 0 of each machine while its other ranks wait, then find the file.

    All ranks must call it (it runs barriers). When the download fails every rank raises DownloadError.
    """
    from utils.distributed import comm as dist  # torch: imported only where the process group is needed

    with dist.zero_first(local=True):
        if dist.is_local_main_process():
            return attempt_download(weights, progress=progress, timeout=timeout, attempts=attempts)
    path = resolve_weights(weights)
    if not path.is_file():
        raise DownloadError(f"{path} is missing: local rank 0 could not download it; put the file at {path}")
    return path


def download_file(url: str, dest: str | Path, *, progress: bool = True, timeout: float = 30.0) -> Path:
    """Fetch ``url`` into ``dest`` atomically (temp file in the same folder, length and zip checks, fsync, rename).

    Raises DownloadError with the bare reason; the temporary file is removed on every failure.
    """
    dest = Path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create {dest.parent} ({e.strerror or e})") from None
    remove_stale_parts(dest.parent)
    tmp = dest.with_name(f".{dest.name}.part{os.getpid()}")
    try:
        size = http_fetch.fetch_to_file(url, tmp, MAX_WEIGHTS_BYTES, timeout, progress=dest.name if progress else None)
        if size == 0:
            raise DownloadError("the server sent an empty file")
        if not zipfile.is_zipfile(tmp):
            raise DownloadError(f"the server sent {size} bytes that are not a PyTorch zip file")
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    except http_fetch.FetchError as e:
        raise DownloadError(str(e)) from None
    except OSError as e:
        raise DownloadError(f"cannot write {tmp} ({e.strerror or e})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def remove_stale_parts(folder: Path) -> None:
    """Delete ``.NAME.part<pid>`` files left by downloads that were killed (their process is gone)."""
    remove_dead_writers_files(folder, ".*.part*", ".part")
