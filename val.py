"""Validate a checkpoint: test.py under YOLOv5's newer name, with the same options and run (results in runs/val).

    python val.py --weights runs/train/exp/weights/best.pt --data coco128.yaml --img 640
    python val.py --weights yolov5s.pt --task speed
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from utils.evaluation.evaluate import EvalResult

SCRIPT = "val"


def _load_test_script():
    """test.py, loaded from this folder by its path: ``import test`` may name Python's own test package."""
    spec = importlib.util.spec_from_file_location("yolo_test_script", Path(__file__).resolve().with_name("test.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


validation = sys.modules.get("yolo_test_script") or _load_test_script()


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """test.py's options under this script's name (``argv=None`` reads sys.argv)."""
    return validation.parse_opt(argv, script=SCRIPT)


def main(opt: argparse.Namespace) -> EvalResult | list[EvalResult]:
    """test.py's run, logged as val."""
    return validation.main(opt, script=SCRIPT)


def run(**options: Any) -> EvalResult | list[EvalResult]:
    """``test.run`` under this script's name (results in runs/val): ``val.run(weights="best.pt")``."""
    return validation.run(script=SCRIPT, **options)


if __name__ == "__main__":
    sys.exit(validation.api.command_line(__file__, parse_opt, main))
