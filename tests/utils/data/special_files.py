"""Files that are not regular files, for the readers' hang tests: a FIFO blocks whoever opens it for reading until
a writer comes, so a reader that does not check would hang for good."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def fifos(*paths: Path) -> Iterator[list[Path]]:
    """FIFOs at ``paths``; on exit each is opened for writing once (without blocking), so a reader a regression
    left blocked on one gets end-of-file instead of hanging the test process, then they are removed."""
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
    try:
        yield list(paths)
    finally:
        for path in paths:
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO when nobody is reading: fine
            path.unlink(missing_ok=True)
