"""The classifiers' torch.hub entry points (yolov8n_cls ... yolo26x_cls): each docstring's size is the model its YAML
builds at nc 1000 (on the meta device); ``pretrained=True`` reads ultralytics' release file through the download
path (a loopback server offering the yolov8n-cls fixture) and gives its stored probabilities; another class count
re-initialises the head alone; an image in gives its top-5, read centre-cropped."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import ROOT, built_on_meta, serve_folder
from utils.tasks.classify.augment import val_transform

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FIXTURES = ROOT / "tests" / "fixtures" / "ultralytics"


def test_entry_points_state_the_sizes_they_build() -> None:
    import hubconf

    for family in ("yolov8", "yolo11", "yolo26"):
        for scale in "nsmlx":
            entry = getattr(hubconf, f"{family}{scale}_cls")
            layers = built_on_meta(f"{family}{scale}-cls")
            assert f"{sum(p.numel() for p in layers.parameters()):,} parameters (nc 1000)" in entry.__doc__


def test_a_release_classifier_through_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = tmp_path / "served"
    served.mkdir()
    shutil.copyfile(FIXTURES / "yolov8n-cls.pt", served / "yolov8n-cls.pt")
    with serve_folder(served) as url:
        monkeypatch.setenv("YOLO_WEIGHTS_URL", url)
        monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
        model = torch.hub.load(str(ROOT), "yolov8n_cls", source="local", device="cpu")
        three = torch.hub.load(str(ROOT), "yolov8n_cls", source="local", classes=3, device="cpu")
    data = np.load(FIXTURES / "yolov8n-cls.npz")
    output = model(torch.from_numpy(data["input"]))  # a tensor batch goes straight to the model
    torch.testing.assert_close(output, torch.from_numpy(data["output"]), atol=1e-4, rtol=1e-6)
    assert three.model.nc == 3 and three.model.head.linear.weight.shape == (3, 1280)
    assert torch.equal(three.model.model[0].conv.weight, model.model.model[0].conv.weight)
    found = three(np.zeros((48, 64, 3), np.uint8), size=64)
    (top5,) = found.top5
    assert [c for c, _ in top5] == found.xyxy[0][:, 5].int().tolist() and len(top5) == 3  # three classes, ranked
    assert sum(p for _, p in top5) == pytest.approx(1.0, abs=1e-5) and found.rboxes is None
    seen = []
    three.model.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))  # what the model reads
    wide = np.random.default_rng(1).integers(0, 255, (48, 80, 3), dtype=np.uint8)  # RGB, as the hub reads arrays
    three(wide, size=64)  # a batch of 64 x 64: 80 px to 64, 38.4 px up to the stride
    expected = torch.from_numpy(val_transform(wide, 64).transpose(2, 0, 1).copy()).float()[None] / 255
    assert torch.equal(seen[-1], expected)  # resized and centre-cropped as validation reads it, not letterboxed
    long = np.random.default_rng(2).integers(0, 255, (40, 200, 3), dtype=np.uint8)
    (top5,) = three([long], size=64).top5  # a detector's batch would be 32 x 64 (13 px up to the stride, and 64)
    assert seen[-1].shape == (1, 3, 64, 64) and len(top5) == 3  # square, as validation crops
    expected = torch.from_numpy(val_transform(long, 64).transpose(2, 0, 1).copy()).float()[None] / 255
    assert torch.equal(seen[-1], expected)
