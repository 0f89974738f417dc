"""Build the reference YOLOv5 (PyPI yolov5 7.0.14, unpacked, not installed) with our weights, for bench_model.py.

The package is imported by path. Its module-level imports name a few packages that this environment does not
install (``pkg_resources``, ``ultralytics``, ``seaborn``); none of them is used by model building or the forward
pass, so where one is missing an empty stand-in module is registered (with ``parse_version`` and
``check_requirements``, the two names called while importing). Nothing of the reference is kept in this repository.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import torch
from torch import nn

_STAND_INS = ("pkg_resources", "ultralytics", "ultralytics.utils", "ultralytics.utils.checks", "seaborn")


def _register_stand_ins() -> None:
    """An empty module for each of ``_STAND_INS`` that does not import here."""
    from packaging.version import parse

    for name in _STAND_INS:
        try:
            importlib.import_module(name)
        except ImportError:
            module = types.ModuleType(name)
            module.parse_version = parse  # pkg_resources.parse_version
            module.check_requirements = lambda *args, **kwargs: True  # ultralytics.utils.checks
            sys.modules[name] = module


def build_reference(package_dir: Path, name: str, state_dict: dict[str, torch.Tensor]) -> nn.Module:
    """The reference ``name`` model from its own YAML, our ``state_dict`` copied in (its anchors and strides are its
    own), fused, in eval mode. ``package_dir`` is the unpacked ``yolov5`` package directory."""
    package_dir = Path(package_dir).resolve()
    if package_dir.name != "yolov5":
        raise ValueError(f"{package_dir}: expected the 'yolov5' package directory (its modules import yolov5.*)")
    _register_stand_ins()
    if str(package_dir.parent) not in sys.path:
        sys.path.insert(0, str(package_dir.parent))
    reference = importlib.import_module("yolov5.models.yolo")
    model = reference.Model(str(package_dir / "models" / f"{Path(name).stem}.yaml"))
    weights = {k: v for k, v in state_dict.items() if not k.endswith((".anchors", ".stride"))}
    result = model.load_state_dict(weights, strict=False)
    if result.unexpected_keys or any(not k.endswith(".anchors") for k in result.missing_keys):
        raise ValueError(f"{name}: the reference model's layers differ from ours ({result})")
    return model.fuse().eval()
