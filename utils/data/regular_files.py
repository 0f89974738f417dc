"""Opening files named by strangers: only regular files, and reads bounded before they start.

A FIFO in place of an image or an annotation file blocks whoever opens it for reading until a writer comes (for
ever), a device (/dev/zero) never ends, a socket cannot be read: each is refused in one line. The check is made
twice, on the path (so a device is never opened) and on the opened descriptor (so a file swapped in between is
caught); the open itself cannot block (O_NONBLOCK). A byte cap is checked against the file's size before anything
is read, and the read stops at the cap even if the file grows meanwhile.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class FileRefused(ValueError):
    """A file that is not read: not a regular file, or larger than its cap. The message says why, without the path
    (the caller names the file)."""


def kind_of(mode: int) -> str:
    """'a FIFO', 'a folder'... for a ``st_mode`` that is not a regular file's."""
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def size_text(nbytes: int) -> str:
    """A byte count for a message: 812 bytes, 4.0 MB, 1.07 GB."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e6 else \
        f"{nbytes} bytes"


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for binary reading when it is a regular file (symlinks followed); FileRefused otherwise,
    OSError when it cannot be opened. Never blocks."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise FileRefused(f"not a regular file ({kind_of(mode)})")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(f"not a regular file ({kind_of(mode)})")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(file: BinaryIO, max_bytes: int) -> bytes:
    """The rest of an open regular file, refused (FileRefused) when its size says or its content shows it is
    larger than ``max_bytes``; never more than the size it had when asked (and one byte more) is read."""
    size = os.fstat(file.fileno()).st_size - file.tell()
    if size > max_bytes:
        raise FileRefused(f"{size_text(size)}, more than the cap of {size_text(max_bytes)}")
    data = file.read(max(size, 0))
    if file.read(1):
        raise FileRefused("it grew while it was read")
    return data


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; FileRefused or OSError otherwise (see open_regular)."""
    with open_regular(path) as file:
        return read_capped(file, max_bytes)
