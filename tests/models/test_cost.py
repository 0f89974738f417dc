"""models/cost.py: a model description is refused by what it would cost, found on the meta device before anything
is built, whatever block, head or file it comes from (a --cfg YAML, our checkpoint, an ultralytics release file)."""

from __future__ import annotations

import copy
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from models.cost import REFERENCE_SIZE, check_cost, limits_at
from models.registry import _REGISTRY, LIMITS, ModelConfigError, channel_args, register_module
from models.yolo import Model, load_model_config, parse_model, run_rows
from utils.weights.checkpoint import (
    CheckpointError,
    load_checkpoint,
    model_from_checkpoint,
    new_checkpoint,
    save_checkpoint,
)
from utils.weights.release_reader import read_records
from utils.weights.ultralytics_reader import convert_records

ROOT = Path(__file__).resolve().parents[2]
ULTRALYTICS = ROOT / "tests" / "fixtures" / "ultralytics"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def meta_cost(cfg: dict, size: int = REFERENCE_SIZE):
    with torch.device("meta"):
        layers, save, _ = parse_model(copy.deepcopy(cfg), 3, "test")
    return check_cost(layers.train(), lambda x: run_rows(layers, save, x), 3, size, "test")


def family(name: str, scale: str) -> dict:
    cfg = yaml.safe_load((ROOT / "models" / name).read_text())
    if "scales" in cfg:
        cfg["scale"] = scale
    return cfg


@pytest.mark.parametrize("name", ["yolov5x.yaml", "yolo11x.yaml", "yolov8x-seg.yaml", "yolo26x.yaml"])
def test_the_largest_real_models_pass_at_1280_with_a_wide_margin(name: str) -> None:
    """The limits sit five times or more above what the largest zoo models cost for one 1280 px image."""
    cost = meta_cost(load_model_config(name)[0])  # yolo11x.yaml: the family file at scale x
    limits = limits_at(REFERENCE_SIZE)
    assert 5e7 < cost.parameters < LIMITS["parameters"] / 5
    assert 7e11 < cost.flops < limits["flops"] / 10  # yolov5x: 8.2e11 (205.7 GFLOPs at 640, x4)
    assert cost.values < limits["values"] / 10 and cost.largest < limits["tensor"] / 5
    assert cost.operations < limits["operations"] / 50


def test_costs_follow_the_image_size_and_limits_grow_above_1280(tiny_cfg: dict) -> None:
    small, large = meta_cost(tiny_cfg, 1280), meta_cost(tiny_cfg, 2560)
    assert large.flops == pytest.approx(4 * small.flops, rel=0.02)
    assert limits_at(2560)["flops"] == 4 * limits_at(1280)["flops"] and limits_at(640) == limits_at(1280)


def _hostile(base: dict, section: str, row: int, args: list) -> dict:
    cfg = copy.deepcopy(base)
    cfg[section][row][3] = args
    return cfg


def hostile_cases() -> dict[str, tuple[dict, str]]:
    """The red-team's model descriptions (issue 44) and what the one line says."""
    y11, v5 = family("yolo11.yaml", "n"), family("yolov5n.yaml", "")
    return {
        "SPPF kernel 2001": (_hostile(y11, "backbone", 9, [1024, 2001]), "kernel (2001,); each must be an integer "
                                                                         "in 1..64"),
        "Conv stride 0": (_hostile(v5, "backbone", 1, [128, 3, 0]), "Conv2d conv has stride (0, 0)"),
        "C3k2 expansion inf": (_hostile(y11, "backbone", 2, [256, False, float("inf")]), "cannot convert float "
                                                                                          "infinity to integer"),
        "C3k2 expansion 1e-9": (_hostile(y11, "backbone", 2, [256, False, 1e-9]), "has channels (32, 0)"),
        "Conv padding 4000": (_hostile(v5, "backbone", 1, [128, 3, 1, 4000]), "values in one tensor for one "
                                                                               "1280x1280 image, more than"),
    }


@pytest.mark.timeout(120)  # before: minutes (83 s to 216 s a model)
@pytest.mark.parametrize("case", list(hostile_cases()))
def test_a_hostile_yaml_is_one_line_without_memory(case: str, tmp_path: Path) -> None:
    cfg, expected = hostile_cases()[case]
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelConfigError) as info:
        Model(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 1 << 20  # kB: nothing near a gigabyte
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)) and expected in message, message


