"""utils/data/dota.py: DOTA's own label files parsed and converted to YOLO-OBB label files (by function, by the
zoo's converter and by python -m utils.data.convert --from dota), read back by the obb task's label reader."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.data.convert import main as convert_main
from utils.data.dota import convert_dota, convert_dota_folder, parse_dota_text
from utils.data.errors import DataError
from utils.tasks.obb.labels import read_obb_label_file

DOTA = """imagesource:GoogleEarth
gsd:0.146
10 10 50 10 50 30 10 30 small-vehicle 0
60.5 5 90 5 90 25 60.5 25 plane 1
1 1 2 2 3 3 4 4 tank 0
1 2 3 oops 5 6 7 8 plane 0
-5 40 30 40 30 70 -5 70 Plane 0
"""
NAMES = ["plane", "small vehicle"]


def test_dota_text_is_parsed() -> None:
    objects = parse_dota_text(DOTA, NAMES)
    assert objects.classes.tolist() == [1, 0, 0] and objects.difficult.tolist() == [False, True, False]
    assert (objects.unknown, objects.malformed) == (1, 1)
    assert objects.corners[0].tolist() == [[10, 10], [50, 10], [50, 30], [10, 30]]
    assert parse_dota_text(DOTA, NAMES, keep_difficult=False).classes.tolist() == [1, 0]


def dota_folder(tmp_path: Path) -> tuple[Path, Path]:
    labels, images = tmp_path / "labelTxt", tmp_path / "images"
    labels.mkdir()
    images.mkdir()
    (labels / "P0001.txt").write_text(DOTA)
    (labels / "P0002.txt").write_text("1 1 9 1 9 9 1 9 plane 0\n")  # no image: skipped
    cv2.imwrite(str(images / "P0001.png"), np.zeros((60, 100, 3), np.uint8))
    return labels, images


def test_dota_folder_converts_to_yolo_obb(tmp_path: Path) -> None:
    labels, images = dota_folder(tmp_path)
    counts = convert_dota_folder(labels, images, tmp_path / "out", NAMES)
    assert counts == {"files": 1, "skipped": 1, "objects": 3, "unknown": 1, "malformed": 1, "empty": 0}
    rows, state, _, _ = read_obb_label_file(tmp_path / "out" / "P0001.txt", 2)
    assert state == "found" and rows[:, 0].tolist() == [1, 0, 0]
    np.testing.assert_allclose(rows[0, 1:], [0.1, 10 / 60, 0.5, 10 / 60, 0.5, 0.5, 0.1, 0.5], atol=1e-6)
    assert rows[2, 1] == 0.0 and rows[2, 6] == 1.0  # clipped to the image
    refused = []

    def refuse(targets: list[Path]) -> None:
        refused.extend(targets)
        raise DataError("not ours")

    with pytest.raises(DataError, match="not ours"):
        convert_dota_folder(labels, images, tmp_path / "out2", NAMES, claim=refuse)
    assert refused == [tmp_path / "out2" / "P0001.txt"] and not (tmp_path / "out2").exists()  # nothing written
    root = tmp_path / "set"  # the zoo layout
    (root / "labels" / "train_original").mkdir(parents=True)
    (root / "labels" / "train_original" / "P0001.txt").write_text(DOTA)
    (root / "images" / "train").mkdir(parents=True)
    cv2.imwrite(str(root / "images" / "train" / "P0001.png"), np.zeros((60, 100, 3), np.uint8))
    convert_dota(root, NAMES)
    assert (root / "labels" / "train" / "P0001.txt").read_text() == (tmp_path / "out" / "P0001.txt").read_text()


def test_convert_command_from_dota(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    labels, images = dota_folder(tmp_path)
    out = tmp_path / "converted"
    args = ["--from", "dota", "--annotations", str(labels), "--images", str(images), "--names", *NAMES,
            "--out", str(out)]
    assert convert_main(args) == 0
    rows = read_obb_label_file(out / "labels" / "P0001.txt", 2)[0]
    assert rows[:, 0].tolist() == [1, 0]  # difficult objects only with --keep-crowd
    assert (out / "images" / "P0001.png").is_file()
    assert convert_main([*args, "--keep-crowd"]) == 0  # its own files: replaced
    assert len(read_obb_label_file(out / "labels" / "P0001.txt", 2)[0]) == 3
    (out / "labels" / "P0009.txt").write_text("mine")
    (labels / "P0009.txt").write_text(DOTA)
    cv2.imwrite(str(images / "P0009.png"), np.zeros((60, 100, 3), np.uint8))
    assert convert_main(args) == 2
    assert "P0009.txt exists and was not written by" in capsys.readouterr().err
    assert (out / "labels" / "P0009.txt").read_text() == "mine"
