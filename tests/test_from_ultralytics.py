"""docs/from-ultralytics.md: every row of its side-by-side table runs here (on the tiny data and model at 64 px),
the words and the flags of a row are the same options, and its key table is utils/compat/ultralytics.py's. Also the
command lines YOLOv5's README, tutorial and CI type, parsed verbatim."""

from __future__ import annotations

import ast
import csv
import re
import shlex
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

import detect
import export
import train
import val
from tests.helpers import ROOT, load_script, one_thread_and_logger_kept
from utils import api
from utils.compat.ultralytics import key_table
from utils.hooks import HookBase

PAGE = ROOT / "docs" / "from-ultralytics.md"
test_script = load_script("test")
SCRIPTS = {"train.py": train, "val.py": val, "test.py": test_script, "detect.py": detect, "export.py": export}


def table_rows() -> list[tuple[str, str, str]]:
    """(ultralytics, the same words here, this project's flags) of the side-by-side table."""
    section = PAGE.read_text().split("## Side by side", 1)[1].split("\n## ", 1)[0]
    rows = [re.findall(r"`([^`]+)`", line) for line in section.splitlines() if line.startswith("| `")]
    assert rows and all(len(cells) == 3 for cells in rows), rows
    return [tuple(cells) for cells in rows]


def test_the_key_table_is_the_one_in_utils_compat_ultralytics() -> None:
    marker = "<!-- the table below is utils/compat/ultralytics.py's KEYS"
    assert PAGE.read_text().split(marker, 1)[1].split("\n", 1)[1].strip() == key_table()


