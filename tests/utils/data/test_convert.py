"""python -m utils.data.convert: YOLO txt from COCO JSON and VOC XML, COCO JSON from YOLO txt, round trips that give
back the same labels bit for bit, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.utils.data.test_formats import NAMES, write_sets
from utils.data.config import load_data_config
from utils.data.convert import label_text, main
from utils.data.datasets import YoloDataset


def _labels(images: Path | list) -> tuple[list[str], list[bytes]]:
    dataset = YoloDataset(images, img_size=64, nc=3)
    return [Path(f).name for f in dataset.im_files], [lab.tobytes() for lab in dataset.labels]


def test_label_text_reads_back_the_same_float32():
    rows = np.array([[2, 1 / 3, 0.1 + 0.2, 1e-7, 0.99999994]], np.float32)
    values = np.array(label_text(rows).split(), np.float64).astype(np.float32)
    assert values.tobytes() == rows[0].tobytes()


def test_yolo_to_coco_to_yolo_round_trip(tmp_path):
    root = write_sets(tmp_path / "set")["yolo"].parent
    original = _labels(root / "images" / "train")
    out_json = tmp_path / "out" / "instances.json"
    assert main(["--from", "yolo", "--images", str(root / "images" / "train"), "--names", *NAMES,
                 "--out", str(out_json)]) == 0
    doc = json.loads(out_json.read_text())
    assert [c["id"] for c in doc["categories"]] == [1, 2, 3] and len(doc["images"]) == 8
    assert doc["images"][0]["file_name"] == "img_000.jpg" and doc["annotations"][0]["iscrowd"] == 0
    assert main(["--from", "coco", "--annotations", str(out_json), "--images", str(root / "images" / "train"),
                 "--out", str(tmp_path / "back")]) == 0  # names read from the file
    assert _labels(tmp_path / "back" / "images") == original
    assert (tmp_path / "back" / "labels" / "img_001.txt").read_text() == ""  # the background keeps an empty file


def test_coco_and_voc_to_yolo_match_reading_them_directly(tmp_path):
    yamls = write_sets(tmp_path / "set")
    root = yamls["coco"].parent
    direct = _labels(load_data_config(yamls["coco"]).train)
    assert main(["--from", "coco", "--annotations", str(root / "annotations" / "instances_train.json"),
                 "--images", str(root / "images" / "train"), "--out", str(tmp_path / "from-coco")]) == 0
    assert _labels(tmp_path / "from-coco" / "images") == direct  # sparse category ids -> 0, 1, 2; crowd left out
    listed = tmp_path / "train.txt"
    listed.write_text("img_000\nimg_002\nimg_005\n")
    assert main(["--from", "voc", "--annotations", str(root / "voc" / "train"), "--images",
                 str(root / "images" / "train"), "--list", str(listed), "--names", *NAMES,
                 "--out", str(tmp_path / "from-voc")]) == 0
    names, labels = _labels(tmp_path / "from-voc" / "images")
    assert names == ["img_000.jpg", "img_002.jpg", "img_005.jpg"]
    assert labels == [direct[1][i] for i in (0, 2, 5)]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    root = write_sets(tmp_path / "set", n_train=2, n_val=1)["coco"].parent
    assert main(["--from", "voc", "--annotations", str(root / "voc" / "train"), "--images",
                 str(root / "images" / "train"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == "convert: error: --from voc needs --names (the class names in class-index " \
                                      "order)\n"
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [}')
    assert main(["--from", "coco", "--annotations", str(bad), "--images", str(root / "images" / "train"),
                 "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"convert: error: {bad}: not valid JSON (Expecting value at line 1, column " \
                                      "13); fix or re-export the annotation file\n"
