"""utils/compat/ultralytics.py: ultralytics' key=value words and --model become the script's flags; a key the
script does not take is one line naming the nearest; the parsers take no abbreviations."""

from __future__ import annotations

import argparse

import pytest

import detect
import export
import train
from tests.helpers import load_script
from utils.cli import Parser, add_flags
from utils.compat.ultralytics import HYP, KEYS, SpellingError, key_table, nearest, translate

test_script = load_script("test")
PARSERS = {"train.py": train.build_parser(), "test.py": test_script.build_parser(), "val.py":
           test_script.build_parser("val"), "detect.py": detect.build_parser(), "export.py": export.build_parser()}


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_every_key_names_a_flag_some_script_has() -> None:
    every = set().union(*(flags(p) for p in PARSERS.values()))
    assert {rule.flag for rule in KEYS.values()} <= every
    assert {"model", "data", "epochs", "imgsz", "batch", "device", "workers", "project", "name", "exist_ok", "resume",
            "patience", "optimizer", "lr0", "lrf", "cos_lr", "cache", "rect", "single_cls", "fraction",
            "close_mosaic", "freeze", "seed", "conf", "iou", "max_det", "source", "save_txt", "format", "half", "int8",
            "dynamic", "simplify", "opset", "hsv_h", "fliplr", "mosaic", "mixup"} <= set(KEYS)


@pytest.mark.parametrize("words, expected", [
    (["model=yolo11n.pt", "imgsz=640", "batch=16"], ["--weights", "yolo11n.pt", "--img-size", "640",
                                                     "--batch-size=16"]),
    (["model=yolo11n.yaml"], ["--cfg", "yolo11n.yaml"]),
    (["--model", "yolo11n.yaml"], ["--cfg", "yolo11n.yaml"]),
    (["--model=best.pt"], ["--weights", "best.pt"]),
    (["device=[0, 1]"], ["--device=0,1"]),
    (["imgsz=640,480"], ["--img-size", "640", "480"]),
    (["rect=True", "cos_lr=false", "val=False", "plots=True"], ["--rect", "--noval"]),
    (["cache=True", "resume=last.pt"], ["--cache", "--resume", "last.pt"]),
    (["cache=disk"], ["--cache", "disk"]),
    (["amp=False"], ["--amp", "off"]),
    (["lr0=0.002", "fliplr=0"], ["--hyp-set", "lr0=0.002", "--hyp-set", "fliplr=0"]),
    (["model=runs/x/last.pt", "resume=True"], ["--resume", "runs/x/last.pt"]),
    (["batch_size=4", "noval=True", "img=96"], ["--batch-size=4", "--noval", "--img-size", "96"]),
    (["--name", "a=b", "epochs=3"], ["--name", "a=b", "--epochs=3"]),  # a flag's value stays a value
    (["--", "model=x"], ["--", "model=x"]),
])
def test_train_words_become_flags(words: list[str], expected: list[str]) -> None:
    assert translate(words, PARSERS["train.py"]) == expected


def test_words_and_flags_parse_to_the_same_options() -> None:
    words = train.parse_opt(["model=a.pt", "data=d.yaml", "epochs=3", "imgsz=64", "batch=8", "device=cpu",
                             "workers=0", "patience=5", "optimizer=SGD", "seed=3", "freeze=0,1", "lr0=0.02",
                             "fraction=0.5", "single_cls=True", "exist_ok=True", "name=run"])
    flags_ = train.parse_opt(["--weights", "a.pt", "--data", "d.yaml", "--epochs", "3", "--img", "64", "--batch", "8",
                              "--device", "cpu", "--workers", "0", "--patience", "5", "--optimizer", "SGD", "--seed",
                              "3", "--freeze", "0", "1", "--hyp-set", "lr0=0.02", "--fraction", "0.5", "--single-cls",
                              "--exist-ok", "--name", "run"])
    assert vars(words) == vars(flags_)
    assert vars(detect.parse_opt(["model=b.pt", "source=img", "conf=0.3", "iou=0.5", "max_det=9", "save_txt=True"])) \
        == vars(detect.parse_opt(["--weights", "b.pt", "--source", "img", "--conf-thres", "0.3", "--iou-thres", "0.5",
                                  "--max-det", "9", "--save-txt"]))
    assert vars(export.parse_opt(["model=b.pt", "format=onnx,openvino", "dynamic=True", "half=True", "opset=13"])) \
        == vars(export.parse_opt(["--weights", "b.pt", "--include", "onnx", "openvino", "--dynamic", "--half",
                                  "--opset", "13"]))


def error_line(parser: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err  # one line, no usage text
    return err.strip()


def test_a_mistyped_key_or_flag_gets_one_line_naming_the_nearest(capsys: pytest.CaptureFixture) -> None:
    parser = PARSERS["train.py"]
    assert error_line(parser, ["imgsize=640"], capsys) == \
        "train.py: error: imgsize=640: unknown key 'imgsize'; did you mean img_size=, imgsz=?"
    assert error_line(parser, ["--epoch", "3"], capsys) == \
        "train.py: error: unrecognized arguments: --epoch 3; did you mean --epochs?"
    assert error_line(parser, ["source=images"], capsys).startswith(
        "train.py: error: source=images: train.py has no --source, which source= means")
    assert error_line(PARSERS["detect.py"], ["lr0=0.1"], capsys).startswith(
        "detect.py: error: lr0=0.1: detect.py has no --hyp-set")
    assert error_line(PARSERS["export.py"], ["model=x.yaml"], capsys).startswith(
        "export.py: error: model=x.yaml: export.py has no --cfg")
    assert error_line(parser, ["rect=maybe"], capsys) == "train.py: error: rect=maybe: give True or False"
    assert error_line(parser, ["--epochs", "many"], capsys) == \
        "train.py: error: argument --epochs: invalid int value: 'many'"


def test_no_abbreviation_a_new_flag_could_make_ambiguous(capsys: pytest.CaptureFixture) -> None:
    """--batch is an alias of --batch-size, not a prefix: a flag --batch-scaling beside it changes nothing."""
    parser = Parser(prog="x.py")
    add_flags(parser, "batch_size")
    parser.add_argument("--batch-scaling", action="store_true")
    parser.add_argument("--epochs", type=int)
    assert parser.parse_args(["--batch", "8"]).batch_size == 8
    assert "did you mean --epochs" in error_line(parser, ["--epo", "3"], capsys)


def test_nearest_keeps_the_close_ones() -> None:
    assert nearest("epoch", ["epochs", "patience", "rect"]) == ["epochs"]
    assert nearest("zzz", ["epochs"]) == []


def test_the_key_table_names_every_key_once() -> None:
    table = key_table()
    rows = table.splitlines()[2:]
    assert len(rows) == len([k for k, r in KEYS.items() if r.kind != HYP]) + 1
    assert "| `model` | `--weights` for a `.pt`" in table and "`--hyp-set KEY=VALUE`" in rows[-1]


def test_a_spelling_error_is_a_user_error() -> None:
    from utils.errors import UserError

    with pytest.raises(SpellingError):
        translate(["nokey=1"], PARSERS["train.py"])
    assert issubclass(SpellingError, UserError)
