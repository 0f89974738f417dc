"""Files written so that a crash never leaves a half file under the real name: durable renames, and the
clean-up of temporary files whose writer died (their names end with the writer's pid)."""

from __future__ import annotations

import os
import re
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); skipped where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (this one always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


def remove_dead_writers_files(folder: Path, pattern: str, pid_suffix: str) -> int:
    """Delete the files of ``folder`` matching ``pattern`` whose name ends with ``<pid_suffix><pid>`` of a process
    that is gone (a writer killed mid-write); returns how many."""
    removed = 0
    for path in Path(folder).glob(pattern):
        match = re.search(rf"{re.escape(pid_suffix)}(\d+)$", path.name)
        if match and not pid_alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed += 1
    return removed
