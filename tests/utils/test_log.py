"""Logging set up once per process: rank 0 talks; other ranks only report errors, tagged with their rank."""

from __future__ import annotations

import logging

import pytest

from utils.log import LOGGER, colorstr, format_options, setup_logging


def test_rank0_logs_info_and_other_ranks_only_errors(capsys: pytest.CaptureFixture) -> None:
    setup_logging(0)
    LOGGER.info("hello from rank 0")
    assert capsys.readouterr().out == "hello from rank 0\n"
    setup_logging(3)
    LOGGER.info("quiet")
    LOGGER.warning("also quiet")
    LOGGER.error("broken")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "[rank 3] broken\n"
    assert LOGGER.level == logging.ERROR


def test_colour_only_on_a_terminal_and_options_formatting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    assert colorstr("bold", "x") == "x" and colorstr("plain") == "plain"
    assert format_options({"a": 1, "b": "c"}) == "a=1, b=c"


def test_options_are_printed_given_first_then_defaults_wrapped(yolo_log: list[str]) -> None:
    from utils.log import print_options, wrap_options

    options = {f"option_{i}": "x" * 12 for i in range(20)} | {"epochs": 3}
    defaults = {f"option_{i}": "x" * 12 for i in range(20)} | {"epochs": 18}
    print_options("train", options, defaults)
    lines = yolo_log[-1].splitlines()
    assert lines[0] == "train: epochs=3"
    assert lines[1].startswith("  defaults: option_0=xxxxxxxxxxxx, option_1=") and len(lines) > 3
    assert all(len(line) <= 120 for line in lines) and all(line.startswith(" " * 12) for line in lines[2:])
    assert "".join(lines[1:]).count("option_") == 20
    assert wrap_options("t:", {"a": 1, "b": 2}) == ["t: a=1, b=2"]
    assert wrap_options("t:", {"a": "y" * 200, "b": 2}, width=40) == ["t: a=" + "y" * 200 + ",", "   b=2"]
