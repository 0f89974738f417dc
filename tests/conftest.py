"""Shared fixtures. Tests run on CPU with tiny models at 64 px."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("NO_COLOR", "1")


def _tiny_cfg() -> dict:
    """yolov5n's layout at 1/8 width: the same rows, strides and head, a few thousand parameters."""
    cfg = yaml.safe_load((ROOT / "models" / "yolov5n.yaml").read_text())
    cfg["width_multiple"] = 0.125
    cfg["nc"] = 3
    return cfg


@pytest.fixture
def tiny_cfg() -> dict:
    return copy.deepcopy(_tiny_cfg())


@pytest.fixture(scope="session")
def tiny_cfg_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model config written as a YAML file (for --cfg)."""
    path = tmp_path_factory.mktemp("cfg") / "yolov5-tiny.yaml"
    path.write_text(yaml.safe_dump(_tiny_cfg(), sort_keys=False))
    return path
