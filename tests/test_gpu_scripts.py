"""tests/scripts/gpu_smoke.py and gpu_throughput.py on the CPU: what runs without a GPU (the options, the timing
loop, the tables, the TensorRT check's skip); the scripts themselves run where a GPU is."""

from __future__ import annotations

import math

import pytest
import torch

from tests.scripts import gpu_smoke, gpu_throughput
from tests.scripts.gpu_throughput import Throughput, images_per_second, parse_opt, table


def test_throughput_options_and_table() -> None:
    opt = parse_opt([])
    assert opt.models == ["yolo11n", "yolov5s"] and (opt.img, opt.batch, opt.device) == (640, 32, "0")
    with pytest.raises(SystemExit):
        parse_opt(["--steps", "0"])
    rows = [Throughput("yolo11n", 640, 32, 800.0, 760.0, 1500.0, 15), Throughput("yolov5s", 640, 32, 0.0, 1.0, 1, 1)]
    assert rows[0].ratio == pytest.approx(0.95) and math.isnan(rows[1].ratio)
    lines = table(rows)
    assert lines[0].split() == ["model", "img", "batch", "model", "only", "end", "to", "end", "ratio", "loader",
                                "workers"]
    assert lines[1].split() == ["yolo11n", "640", "32", "800.0", "760.0", "0.95", "1500.0", "15"]


def test_images_per_second_counts_the_timed_steps_only() -> None:
    seen = []
    batches = iter([(torch.zeros(4, 3, 8, 8), torch.zeros(0, 6))] * 10)
    rate = images_per_second(lambda imgs, targets, colour: seen.append(len(imgs)), batches, 3, 2, torch.device("cpu"))
    assert len(seen) == 5 and rate > 0  # 2 warm-up steps, 3 timed
    assert next(batches)[0].shape[0] == 4 and sum(1 for _ in batches) == 4  # 5 taken, 1 looked at, 4 left


def test_the_training_step_runs_on_the_cpu(tiny_cfg_file) -> None:
    step, model = gpu_throughput.training_step(str(tiny_cfg_file), 64, torch.device("cpu"))
    from benchmarks.bench_train import make_batch

    imgs, targets = make_batch(2, 64, 0)[:2]
    before = [p.detach().clone() for p in model.parameters()]
    step(imgs, targets)  # forward, loss, backward, the optimizer's step
    step(imgs, targets, torch.tensor([[1.01, 1.3, 0.8], [0.99, 0.7, 1.2]]))  # with the colour left to the step
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_batches_give_the_step_their_colour() -> None:
    from utils.data.colour import COLOUR_KEY

    gains, seen = torch.ones(4, 3), []
    batches = ((torch.zeros(4, 3, 8, 8), torch.zeros(0, 6), (), (), {COLOUR_KEY: gains}) for _ in range(3))
    images_per_second(lambda imgs, targets, colour: seen.append(colour), batches, 2, 1, torch.device("cpu"))
    assert len(seen) == 3 and all(c is gains for c in seen)
    assert parse_opt([]).colour_on == "auto" and parse_opt(["--colour-on", "device"]).colour_on == "device"


def test_smoke_summary_and_tensorrt_skip(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(gpu_smoke, "RESULTS", [])
    gpu_smoke.record("train.py on 1 GPU with AMP", True, 12.3, "AMP: float16 autocast")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    gpu_smoke.tensorrt(tmp_path / "best.pt", "python", str(tmp_path))
    gpu_smoke.record("throughput", False, 1.0, "timed out")
    output = "noise\nmodel       img batch  model only\nyolo11n    640    32  800.0\nyolov5s   640   32  300.0\n"
    lines = gpu_smoke.summary(output)
    assert [line.split()[-2] for line in lines[2:5]] == ["PASS", "PASS", "FAIL"]
    assert "TensorRT" in lines[3] and gpu_smoke.RESULTS[1][3].startswith("skipped")
    assert [line.split()[0] for line in lines[6:9]] == ["model", "yolo11n", "yolov5s"]
    assert lines[-1] == "2/3 checks passed"
