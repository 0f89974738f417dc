"""Durable writes: temporary files of writers that died are cleaned up, those of living ones kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from utils.atomic_files import fsync_dir, pid_alive, remove_dead_writers_files


def test_only_dead_writers_files_are_removed(tmp_path: Path) -> None:
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    assert pid_alive(os.getpid()) and not pid_alive(dead)
    for name in (f".last.pt.tmp{dead}", f".last.pt.tmp{os.getpid()}", "last.pt", f".x.part{dead}"):
        (tmp_path / name).write_bytes(b"x")
    assert remove_dead_writers_files(tmp_path, ".*.pt.tmp*", ".tmp") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".last.pt.tmp{os.getpid()}", "last.pt",
                                                                 f".x.part{dead}"])
    fsync_dir(tmp_path)  # a folder can be synced; a missing one is skipped
    fsync_dir(tmp_path / "missing")
