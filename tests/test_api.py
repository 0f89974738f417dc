"""The Python API (utils/api.py): ``train.run``, ``test.run``, ``val.run``, ``detect.run`` and ``export.run`` take
every option of their script's parser under the command line's names, refuse others with a UserError naming the
closest one, and return real values on the tiny model and data."""

from __future__ import annotations

import argparse
import csv
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import detect
import export
import train
import val
from tests.helpers import load_script
from utils.api import OptionError, option_names, to_argv
from utils.errors import UserError
from utils.hooks import HookBase

test_script = load_script("test")
SCRIPTS = {"train": train, "test": test_script, "val": val, "detect": detect, "export": export}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def parser_of(name: str) -> argparse.ArgumentParser:
    return test_script.build_parser(name) if name in ("test", "val") else SCRIPTS[name].build_parser()


def sample(action: argparse.Action) -> tuple[Any, list[str]]:
    """A value for an option that is not its default, as a keyword value and as command-line words."""
    if action.nargs == 0:
        return True, []
    if action.choices:
        value = str([c for c in action.choices if c != action.default][-1])
    elif action.type is int:
        value = str(action.default + 1) if isinstance(action.default, int) else "3"
    elif action.type is float:
        value = str(action.default / 2 if action.default >= 1 else action.default + 0.25) \
            if isinstance(action.default, float) else "0.5"  # within range: a share (--fraction 1.0) too
    else:  # a path or name; "3" for a custom type (--tracker-timeout's seconds)
        value = "x.yaml" if action.type in (None, str) else "3"
    count = action.nargs if isinstance(action.nargs, int) else 1
    typed = action.type(value) if action.type in (int, float) else value
    keyword = [typed] * count if count > 1 else typed
    return keyword, [value] * count


def cases() -> list[tuple[str, str]]:
    """Every option of every script, but the process count (several processes: tests/test_api_ddp.py)."""
    return [(script, name) for script in SCRIPTS for name in option_names(parser_of(script))
            if name not in ("nproc_per_node", "nproc-per-node")]


