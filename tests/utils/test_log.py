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