def python_call(text: str) -> tuple[str, dict[str, Any]]:
    """``train.run(a=1, ...)`` -> ('train', {'a': 1, ...})."""
    call = ast.parse(text).body[0].value
    return call.func.value.id, {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def options(command: str) -> dict[str, Any]:
    """The options a row's command parses to (a script's command line, or a Python call's keywords)."""
    if command.startswith("python "):
        script, *argv = shlex.split(command)[1:]
        return vars(SCRIPTS[script].parse_opt(argv))
    name, kwargs = python_call(command)
    module = SCRIPTS[f"{name}.py"]
    return vars(api.parse(module.parse_opt, api.to_argv(module.build_parser(), kwargs, name), name))


def test_the_words_and_the_flags_of_each_row_are_the_same_options() -> None:
    for theirs, words, flags in table_rows():
        assert options(words) == options(flags), theirs


class TrainedImages(HookBase):
    """Records how many images the run trains on (for fraction=)."""

    def before_train(self, trainer: Any) -> None:
        self.images = len(trainer.train_loader.dataset)


def tiny(words: list[str], data: Path, cfg: Path, weights: Path, tmp: Path) -> list[str]:
    """A row's words on the tiny data, model and sizes, writing into ``tmp`` (run folders, sources)."""
    runs = tmp / "runs"
    values = {"data": str(data), "epochs": "1", "imgsz": "64", "batch": "8", "device": "cpu"}
    out = []
    for word in words:
        key, _, value = word.partition("=")
        if key == "model":
            value = str(cfg) if value.endswith(".yaml") else str(weights) if value == "yolo11n.pt" else \
                str(runs / "exp" / "weights" / Path(value).name)
        if key == "source":
            value = str(tmp / ("video.mp4" if value.endswith(".mp4") else "images"))
        out.append(f"{key}={values.get(key, value)}" if "=" in word else word)
    return out


def run_row(words: str, data: Path, cfg: Path, weights: Path, tmp: Path, capsys: pytest.CaptureFixture) -> Any:
    script, *argv = shlex.split(words)[1:]
    argv = tiny(argv, data, cfg, weights, tmp)
    if script == "train.py":
        hook = TrainedImages()
        argv += ["workers=0", "plots=False", "noautoanchor=True", f"project={tmp / 'runs'}"]
        result = train.main(train.parse_opt(argv), [hook])
        return result, getattr(hook, "images", None), capsys.readouterr().out
    project = {"val.py": "val", "detect.py": "detect"}.get(script)
    argv += [f"project={tmp / project}", "workers=0"] if project == "val" else [f"project={tmp / project}"] \
        if project else []
    return SCRIPTS[script].main(SCRIPTS[script].parse_opt(argv)), None, capsys.readouterr().out


@pytest.mark.slow
def test_every_row_of_the_table_runs(tiny_dataset: Path, tiny_cfg_file: Path, tiny_weights: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the table's order: the trainings write runs/exp, exp2, ...; resume finds exp finished; val, predict, track
    and export take exp's best.pt. ``device=0,1`` is two processes where there are two GPUs (decided here with two
    GPUs counted) and runs in one on this CPU."""
    from tests.helpers import write_video

    (tmp_path / "images").mkdir()
    for i in range(2):
        cv2.imwrite(str(tmp_path / "images" / f"{i}.png"), np.full((48, 64, 3), 60 * i, np.uint8))
    write_video(tmp_path / "video.mp4", [np.full((48, 64, 3), 40 * i, np.uint8) for i in range(4)])
    rows = {theirs.split()[0] + " " + theirs.split()[1] if theirs.startswith("yolo ") else "python": words
            for theirs, words, _ in table_rows()}
    trains = [words for theirs, words, _ in table_rows() if theirs.startswith("yolo train") and "resume" not in theirs]
    assert "device=0,1" in trains[2]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert api.processes(train.parse_opt(shlex.split(trains[2])[2:])) == 2
    monkeypatch.undo()
    with one_thread_and_logger_kept():
        images = []
        for words in trains:
            result, count, _ = run_row(words, tiny_dataset, tiny_cfg_file, tiny_weights, tmp_path, capsys)
            assert set(result.metrics) >= {"mAP_0.5", "mAP_0.5:0.95"}, words
            images.append(count)
        assert images == [24, 24, 24, 12]  # fraction=0.5
        assert (tmp_path / "runs" / "exp4" / "hyp.yaml").read_text().count("lr0: 0.002") == 1
        resume = [words for theirs, words, _ in table_rows() if "resume" in theirs][0]
        result, _, out = run_row(resume, tiny_dataset, tiny_cfg_file, tiny_weights, tmp_path, capsys)
        last = list(csv.DictReader((tmp_path / "runs" / "exp" / "results.csv").open()))[-1]
        assert f"{tmp_path / 'runs' / 'exp'} is finished: it trained all 1 epochs; best epoch 0: mAP@.5" in out
        assert result.metrics["mAP_0.5"] == pytest.approx(float(last["metrics/mAP_0.5"]))
        assert not (tmp_path / "runs" / "exp5").exists()  # nothing trained, no new folder
        evaluated, _, _ = run_row(rows["yolo val"], tiny_dataset, tiny_cfg_file, tiny_weights, tmp_path, capsys)
        assert evaluated.seen == 12
        found, _, _ = run_row(rows["yolo predict"], tiny_dataset, tiny_cfg_file, tiny_weights, tmp_path, capsys)
        assert len(found.detections) == 2 and found.save_dir == tmp_path / "detect" / "exp"
        tracked, _, _ = run_row(rows["yolo track"], tiny_dataset, tiny_cfg_file, tiny_weights, tmp_path, capsys)
        assert len(tracked.track_ids) == 4 and len(tracked.mot_files) == 1  # a track ID column per frame
        exported, _, _ = run_row(rows["yolo export"], tiny_dataset, tiny_cfg_file, tiny_weights, tmp_path, capsys)
        assert [r.file.suffix for r in exported] == [".onnx"] and exported[0].error is None
        name, kwargs = python_call(rows["python"])
        assert name == "train" and set(kwargs) == {"model", "data", "epochs", "imgsz"}
        kwargs.update(model=str(tiny_weights), data=str(tiny_dataset), epochs=1, imgsz=64)
        result = train.run(**kwargs, workers=0, noplots=True, noautoanchor=True, project=tmp_path / "runs")
        assert result.save_dir == tmp_path / "runs" / "exp5" and (result.save_dir / "weights" / "best.pt").is_file()


# YOLOv5's own command lines (v6-v7 README, tutorial.ipynb, CI), verbatim but for {x}/$m filled in.
YOLOV5_LINES = [
    ("python train.py --img 640 --batch 16 --epochs 3 --data coco128.yaml --weights yolov5s.pt --cache",
     {"img_size": 640, "batch_size": 16, "epochs": 3, "weights": "yolov5s.pt", "cache": "ram"}),
    ("python train.py --img 64 --batch 32 --weights yolov5n.pt --cfg yolov5n.yaml --epochs 1 --device cpu",
     {"img_size": 64, "batch_size": 32, "cfg": "yolov5n.yaml", "device": "cpu"}),
    ("python train.py --img 64 --batch 32 --weights '' --cfg yolov5n.yaml --epochs 1 --device 0",
     {"weights": "", "device": "0"}),
    ("python train.py --data coco.yaml --epochs 300 --weights '' --cfg yolov5n.yaml  --batch-size 128",
     {"batch_size": 128, "epochs": 300}),
    ("python train.py --img 640 --batch 64 --epochs 100 --data coco128.yaml --weights yolov5s.pt --cache "
     "--noautoanchor --evolve", {"evolve": 300, "noautoanchor": True}),
    ("python train.py --batch 64 --weights yolov5s.pt --data VOC.yaml --epochs 50 --cache --img 512 --nosave "
     "--hyp hyp.VOC.yaml --project VOC --name yolov5s", {"nosave": True, "hyp": "hyp.VOC.yaml", "name": "yolov5s"}),
    ("python train.py --batch 64 --data coco.yaml --weights yolov5s.pt --device 0,1 --local_rank=0",
     {"local_rank": 0, "device": "0,1"}),
    ("python train.py --batch 64 --data coco.yaml --cfg yolov5s.yaml --weights '' --sync-bn --local-rank=1",
     {"sync_bn": True, "local_rank": 1}),
    ("python train.py --resume", {"resume": True}),
    ("python train.py --img 640 --batch 16 --epochs 3 --data coco128.yaml --weights yolov5s.pt --linear-lr",
     {"cos_lr": False}),
    ("python train.py --freeze 10 --single-cls --rect --noval --exist-ok --workers 2 --adam",
     {"freeze": [10], "single_cls": True, "rect": True, "noval": True, "exist_ok": True, "optimizer": "Adam"}),
    ("python val.py --weights yolov5x.pt --data coco.yaml --img 640 --iou 0.65 --half",
     {"img_size": 640, "iou_thres": 0.65, "half": True}),
    ("python val.py --weights yolov5s.pt --data coco.yaml --img 640 --conf 0.001 --iou 0.65",
     {"conf_thres": 0.001, "iou_thres": 0.65}),
    ("python val.py --weights yolov5s.pt --data coco.yaml --img 640 --task speed", {"task": "speed"}),
    ("python val.py --weights yolov5x.pt --data coco.yaml --img 832 --augment --half --task test",
     {"augment": True, "task": "test", "img_size": 832}),
    ("python val.py --weights best.pt --data coco.yaml --batch 1 --save-txt --save-conf --save-json --verbose",
     {"batch_size": 1, "save_txt": True, "save_conf": True, "save_json": True, "verbose": True}),
    ("python test.py --img 128 --batch 16 --weights yolov5s.pt --device cpu", {"img_size": 128, "batch_size": 16}),
    ("python detect.py --weights yolov5s.pt --img 640 --conf 0.25 --source data/images",
     {"img_size": [640], "conf_thres": 0.25, "source": "data/images"}),
    ("python detect.py --weights yolov5s.pt --img 832 --source data/images --augment", {"augment": True}),
    ("python detect.py --weights yolov5s.engine --imgsz 640 640 --device 0", {"img_size": [640, 640]}),
    ("python detect.py --weights yolov5s.pt --device cpu", {"weights": "yolov5s.pt", "img_size": None}),
    ("python detect.py --weights yolov5s.pt --source data/images --conf-thres 0.4 --iou-thres 0.5 --save-txt "
     "--save-conf --project runs/detect --name exp --exist-ok", {"conf_thres": 0.4, "iou_thres": 0.5, "save_txt": True,
                                                                 "save_conf": True, "exist_ok": True}),
    ("python export.py --img 64 --batch 1 --weights yolov5n.pt --include torchscript onnx",
     {"img_size": [64], "batch_size": 1, "include": ["torchscript", "onnx"]}),
    ("python export.py --weights yolov5s.pt --include onnx --dynamic --simplify --opset 12 --half --int8",
     {"dynamic": True, "simplify": True, "opset": 12, "half": True, "int8": True}),
]


@pytest.mark.parametrize("line, expected", YOLOV5_LINES, ids=[line for line, _ in YOLOV5_LINES])
def test_yolov5_command_lines_parse_as_they_are_typed(line: str, expected: dict[str, Any]) -> None:
    """Each spelling is an explicit alias (--batch, --img, --conf, --iou, --adam): no abbreviation that a new flag
    (--batch-scaling beside --batch-size) could make ambiguous."""
    script, *argv = shlex.split(line)[1:]
    opt = vars(SCRIPTS[script].parse_opt(argv))
    assert {k: opt[k] for k in expected} == expected