@pytest.mark.parametrize("script, name", cases())
def test_every_option_of_the_parser_is_a_keyword_of_run(script: str, name: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``run(name=value)`` reaches main() with the options ``script.py --flag value`` parses to."""
    module = SCRIPTS[script]
    action = option_names(parser_of(script))[name]
    keyword, words = sample(action)
    flag = next(s for s in action.option_strings if s.startswith("--"))
    captured = []
    target = test_script if script == "val" else module
    monkeypatch.setattr(target, "main", lambda opt, *args, **kwargs: captured.append(opt) or [])
    module.run(**{name: keyword})
    cli = (test_script.parse_opt([flag, *words], script=script) if script in ("test", "val")
           else module.parse_opt([flag, *words]))
    assert vars(captured[0]) == vars(cli)
    assert getattr(captured[0], action.dest) != action.default


def test_every_dest_and_every_long_flag_is_a_keyword() -> None:
    for script in SCRIPTS:
        parser = parser_of(script)
        names = set(option_names(parser))
        assert {a.dest for a in parser._actions if a.option_strings and a.dest != "help"} <= names, script
        assert {"img_size", "imgsz", "img", "weights", "device"} <= names, script
    assert {"local_rank", "bbox_interval", "tracker_timeout", "ddp_timeout"} <= set(option_names(train.build_parser()))
    assert {"dnn", "refused_dnn"} <= set(option_names(detect.build_parser()))


@pytest.mark.parametrize("script, typo, meant", [("train", "epoch", "epochs"), ("test", "weight", "weights"),
                                                 ("val", "conf_thresh", "conf_thres"),
                                                 ("detect", "sauce", "source"), ("export", "includes", "include")])
def test_an_unknown_keyword_is_a_user_error_naming_the_close_match(script: str, typo: str, meant: str) -> None:
    with pytest.raises(UserError, match=rf"unknown option '{typo}'; did you mean '{meant}'\?"):
        SCRIPTS[script].run(**{typo: 1})


def test_a_keyword_nothing_resembles_points_at_help() -> None:
    with pytest.raises(OptionError, match=r"unknown option 'zzzz'; see python train.py --help"):
        train.run(zzzz=1)


def test_bad_values_are_the_command_lines_errors() -> None:
    with pytest.raises(OptionError, match=r"^argument --epochs: invalid int value: 'many'$"):
        train.run(epochs="many")
    with pytest.raises(OptionError, match=r"argument --amp: invalid choice: 'sometimes'"):
        train.run(amp="sometimes")
    with pytest.raises(OptionError, match=r"--img-size takes one value here"):
        train.run(img_size=[64, 96])
    with pytest.raises(OptionError, match=r"noval takes True or False"):
        train.run(noval="yes")
    with pytest.raises(OptionError, match=r"'img' and 'img_size' are the same option"):
        detect.run(img=64, img_size=64)


def test_values_keep_their_meaning_in_argv() -> None:
    parser = train.build_parser()
    assert to_argv(parser, {"resume": True, "cache": "disk", "evolve": 0, "name": "-odd", "hook": ["a:B", "c:D"],
                            "freeze": [1, 2], "project": None}, "train") == [
        "--resume", "--cache=disk", "--evolve=0", "--name=-odd", "--hook", "a:B", "--hook", "c:D", "--freeze", "1",
        "2"]
    assert train.parse_opt(to_argv(parser, {"name": "-odd", "weights": ""}, "train")).name == "-odd"


def results_row(save_dir: Path) -> dict[str, float]:
    rows = list(csv.DictReader((save_dir / "results.csv").open()))
    return {key.strip(): float(value) for key, value in rows[-1].items()}


def tiny_train(tiny_dataset: Path, tiny_cfg_file: Path, project: Path) -> dict[str, Any]:
    return dict(data=tiny_dataset, cfg=tiny_cfg_file, img=64, epochs=1, batch_size=8, workers=0, device="cpu",
                project=project, noplots=True, noautoanchor=True)


class EpochRecorder(HookBase):
    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def after_epoch(self, trainer: object, epoch: int, metrics: dict[str, float]) -> None:
        self.rows.append(dict(metrics))


def test_train_run_returns_the_final_metrics_and_the_run_folder(tiny_dataset: Path, tiny_cfg_file: Path,
                                                                tmp_path: Path) -> None:
    recorder = EpochRecorder()
    result = train.run(**tiny_train(tiny_dataset, tiny_cfg_file, tmp_path), hooks=[recorder])
    assert len(recorder.rows) == 1 and recorder.rows[0]["metrics/mAP_0.5"] == pytest.approx(result.metrics["mAP_0.5"])
    assert result.save_dir == tmp_path / "exp" and (result.save_dir / "weights" / "last.pt").is_file()
    assert list(result.metrics) == ["precision", "recall", "mAP_0.5", "mAP_0.5:0.95"]
    row = results_row(result.save_dir)
    assert [result.metrics[k] for k in result.metrics] == pytest.approx(
        [row[f"metrics/{k}"] for k in result.metrics], abs=1e-5)
    # what the run trained with: --optimizer auto's AdamW and its lr0 for 3 classes, not the file's SGD lr0 0.01
    assert (result.hyp["optimizer"], result.hyp["lr0"]) == ("AdamW", 0.001429)
    assert result.hyp == yaml.safe_load((result.save_dir / "hyp.yaml").read_text())


def test_train_run_with_evolve_returns_the_fittest_generation(tiny_dataset: Path, tiny_cfg_file: Path,
                                                               tmp_path: Path) -> None:
    result = train.run(**tiny_train(tiny_dataset, tiny_cfg_file, tmp_path), evolve=2)
    rows = list(csv.DictReader((tmp_path / "exp-evolve" / "evolve.csv").open()))
    best = max(rows, key=lambda row: float(row["fitness"]))
    assert result.save_dir == tmp_path / "exp-evolve" / f"gen{rows.index(best)}"
    assert result.metrics["mAP_0.5"] == pytest.approx(float(best["mAP_0.5"]), rel=1e-4, abs=1e-9)
    assert result.hyp["lr0"] == pytest.approx(float(best["lr0"]), rel=1e-4)


def test_test_val_detect_and_export_return_what_they_made(tiny_dataset: Path, tiny_weights: Path,
                                                          tmp_path: Path) -> None:
    common = dict(weights=tiny_weights, data=tiny_dataset, img=64, batch_size=8, workers=0, device="cpu")
    tested = test_script.run(**common, project=tmp_path / "test")
    validated = val.run(**common, project=tmp_path / "val")
    assert tested.seen == validated.seen == 12 and tested.n_labels > 0
    assert tested.results() == validated.results()
    assert (tmp_path / "test" / "exp").is_dir() and (tmp_path / "val" / "exp").is_dir()

    images = tmp_path / "images"
    images.mkdir()
    sources = sorted((Path(str(tiny_dataset)).parent / "synthetic" / "images" / "val").glob("*"))[:2]
    for image in sources:
        shutil.copy(image, images / image.name)
    found = detect.run(weights=tiny_weights, source=images, img=64, conf_thres=0.001, max_det=5, save_txt=True,
                       save_conf=True, nosave=True, device="cpu", project=tmp_path / "detect")
    assert len(found.detections) == 2
    for (_, det), image in zip(found.detections, sorted(images.iterdir())):
        assert det.shape[1] == 6 and 0 < len(det) <= 5
        rows = np.loadtxt(found.save_dir / "labels" / f"{image.stem}.txt", ndmin=2)
        assert len(rows) == len(det) and rows[:, 5] == pytest.approx(det[:, 4], abs=1e-5)

    weights = tmp_path / "weights" / "best.pt"
    weights.parent.mkdir()
    shutil.copy(tiny_weights, weights)
    files = export.run(weights=weights, include=["onnx"], img=64)
    assert files == [weights.with_suffix(".onnx")] and files[0].stat().st_size > 0
    with pytest.raises(UserError, match="--int8 calibrates on images"):
        export.run(weights=weights, include=["onnx"], int8=True)


def test_the_error_a_launched_job_raises_is_the_one_the_command_line_prints() -> None:
    """Rank by rank: a UserError first (lowest rank), else the one line of a lost peer, else a stop; each survives
    the pickling that brings it back from its process."""
    import pickle
    import signal

    from utils.api import RankOutcome, first_error, outcome
    from utils.cli import PeerLost
    from utils.distributed.signals import StopRequested

    def failing(error: BaseException) -> RankOutcome:
        def work() -> None:
            raise error
        return pickle.loads(pickle.dumps(outcome(work)))

    stop = failing(StopRequested(signal.SIGTERM, "stopped by SIGTERM"))
    assert isinstance(stop.error, StopRequested) and stop.error.exit_code == 143
    quiet, named = failing(PeerLost("")), failing(PeerLost("rank 1 is not responding"))
    user = failing(OptionError("bad"))
    assert first_error({0: quiet, 1: named, 2: stop}).line == "rank 1 is not responding"
    assert first_error({0: stop, 1: user, 2: named}) is not None and str(first_error({0: stop, 1: user})) == "bad"
    assert first_error({0: stop}).signum == signal.SIGTERM
    assert first_error({0: outcome(lambda: 7), 1: outcome(lambda: 8)}) is None
    with pytest.raises(RuntimeError):
        outcome(lambda: (_ for _ in ()).throw(RuntimeError("a crash is not kept")))
