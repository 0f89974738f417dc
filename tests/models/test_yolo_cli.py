"""``python models/yolo.py``: runs from the repository root, prints the layer table, size, GFLOPs and profiles."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import models.layer_profile as yolo
from models.layer_profile import parse_opt
from models.yolo import ModelConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[2]


def test_script_runs_from_the_repository_root() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}  # nothing but the script's own path fix
    run = subprocess.run([sys.executable, "models/yolo.py", "--cfg", "yolov5s.yaml"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert re.match(r"\s+from\s+n\s+params\s+module\s+arguments", lines[0])
    rows = [ln for ln in lines if re.match(r"\s*\d+\s", ln)]
    assert len(rows) == 25 and "models.common.Conv" in rows[0] and "models.yolo.Detect" in rows[-1]
    assert re.search(r"\b229245\s+models\.yolo\.Detect", rows[-1])  # the head's parameters, as the table prints
    summary = lines[-1]
    assert "7,235,389 parameters" in summary and "7,235,389 gradients" in summary, summary
    gflops = float(re.search(r"([\d.]+) GFLOPs at 640x640", summary).group(1))
    assert gflops == pytest.approx(16.6, rel=0.02)


def test_profile_times_every_layer(capsys: pytest.CaptureFixture) -> None:
    yolo.main(parse_opt(["--cfg", "yolov5n.yaml", "--img-size", "64", "--device", "cpu", "--profile", "--runs", "1"]))
    out = capsys.readouterr().out
    assert "1,872,157 parameters" in out and "per-layer profile on cpu, batch 1, 64x64" in out
    rows = re.findall(r"^\s*(\d+)\s+(\d+\.\d+)\s+(\d+)\s+(\S+)$", out, re.M)
    assert [int(r[0]) for r in rows] == list(range(25)) and rows[-1][3] == "models.yolo.Detect"
    assert sum(int(r[2]) for r in rows) == 1_872_157 and all(float(r[1]) >= 0 for r in rows)
    assert re.search(r"forward pass: \d+\.\d+ ms on cpu", out)


def test_line_profile_adds_gflops_per_layer(capsys: pytest.CaptureFixture) -> None:
    opt = parse_opt(["--cfg", "yolov5n.yaml", "--img", "128", "--batch-size", "2", "--line-profile", "--runs", "1"])
    yolo.main(opt)
    out = capsys.readouterr().out
    rows = re.findall(r"^\s*(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+)\s+(\S+)$", out, re.M)
    assert len(rows) == 25
    total = float(re.search(r"^\s+\d+\.\d+\s+(\d+\.\d+)\s+1872157\s+total$", out, re.M).group(1))
    assert total == pytest.approx(sum(float(r[2]) for r in rows), abs=2e-3)
    assert total == pytest.approx(2 * 4.6 * (128 / 640) ** 2, rel=0.03)  # batch 2 at 128 px: the model's GFLOPs
    assert float(rows[0][2]) > 0 and float(rows[12][2]) == 0  # a conv counts, a Concat does not


def test_bad_config_is_a_user_error() -> None:
    with pytest.raises(ModelConfigError, match="model config nope.yaml not found"):
        yolo.main(parse_opt(["--cfg", "nope.yaml"]))


@pytest.mark.parametrize("cfg, params, gflops, head", [("yolov8n.yaml", "3,157,200", 8.8, "AnchorFreeDetect"),
                                                       ("yolo11n.yaml", "2,624,080", 6.5, "AnchorFreeDetect"),
                                                       ("yolo26n.yaml", "2,572,280", 5.4, "EndToEndDetect")])
def test_family_summaries_name_the_scaled_model(capsys: pytest.CaptureFixture, cfg: str, params: str, gflops: float,
                                                head: str) -> None:
    """``--cfg yolo11n.yaml`` builds scale n of models/yolo11.yaml; the summary names yolo11n and its GFLOPs."""
    yolo.main(parse_opt(["--cfg", cfg]))
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if re.match(r"\s*\d+\s", ln)]
    assert re.search(rf"\.{head}\s", rows[-1]), rows[-1]
    summary = out.splitlines()[-1]
    assert summary.startswith(f"{cfg[:-5]} summary: ") and f"{params} parameters" in summary, summary
    assert float(re.search(r"([\d.]+) GFLOPs at 640x640", summary).group(1)) == pytest.approx(gflops, abs=0.05)
