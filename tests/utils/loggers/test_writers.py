"""TensorBoard writer: on by default for rank 0 with a one-line hint, absent elsewhere."""

from __future__ import annotations

import logging
from pathlib import Path

from utils.loggers.writers import TensorBoard


def test_enabled_writer_logs_how_to_open_it_and_writes_events(tmp_path: Path, caplog) -> None:
    run_dir = tmp_path / "runs" / "train" / "exp"
    run_dir.mkdir(parents=True)
    with caplog.at_level(logging.INFO, logger="yolo"):
        board = TensorBoard(run_dir, enabled=True)
        board.scalars({"metrics/mAP_0.5": 0.5}, step=0)
        board.close()
    hints = [r.getMessage() for r in caplog.records if "tensorboard --logdir" in r.getMessage()]
    assert hints == [f"tensorboard: Start with 'tensorboard --logdir {run_dir.parent}', view at http://localhost:6006/"]
    assert any(p.name.startswith("events.out.tfevents") and p.stat().st_size > 0 for p in run_dir.iterdir())


def test_disabled_writer_is_silent_and_writes_nothing(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="yolo"):
        board = TensorBoard(tmp_path, enabled=False)
        board.scalars({"x": 1.0}, step=0)
        board.close()
    assert not caplog.records
    assert list(tmp_path.iterdir()) == []


def test_results_csv_drops_rows_after_the_resumed_checkpoint(tmp_path: Path) -> None:
    from utils.loggers.writers import ResultsCSV

    results = ResultsCSV(tmp_path / "results.csv")
    for epoch in range(3):
        results.write([epoch, *[0.5] * 10])
    epochs = lambda: [r.split(",")[0] for r in (tmp_path / "results.csv").read_text().splitlines()[1:]]  # noqa: E731
    assert results.drop_from(1) == 2 and epochs() == ["0"]
    assert results.drop_from(1) == 0 and ResultsCSV(tmp_path / "other.csv").drop_from(0) == 0
    assert not ResultsCSV(tmp_path / "off.csv", enabled=False).write([0, *[0.5] * 10])
    assert not (tmp_path / "off.csv").exists()
