"""The --loggers registry: names checked in one line, defaults, nothing built where logging is disabled."""

from __future__ import annotations

import argparse

import pytest

from utils.loggers import registry
from utils.loggers.registry import LoggerContext, LoggerError, build_loggers, chosen_loggers


def test_defaults_and_order_without_repeats():
    assert chosen_loggers(None) == list(registry.DEFAULT_LOGGERS)
    assert chosen_loggers(["tensorboard", "csv", "tensorboard"]) == ["csv", "tensorboard"]
    assert chosen_loggers(["mlflow"]) == ["csv", "mlflow"]  # results.csv whatever is chosen


def test_unknown_logger_is_one_line_naming_the_choices():
    with pytest.raises(LoggerError) as e:
        chosen_loggers(["csv", "neptune"])
    assert "neptune" in str(e.value) and "csv" in str(e.value) and "\n" not in str(e.value)


def test_disabled_context_builds_nothing_and_imports_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.LOGGERS, "broken", "no_such_package_here:Factory")
    assert build_loggers(["broken"], LoggerContext(tmp_path, enabled=False)) == []
    with pytest.raises(LoggerError, match="cannot import no_such_package_here"):
        build_loggers(["broken"], LoggerContext(tmp_path, enabled=True))


def test_flag_is_repeatable_and_takes_lists():
    parser = argparse.ArgumentParser()
    registry.add_logger_flags(parser)
    assert parser.parse_args([]).loggers is None
    assert parser.parse_args(["--loggers", "csv", "--loggers", "tensorboard", "csv"]).loggers == \
        ["csv", "tensorboard", "csv"]
