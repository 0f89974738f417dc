"""The results.csv logger: one row per epoch from after_epoch's metrics, rows after a resumed checkpoint dropped."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from utils.hooks import LOGGER_PRIORITY
from utils.loggers.registry import LoggerContext, build_loggers
from utils.loggers.results_csv import ResultsCsvLogger, results_columns

ANCHOR_FREE = ("box", "cls", "dfl")  # an anchor-free family's loss terms: its own columns
ROW = dict.fromkeys(results_columns(ANCHOR_FREE)[1:], 0.5)


def trainer_at(epoch: int, resumed: bool) -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace(epoch=epoch, resumed=resumed))


def epochs(path: Path) -> list[str]:
    return [r.split(",")[0] for r in path.read_text().splitlines()[1:]]


def test_rows_by_column_name_and_the_default_loggers(tmp_path: Path) -> None:
    csv_logger, board = build_loggers(None, LoggerContext(tmp_path))  # the defaults: csv, tensorboard
    assert isinstance(csv_logger, ResultsCsvLogger) and csv_logger.priority == LOGGER_PRIORITY
    assert type(board).__name__ == "TensorBoardLogger"
    csv_logger.before_train(trainer_at(0, resumed=False))
    for epoch in range(2):
        csv_logger.after_epoch(trainer_at(epoch, False), epoch, {**ROW, "metrics/recall": 0.25 * epoch})
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert lines[0].split(",") == results_columns(ANCHOR_FREE)
    assert lines[0].split(",")[1:4] == ["train/box_loss", "train/cls_loss", "train/dfl_loss"]
    assert lines[2].split(",")[results_columns(ANCHOR_FREE).index("metrics/recall")] == "0.25"
    assert epochs(tmp_path / "results.csv") == ["0", "1"]


def test_a_resumed_run_drops_the_rows_it_trains_again(tmp_path: Path, caplog) -> None:
    results = ResultsCsvLogger(LoggerContext(tmp_path))
    for epoch in range(3):
        results.after_epoch(trainer_at(epoch, False), epoch, ROW)
    ResultsCsvLogger(LoggerContext(tmp_path)).before_train(trainer_at(1, resumed=False))  # a new run keeps them
    assert epochs(tmp_path / "results.csv") == ["0", "1", "2"]
    with caplog.at_level("INFO", logger="yolo"):
        ResultsCsvLogger(LoggerContext(tmp_path)).before_train(trainer_at(1, resumed=True))
    assert epochs(tmp_path / "results.csv") == ["0"] and "dropped 2 rows of epochs from 1 on" in caplog.text
    ResultsCsvLogger(LoggerContext(tmp_path / "new")).before_train(trainer_at(0, resumed=True))  # no file: nothing
    assert not (tmp_path / "new").exists()


def test_the_columns_are_the_loss_terms_by_name() -> None:
    assert results_columns(("box", "obj", "cls"), 3) == [
        "epoch", "train/box_loss", "train/obj_loss", "train/cls_loss", "metrics/precision", "metrics/recall",
        "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "x/lr0", "x/lr1", "x/lr2"]
    assert results_columns(("box", "cls", "dfl", "o2o"), 1)[1:5] == [
        "train/box_loss", "train/cls_loss", "train/dfl_loss", "train/o2o_loss"]
