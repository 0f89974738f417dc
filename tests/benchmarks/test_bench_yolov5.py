"""benchmarks/bench_yolov5.py without YOLOv5: what the reference trainer is asked, its environment, and the launcher
that runs its train.py (checked against a stand-in ``yolov5.train`` package)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_yolov5 import REFERENCE_TRAIN, parse_opt, reference_command, reference_env


def test_the_reference_is_asked_for_the_same_schedule_offline(tmp_path: Path) -> None:
    opt = parse_opt([])
    assert (opt.model, opt.epochs, opt.img, opt.batch_size, opt.images) == ("yolov5n", 3, 224, 32, 400)
    opt = parse_opt(["--epochs", "2", "--img", "96", "--batch-size", "4", "--seed", "3", "--model", "yolov5s"])
    command = reference_command(Path("/venv/bin/python"), opt, tmp_path / "d.yaml", tmp_path / "runs", "r-0")
    flags = command[command.index(REFERENCE_TRAIN) + 1:]
    asked = dict(zip(flags[::2], flags[1::2]))
    assert asked["--cfg"] == "yolov5s.yaml" and asked["--weights"] == "" and asked["--data"] == str(tmp_path / "d.yaml")
    assert (asked["--epochs"], asked["--img"], asked["--batch-size"], asked["--seed"]) == ("2", "96", "4", "3")
    assert asked["--project"] == str(tmp_path / "runs") and asked["--name"] == "r-0" and flags[-1] == "--noplots"
    env = reference_env(tmp_path / "config")
    assert env["YOLOV5_CONFIG_DIR"] == str(tmp_path / "config") and env["YOLO_OFFLINE"] == "true"
    assert (tmp_path / "config" / "Arial.ttf").stat().st_size > 0  # its dataset check finds a font: nothing fetched


def test_the_launcher_runs_its_train_module_with_stand_ins(tmp_path: Path) -> None:
    """REFERENCE_TRAIN runs ``yolov5.train`` as __main__ with the flags: roboflow and sahi import as empty stand-ins
    where missing, the trackers' loggers and TensorFlow do not import, numpy has ``trapz``."""
    package = tmp_path / "yolov5"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        "import json, sys\n"
        "from roboflow import Roboflow\n"
        "from roboflow.core.version import Version\n"
        "import numpy\n"
        "blocked = []\n"
        "for name in ('comet_ml', 'tensorflow'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ImportError:\n"
        "        blocked.append(name)\n"
        "print(json.dumps({'main': __name__, 'argv': sys.argv, 'blocked': blocked, 'roboflow': Roboflow.__name__,\n"
        "                  'trapz': float(numpy.trapz([1.0, 1.0], [0.0, 2.0]))}))\n")
    done = subprocess.run([sys.executable, "-c", REFERENCE_TRAIN, "--epochs", "3"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen.pop("argv") == [str(package / "train.py"), "--epochs", "3"]  # as ``python -m yolov5.train`` sets it
    assert seen == {"main": "__main__", "blocked": ["comet_ml", "tensorflow"], "roboflow": "Roboflow", "trapz": 2.0}
