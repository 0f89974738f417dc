"""The TensorBoard logger: opened when training starts with a one-line hint, every results.csv column per epoch."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

from utils.hooks import LOGGER_PRIORITY
from utils.loggers.registry import LoggerContext, build_loggers
from utils.loggers.tensorboard import TensorBoardLogger


def test_logger_opens_at_the_start_of_training_hints_and_writes_events(tmp_path: Path, caplog) -> None:
    run_dir = tmp_path / "runs" / "train" / "exp"
    run_dir.mkdir(parents=True)
    board = TensorBoardLogger(LoggerContext(run_dir))
    assert board.priority == LOGGER_PRIORITY and list(run_dir.iterdir()) == []  # nothing before training starts
    with caplog.at_level(logging.INFO, logger="yolo"):
        board.before_train(SimpleNamespace())
        board.after_epoch(SimpleNamespace(), 0, {"metrics/mAP_0.5": 0.5, "x/lr0": 0.01})
        board.close(SimpleNamespace(), cancelled=False)
    hints = [r.getMessage() for r in caplog.records if "tensorboard --logdir" in r.getMessage()]
    assert hints == [f"tensorboard: Start with 'tensorboard --logdir {run_dir.parent}', view at http://localhost:6006/"]
    events = [p for p in run_dir.iterdir() if p.name.startswith("events.out.tfevents")]
    assert len(events) == 1 and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(run_dir)).Reload().Tags()["scalars"]
    assert sorted(scalars) == ["metrics/mAP_0.5", "x/lr0"]


def test_other_ranks_build_no_logger_and_write_nothing(tmp_path: Path) -> None:
    assert build_loggers(None, LoggerContext(tmp_path, enabled=False)) == []
    assert list(tmp_path.iterdir()) == []


def test_writing_scalars_does_not_import_tensorflow(tmp_path: Path) -> None:
    """TensorBoard would import TensorFlow where it is installed (seconds of CPU); scalars need only its stub."""
    import subprocess
    import sys

    code = ("import sys; from types import SimpleNamespace as N; from utils.loggers.registry import LoggerContext; "
            "from utils.loggers.tensorboard import TensorBoardLogger as T; "
            f"b = T(LoggerContext({str(tmp_path)!r})); b.before_train(N()); b.after_epoch(N(), 0, {{'a': 1.0}}); "
            "b.close(N(), cancelled=False); print('tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert any(p.name.startswith("events.out.tfevents") for p in tmp_path.iterdir())
