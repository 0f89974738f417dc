"""The oriented-box models' torch.hub entry points (yolov8n_obb ... yolo26x_obb, 15 classes unless told as the DOTA
release files): each docstring's size is the model its YAML builds at nc 15 (on the meta device); ``pretrained=True``
reads ultralytics' release file through the download path (a loopback server offering the yolo11n-obb fixture)
without re-initialising its head and gives its stored rows; an image in gives rotated boxes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import ROOT, built_on_meta, serve_folder

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FIXTURES = ROOT / "tests" / "fixtures" / "ultralytics"


def test_entry_points_state_the_sizes_they_build() -> None:
    import hubconf

    for family in ("yolov8", "yolo11", "yolo26"):
        for scale in "nsmlx":
            entry = getattr(hubconf, f"{family}{scale}_obb")
            layers = built_on_meta(f"{family}{scale}-obb", nc=15)
            assert f"{sum(p.numel() for p in layers.parameters()):,} parameters (nc 15)" in entry.__doc__


def test_a_release_obb_model_through_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             yolo_log: list[str]) -> None:
    served = tmp_path / "served"
    served.mkdir()
    shutil.copyfile(FIXTURES / "yolo11n-obb.pt", served / "yolo11n-obb.pt")
    with serve_folder(served) as url:
        monkeypatch.setenv("YOLO_WEIGHTS_URL", url)
        monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
        model = torch.hub.load(str(ROOT), "yolo11n_obb", source="local", device="cpu")
    assert not any("Transferred" in line for line in yolo_log), yolo_log  # the release's own head, 15 classes
    data = np.load(FIXTURES / "yolo11n-obb.npz")
    output = model(torch.from_numpy(data["input"]))  # a tensor batch goes straight to the model: (b, n, 20) rows
    torch.testing.assert_close(output.transpose(1, 2), torch.from_numpy(data["output"]), atol=1e-4, rtol=1e-6)
    model.conf = 0.0
    found = model(np.zeros((48, 64, 3), np.uint8), size=64)
    (rboxes,) = found.rboxes
    assert len(rboxes) == len(found.xyxy[0]) > 0 and np.asarray(rboxes).shape[1] == 5 and found.top5 is None
