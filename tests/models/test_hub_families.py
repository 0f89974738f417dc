"""torch.hub entry points of the YOLOv8, YOLO11 and YOLO26 families: fifteen names beside YOLOv5's, each built by
the same ``_create`` path; offline builds from the YAML, and ultralytics' release files (the local fixtures, served on
loopback) through the download path, their outputs those ultralytics computed."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import hubconf
from models.hub import Detector
from tests.models.test_families import PARAMETERS
from tests.utils.weights.test_ultralytics_reader import assert_matches_reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "ultralytics"
NEW = [f"{family}{scale}" for family in ("yolov8", "yolo11", "yolo26") for scale in "nsmlx"]


@pytest.fixture
def ultralytics_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A loopback server offering the ultralytics fixtures under their release names (yolov8n.pt, yolo11n.pt,
    yolo26n.pt); YOLO_WEIGHTS_URL points at it and YOLO_WEIGHTS_DIR (yielded) into tmp_path."""
    from tests.helpers import serve_folder

    served = tmp_path / "served"
    served.mkdir()
    for name in ("yolov8n", "yolo11n", "yolo26n"):
        shutil.copyfile(FIXTURES / f"{name}.pt", served / f"{name}.pt")
    with serve_folder(served) as url:
        monkeypatch.setenv("YOLO_WEIGHTS_URL", url)
        monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
        yield tmp_path / "cache"


def test_fifteen_new_entry_points_go_through_create(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed as torch.hub.list lists entry points (public callables of hubconf); each calls ``_create`` with its
    name and the caller's arguments."""
    listed = [name for name in dir(hubconf) if callable(getattr(hubconf, name)) and not name.startswith("_")]
    assert set(NEW) | {f"yolov5{scale}" for scale in "nsmlx"} <= set(listed)
    calls = []
    monkeypatch.setattr(hubconf, "_create", lambda *args: calls.append(args) or args[0])
    for name in NEW:
        entry = getattr(hubconf, name)
        assert entry.__name__ == name and entry(False, 3, "cpu", False) == name
        count = int(re.search(r": ([\d,]+) parameters", entry.__doc__).group(1).replace(",", ""))
        assert count == PARAMETERS[name[:-1]]["nsmlx".index(name[-1])]  # the docstring's figure is the built model's
    assert calls == [(name, False, 3, "cpu", False) for name in NEW]
    assert hubconf.yolo11n().__class__ is str  # defaults as YOLOv5's: pretrained, 80 classes, autoshape
    assert calls[-1] == ("yolo11n", True, 80, None, True)


def test_yolo26n_builds_offline_from_its_yaml() -> None:
    model = torch.hub.load(str(ROOT), "yolo26n", source="local", pretrained=False, device="cpu")
    assert isinstance(model, Detector) and model.model.head.family == "yolo26"
    assert sum(p.numel() for p in model.model.parameters()) == PARAMETERS["yolo26"][0]
    assert len(model.names) == 80 and model.stride == 32
    rows = model(torch.zeros(1, 3, 64, 96))  # a tensor batch goes straight to the model: YOLO26's final rows
    assert rows.shape == (1, 8 * 12 + 4 * 6 + 2 * 3, 6) and model.model.head.contract.layout == "xyxy_score_cls"


@pytest.mark.parametrize("name", ["yolov8n", "yolo11n", "yolo26n"])
def test_pretrained_release_files_through_the_download_path(ultralytics_server: Path, name: str) -> None:
    model = torch.hub.load(str(ROOT), name, source="local", pretrained=True, device="cpu")
    assert (ultralytics_server / f"{name}.pt").is_file()  # downloaded into YOLO_WEIGHTS_DIR
    assert model.model.head.family == name[:-1] and model.names == [f"class{i}" for i in range(80)]
    assert_matches_reference(model.model, name)  # the outputs ultralytics computed from the same file


def test_a_new_class_count_keeps_everything_but_the_class_branches(ultralytics_server: Path,
                                                                  yolo_log: list[str]) -> None:
    base = torch.hub.load(str(ROOT), "yolo11n", source="local", pretrained=True, device="cpu").model
    three = torch.hub.load(str(ROOT), "yolo11n", source="local", pretrained=True, classes=3, device="cpu").model
    assert three.nc == 3 and three.head.cv3[0][-1].weight.shape[0] == 3
    state, own = base.state_dict(), three.state_dict()
    same = [k for k in own if k in state and state[k].shape == own[k].shape]
    assert any(f"Transferred {len(same)}/{len(own)} items" in line for line in yolo_log), yolo_log
    assert all(torch.equal(own[k], state[k]) for k in same)
    assert {k.split(".")[2] for k in own if k not in same} == {"cv3"}  # model.23.cv3...: the class branches only
    data = np.load(FIXTURES / "yolo11n.npz")
    with torch.no_grad():
        boxes = three.eval()(torch.from_numpy(data["input"]))[..., :4]
        expected = base.eval()(torch.from_numpy(data["input"]))[..., :4]
    torch.testing.assert_close(boxes, expected)  # the box branches are the release's
