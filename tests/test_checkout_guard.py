"""The check that fails a test session which leaves files in the checkout (tests/checkout_guard.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.checkout_guard import added_files, loose_files


def test_a_file_added_anywhere_in_the_checkout_is_found(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("runs/\n")
    (tmp_path / "runs" / "train").mkdir(parents=True)
    (tmp_path / "runs" / "train" / "mine.txt").write_text("the user's own run, there before the tests\n")
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    before = loose_files(tmp_path)
    (tmp_path / "runs" / "train" / ".jobs").mkdir()
    (tmp_path / "runs" / "train" / ".jobs" / "slurm-4242").write_text("left by a test\n")  # inside an ignored folder
    (tmp_path / "stray.txt").write_text("untracked\n")
    (tmp_path / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"")  # Python's cache: not counted
    assert added_files(before, loose_files(tmp_path)) == ["runs/train/.jobs/slurm-4242", "stray.txt"]
    assert added_files(None, loose_files(tmp_path)) == []  # not a checkout at the start: nothing to compare
    assert loose_files(tmp_path / "runs") is not None and loose_files(Path("/")) is None