def test_the_yaml_cli_refuses_a_stride_of_zero_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "stride0.yaml"
    path.write_text(yaml.safe_dump(hostile_cases()["Conv stride 0"][0], sort_keys=False))
    run = subprocess.run([sys.executable, "models/yolo.py", "--cfg", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.strip().count("\n") == 0 and "stride (0, 0)" in run.stderr


@pytest.mark.timeout(120)  # before: minutes (83 s to 216 s a model)
@pytest.mark.parametrize("case", ["SPPF kernel 2001", "Conv stride 0", "C3k2 expansion inf"])
def test_our_checkpoint_with_a_hostile_description_is_refused(case: str, tiny_cfg: dict, tmp_path: Path) -> None:
    """Our own format: the same edits inside a .pt (the tensors unchanged: none of them has a shape to change)."""
    base = family("yolo11.yaml", "n") if case != "Conv stride 0" else family("yolov5n.yaml", "")
    ckpt = new_checkpoint(Model(base))
    ckpt["model_yaml"] = hostile_cases()[case][0]
    file = save_checkpoint(ckpt, tmp_path / "hostile.pt")
    with pytest.raises(CheckpointError) as info:
        model_from_checkpoint(load_checkpoint(file), str(file))
    assert "\n" not in str(info.value)
    assert hostile_cases()[case][1] in str(info.value)


def _edit_release(raw: dict, row: int, args: list, module: str | None = None, **attrs: object) -> None:
    raw["model"].attrs["yaml"]["backbone"][row][3] = args
    if module:
        record = raw["model"]
        for part in module.split("."):
            record = record.attrs["_modules"][part]
        record.attrs.update(attrs)


@pytest.mark.timeout(120)  # before: minutes (83 s to 216 s a model)
@pytest.mark.parametrize("case", ["SPPF kernel 2001", "C3k2 expansion inf"])
def test_an_ultralytics_file_with_a_hostile_description_is_refused(case: str) -> None:
    """yolo11n.pt with its SPPF pooling edited in the YAML and in the pickled module (so they agree), or a C3k2's
    expansion set to .inf: one CheckpointError line, without gigabytes."""
    raw = read_records(ULTRALYTICS / "yolo11n.pt")
    if case == "SPPF kernel 2001":
        _edit_release(raw, 9, [1024, 2001], "model.9.m", kernel_size=2001, padding=1000)
    else:
        _edit_release(raw, 2, [256, False, float("inf")])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CheckpointError) as info:
        convert_records(raw, "yolo11n.pt")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 1 << 20  # kB: nothing near a gigabyte
    assert "\n" not in str(info.value) and hostile_cases()[case][1] in str(info.value), str(info.value)


class Quadratic(nn.Module):
    """A block this module's check has never heard of: a (pixels x pixels) product of its input, as attention over
    a whole map would make (cost quadratic in the pixels)."""

    yaml_args = classmethod(lambda cls, row: channel_args(row))

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x).flatten(2)  # (b, c, n)
        weights = torch.bmm(y.transpose(1, 2), y)  # (b, n, n)
        return torch.bmm(y, weights).view(x.shape[0], -1, *x.shape[2:])


def test_an_unknown_block_is_counted_by_what_it_runs(tiny_cfg: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generic over blocks and heads: a registered block the check does not know is refused by what it makes at
    1280 px ((640 x 640)^2 products), and the same block placed after the stride-32 rows passes, counted."""
    monkeypatch.setitem(_REGISTRY, "Quadratic", [])
    register_module("Quadratic", Quadratic)
    early = copy.deepcopy(tiny_cfg)
    early["backbone"].insert(1, [-1, 1, "Quadratic", [16]])
    early["head"] = [[f if not isinstance(f, list) else [j + (j > 0) for j in f], n, m, a]
                     for f, n, m, a in early["head"]]
    with pytest.raises(ModelConfigError, match=r"row 1 would take [\d.e+]+ values in one tensor for one 1280x1280"):
        meta_cost(early)
    late = copy.deepcopy(tiny_cfg)
    late["backbone"].append([-1, 1, "Quadratic", [128]])
    late["head"] = [[f if not isinstance(f, list) else [j + (j > 9) for j in f], n, m, a]
                    for f, n, m, a in late["head"]]
    assert meta_cost(late).flops > meta_cost(tiny_cfg).flops
