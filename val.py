"""Validate a checkpoint: test.py under YOLOv5's newer name, with the same options and run (results in runs/val).

    python val.py --weights runs/train/exp/weights/best.pt --data coco128.yaml --img 640
    python val.py --weights yolov5s.pt --task speed
"""

from __future__ import annotations

import argparse
import sys

import test as validation
from utils.cli import run_main
from utils.engine import EvalResult

SCRIPT = "val"


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """test.py's options under this script's name (``argv=None`` reads sys.argv)."""
    return validation.parse_opt(argv, script=SCRIPT)


def main(opt: argparse.Namespace) -> EvalResult | list[EvalResult]:
    """test.py's run, logged as val."""
    return validation.main(opt, script=SCRIPT)


if __name__ == "__main__":
    sys.exit(run_main(main, parse_opt(), SCRIPT))
