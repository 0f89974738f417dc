"""The formats beyond TorchScript, ONNX and OpenVINO for a classifier and an oriented-box detector (YOLOv8/YOLO11):
NCNN carries their outputs and verifies against the .pt as it is written; Core ML is written and read back with
its outputs and metadata (it has no runtime on this operating system)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import export
from models.yolo import Model
from utils.deploy import formats
from utils.weights.checkpoint import new_checkpoint, save_checkpoint

pytestmark = pytest.mark.slow


def saved(cfg: str, names: list[str], path: Path) -> Path:
    torch.manual_seed(0)
    model = Model(cfg, nc=len(names))
    model.names = names
    path.parent.mkdir(parents=True)
    return save_checkpoint(new_checkpoint(model), path)


@pytest.mark.parametrize(("cfg", "task"), [("yolo11n-cls.yaml", "classify"), ("yolov8n-obb.yaml", "obb")])
def test_ncnn_verifies_and_coreml_reads_back(cfg: str, task: str, tmp_path: Path) -> None:
    weights = saved(cfg, ["a", "b", "c"], tmp_path / task / "m.pt")
    ncnn = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "ncnn"]))[0]
    assert ncnn.error is None and ncnn.verification is not None and ncnn.file.exists(), ncnn
    if formats.missing_packages(formats.get_format("coreml").export_packages):
        pytest.skip("coremltools is not installed")
    coreml = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "coreml"]))[0]
    assert coreml.error is None and "read back" in coreml.verification.describe(), coreml
    found = formats.get_format("coreml").read_back(coreml.file)
    assert found["inputs"] == {"images": [1, 3, 64, 64]} and found["meta"]["names"] == ["a", "b", "c"]
    assert found["meta"]["head"]["contract"]["task"] == task
