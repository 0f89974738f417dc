"""What the scripts share: one definition of every shared flag, one-line errors and exit codes, flag tables."""

from __future__ import annotations

import argparse

import pytest

from utils.cli import FLAGS, PeerLost, add_flags, flag_table, run_main, square_size
from utils.distributed.signals import StopRequested
from utils.errors import UserError


def test_shared_flags_take_per_script_defaults_but_one_definition() -> None:
    validation, detection = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_flags(validation, "conf_thres", "img_size")
    add_flags(detection, "conf_thres", "img_size", conf_thres=0.25)
    assert validation.parse_args([]).conf_thres == 0.001 and detection.parse_args([]).conf_thres == 0.25
    assert validation.parse_args(["--imgsz", "320", "256"]).img_size == [320, 256]
    help_text = {a.dest: a.help for p in (validation, detection) for a in p._actions if a.dest == "conf_thres"}
    assert help_text == {"conf_thres": FLAGS["conf_thres"][1]["help"]}


def test_square_size_refuses_two_values() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, "img_size")
    assert square_size(parser, parser.parse_args(["--img", "96"])).img_size == 96
    with pytest.raises(SystemExit):
        square_size(parser, parser.parse_args(["--img", "96", "64"]))


def test_run_main_turns_errors_and_stops_into_one_line_and_an_exit_code(capsys: pytest.CaptureFixture) -> None:
    def raising(error: BaseException):  # noqa: ANN202
        def main(opt: object) -> None:
            raise error
        return main

    assert run_main(raising(UserError("bad input")), None, "x") == 2
    assert capsys.readouterr().err == "x: error: bad input\n"
    assert run_main(raising(StopRequested(15, "stopped by SIGTERM at epoch 1, batch 2")), None, "x") == 143
    assert capsys.readouterr().err == "x: stopped by SIGTERM at epoch 1, batch 2\n"
    assert run_main(raising(PeerLost("rank 0 lost its peers")), None, "x") == 3
    assert capsys.readouterr().err == "x: error: rank 0 lost its peers\n"
    assert run_main(raising(PeerLost("")), None, "x") == 3 and capsys.readouterr().err == ""  # a quiet rank
    assert run_main(lambda opt: None, None, "x") == 0


def test_flag_table_rows() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flag", action="store_true", help="a | b")
    parser.add_argument("--pick", default="a", choices=["a", "b"], help="one")
    assert flag_table(parser).splitlines()[2:] == ["| `--flag` | `off` | a \\| b |",
                                                   "| `--pick` | `a` | one; one of `a`, `b` |"]


def test_a_rank_whose_peer_is_gone_ignores_the_launchers_sigterm_from_then_on(monkeypatch) -> None:
    """peer_lost: the line for a collective that lost its peers, and SIGTERM ignored so the teardown that follows
    ends with that line, from before the line reads the other ranks' marks (a full-suite run saw torchrun's SIGTERM
    end the live rank while it read them); any other error changes nothing."""
    import signal

    from utils import cli

    class Watch:  # the job's watch (utils.distributed.watchdog): what SIGTERM does while it reads the marks
        during: list = []

        def peer_failure(self, error: BaseException) -> str:
            self.during.append(signal.getsignal(signal.SIGTERM))
            return "rank 0 lost its peers during a collective"

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        monkeypatch.setattr(cli.dist._STATE, "watch", Watch())
        assert cli.peer_lost(RuntimeError("another error")) is None
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and Watch.during == []
        lost = cli.peer_lost(RuntimeError("Connection closed by peer"))
        assert isinstance(lost, PeerLost) and lost.line == "rank 0 lost its peers during a collective"
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        assert Watch.during == [signal.SIG_IGN]  # ignored before the marks were read: a SIGTERM then is no exit
    finally:
        signal.signal(signal.SIGTERM, previous)
