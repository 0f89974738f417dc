"""Tests write only under their temporary folders: the files a test session adds to the checkout are an error.

tests/conftest.py lists the checkout's untracked and ignored files (``git status --porcelain --ignored``, every
file on its own line) when the session starts and when it ends; a file present only at the end fails the run.
Python's own caches (__pycache__, .pytest_cache, .ruff_cache) are left out.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

CACHES = ("__pycache__/", ".pytest_cache/", ".ruff_cache/")


def loose_files(root: Path) -> set[str] | None:
    """The untracked and ignored files of the git checkout at ``root``; None where it is not one (an unpacked
    archive) or git is missing, so there is nothing to compare."""
    try:
        result = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=root,
                                capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    lines = [line for line in result.stdout.splitlines() if line[:2] in ("??", "!!")]
    return {line[3:].strip('"') for line in lines if not any(cache in line[3:] for cache in CACHES)}


def added_files(before: set[str] | None, after: set[str] | None) -> list[str]:
    """Files present at the end of the session and not at its start."""
    return sorted(after - before) if before is not None and after is not None else []
