"""Data YAMLs: paths, names and their errors, the shipped YAMLs, safe extraction and the download of a missing
data set."""

from __future__ import annotations

import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.helpers import GOOD_LABEL, make_set, write_jpg
from utils.data import config as data_config
from utils.data.config import DataError, load_data_config, safe_extract
from utils.data.datasets import YoloDataset
from utils.data.label_cache import list_image_files


def test_yaml_paths_names_and_errors(tmp_path: Path) -> None:
    images = make_set(tmp_path / "set", {"a.jpg": (write_jpg, GOOD_LABEL)})
    (tmp_path / "list.txt").write_text("./set/images/train/a.jpg\n")
    good = tmp_path / "d.yaml"
    good.write_text(f"path: {tmp_path}\ntrain: [set/images/train, list.txt]\nval: set/images/train\n"
                    "names: {0: cat, 1: dog}\n")
    config = load_data_config(good)
    assert config.nc == 2 and config.names == ["cat", "dog"] and config.train[0] == images
    assert list_image_files(config.train) == [str(images / "a.jpg")] * 2
    (tmp_path / "bad_nc.yaml").write_text("train: set/images/train\nval: set/images/train\nnc: 3\nnames: [a]\n")
    with pytest.raises(DataError, match="nc is 3"):
        load_data_config(tmp_path / "bad_nc.yaml")
    (tmp_path / "no_split.yaml").write_text("train: set/images/train\nval: nowhere\nnc: 1\n")
    with pytest.raises(DataError, match=str(tmp_path / "nowhere")):
        load_data_config(tmp_path / "no_split.yaml")
    with pytest.raises(DataError, match="not found"):
        load_data_config(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("train: [unclosed\n")
    with pytest.raises(DataError, match="YAML"):
        load_data_config(tmp_path / "broken.yaml")


def test_shipped_yamls_parse() -> None:
    for name in ("coco128.yaml", "coco.yaml"):
        data = data_config._read_yaml(data_config.ROOT / "data" / name)
        nc, names = data_config._parse_names(data, Path(name))
        assert nc == 80 and len(names) == 80 and data["download"]


def test_safe_extract_refuses_escaping_members(tmp_path: Path) -> None:
    good, evil = tmp_path / "good.zip", tmp_path / "evil.zip"
    with zipfile.ZipFile(good, "w") as z:
        z.writestr("set/images/a.txt", "x")
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("ok.txt", "x")
        z.writestr("../escaped.txt", "x")
    assert (tmp_path / "out" / "set" / "images" / "a.txt") in safe_extract(good, tmp_path / "out")
    with pytest.raises(DataError, match="outside"):
        safe_extract(evil, tmp_path / "out2")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "out2" / "ok.txt").exists()


def test_missing_data_is_downloaded_and_extracted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "mini.zip"
    with zipfile.ZipFile(source, "w") as z:  # the zip holds the data set's folder, as coco128.zip does
        z.writestr("mini/images/train/a.jpg", cv2.imencode(".jpg", np.zeros((20, 20, 3), np.uint8))[1].tobytes())
        z.writestr("mini/labels/train/a.txt", GOOD_LABEL)
    data = tmp_path / "cfg" / "mini.yaml"
    data.parent.mkdir()
    data.write_text(f"path: mini\ntrain: images/train\nval: images/train\nnc: 1\ndownload: {source.as_uri()}\n")
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    config = load_data_config(data)  # a file:// URL: the real download code, without a network
    assert config.root == tmp_path / "home" / "mini" and (config.train[0] / "a.jpg").is_file()
    assert not list((tmp_path / "home").glob("*.zip*"))  # the archive is removed after extraction
    assert YoloDataset(config.train, img_size=32, nc=1).scan.found == 1
