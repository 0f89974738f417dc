"""Resuming: the generation of last.pt a resume reads (the previous one when last.pt is damaged), and the options
a resumed run keeps."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from utils.training.config import RunConfig
from utils.training.resume import (
    RUNTIME_OPTIONS,
    TRAIN_STATE_VERSION,
    ResumeError,
    load_resumable,
    resume_options,
)
from utils.weights.checkpoint import FORMAT, save_checkpoint


def write(path: Path, epoch: int, train_state: bool = True) -> Path:
    state = {"train_state": {"version": TRAIN_STATE_VERSION}} if train_state else {}
    return save_checkpoint({"format": FORMAT, "model": {}, "model_yaml": {}, "epoch": epoch, **state}, path)


def test_a_damaged_last_pt_falls_back_to_the_previous_generation_with_one_warning(tmp_path: Path, caplog) -> None:
    last, previous = tmp_path / "last.pt", tmp_path / "last.prev.pt"
    write(last, 2), write(previous, 1)
    assert load_resumable(last)[1]["epoch"] == 2
    last.write_bytes(last.read_bytes()[:100])  # truncated
    with caplog.at_level(logging.WARNING, logger="yolo"):
        path, ckpt = load_resumable(last)
    assert (path, ckpt["epoch"]) == (previous, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "resuming from the previous generation" in warnings[0], warnings
    write(last, 3, train_state=False)  # whole, but stripped: not resumable either
    assert load_resumable(last)[0] == previous


def test_no_resumable_generation_is_one_error_naming_the_reasons(tmp_path: Path) -> None:
    last = tmp_path / "last.pt"
    write(last, 2).write_bytes(b"not a checkpoint")
    with pytest.raises(ResumeError, match="no checkpoint to resume from"):
        load_resumable(last)
    best = write(tmp_path / "best.pt", 2, train_state=False)
    with pytest.raises(ResumeError, match="has no training state"):
        load_resumable(best)  # best.pt is never resumed: it has no training state


def test_resume_options_keep_runtime_flags() -> None:
    defaults = RunConfig(extra={"new_flag": 1})
    current = RunConfig(epochs=10, batch_size=8, device="", workers=0, resume="x.pt", extra={"new_flag": 1})
    saved = {"epochs": 3, "batch_size": 16, "device": "0", "workers": 2, "gone": 1}
    merged = resume_options(current, saved, defaults)
    # the machine's device is never taken from the checkpoint; workers only when given on the command line
    assert (merged.epochs, merged.batch_size, merged.device, merged.workers, merged.resume) == (3, 16, "", 0, "x.pt")
    assert merged.extra == {"new_flag": 1} and "gone" not in merged.options()  # options added since keep theirs
    assert resume_options(current.replace(workers=8), saved, defaults).workers == 2  # not given: the checkpoint's
    assert RUNTIME_OPTIONS["device"] and not RUNTIME_OPTIONS["workers"]


def test_options_the_run_overrides_are_named_in_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    defaults = RunConfig(epochs=100, batch_size=16, img_size=640)
    saved = {"epochs": 30, "batch_size": 16, "img_size": 320, "workers": 2}
    given = RunConfig(epochs=4, batch_size=16, img_size=320, workers=0, resume="x.pt")  # --epochs 4 --img 320 ...
    with caplog.at_level(logging.WARNING, logger="yolo"):
        merged = resume_options(given, saved, defaults)
    assert (merged.epochs, merged.img_size, merged.workers) == (30, 320, 0)  # the run's epochs; workers: runtime
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["WARNING: --resume continues the run with the options it started with; ignored: --epochs 4 "
                        "(the run's: 30)"]  # not --img-size (the run's value), not --workers (kept)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="yolo"):
        resume_options(defaults.replace(resume="x.pt"), saved, defaults)  # nothing given: nothing to say
        resume_options(given.replace(epochs=30), saved, defaults)  # a requeued job's command: the same values
    assert not caplog.records


def test_a_resume_takes_the_tracker_deadline_it_is_given() -> None:
    defaults = RunConfig(extra={"tracker_timeout": 10.0})
    saved = {"tracker_timeout": 120.0}
    assert resume_options(defaults, saved, defaults).extra["tracker_timeout"] == 120.0  # not given: the run's own
    given = RunConfig(extra={"tracker_timeout": 30.0})
    assert resume_options(given, saved, defaults).extra["tracker_timeout"] == 30.0
