"""The Checkpointer's pieces: when mid-epoch checkpoints are due, and the previous generation of last.pt."""

from __future__ import annotations

from pathlib import Path

from utils.training.checkpointer import SaveInterval, keep_previous_generation


def test_save_interval_by_steps_and_minutes() -> None:
    assert [s for s in range(10) if SaveInterval(steps=3).steps_due(s)] == [3, 6, 9]
    assert not any(SaveInterval().steps_due(s) for s in range(10)) and not SaveInterval().clock_due()
    now = [0.0]
    interval = SaveInterval(minutes=1, clock=lambda: now[0])
    assert not interval.clock_due()
    now[0] = 61.0
    assert interval.clock_due()
    interval.saved()  # the clock restarts at each save
    assert not interval.clock_due()
    now[0] = 125.0
    assert interval.clock_due()


def test_the_previous_generation_is_the_last_pt_it_replaced(tmp_path: Path) -> None:
    keep_previous_generation(tmp_path)  # nothing yet: nothing to keep
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "last.pt").write_bytes(b"generation 1")
    keep_previous_generation(tmp_path)
    (tmp_path / "new").write_bytes(b"generation 2")
    (tmp_path / "new").replace(tmp_path / "last.pt")  # as save_checkpoint replaces it: a new file, atomically
    assert (tmp_path / "last.prev.pt").read_bytes() == b"generation 1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.prev.pt", "last.pt"]
