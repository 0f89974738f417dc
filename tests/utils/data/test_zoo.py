"""The public data sets' YAMLs (VOC, VisDrone, SKU-110K, GlobalWheat2020, xView, Objects365): each one's files,
written tiny by the test in the set's own format, are fetched from a loopback server through the real download
code (the YAML's URLs pointed at it), unpacked and converted by the converter the YAML names, and read back as
the labels the set's annotations mean."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

import cv2
import numpy as np
import pytest
import yaml

from tests.helpers import serve_folder
from utils.data.config import DataError, load_data_config
from utils.data.datasets import YoloDataset
from utils.data.zoo import CONVERTERS, WHEAT_DOMAINS
from utils.paths import ROOT


def image_bytes(w: int, h: int, suffix: str = ".jpg") -> bytes:
    return cv2.imencode(suffix, np.full((h, w, 3), 90, np.uint8))[1].tobytes()


def write_zip(path: Path, files: dict[str, bytes | str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)


def write_tar(path: Path, files: dict[str, bytes | str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def served_path(served: Path, url: str) -> Path:
    """Where the loopback server must hold the file a YAML's URL names (its URL path, kept whole)."""
    return served / unquote(urlparse(url).path).lstrip("/")


def loopback_yaml(name: str, root: Path, served: Path, base: str) -> tuple[Path, dict]:
    """The shipped YAML with ``path`` at ``root`` and every download URL's host replaced by the loopback server."""
    data = yaml.safe_load((ROOT / "data" / name).read_text())
    urls = []
    for entry in data["download"]:
        urls.append(entry["url"])
        entry["url"] = base + urlparse(entry["url"]).path
    data["path"] = str(root)
    out = root.parent / name
    out.write_text(yaml.safe_dump(data))
    return out, {Path(unquote(urlparse(u).path)).name: served_path(served, u) for u in urls}


def voc_xml(name: str, objects: list[tuple[str, list[int], int]]) -> str:
    rows = "".join(f"<object><name>{n}</name><difficult>{d}</difficult><bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin>"
                   f"<xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>" for n, b, d in objects)
    return f"<annotation><filename>{name}</filename><size><width>40</width><height>20</height></size>{rows}" \
           "</annotation>"


def fixture_voc(files: dict[str, Path]) -> list[float]:
    devkit = {}
    for year, sets in (("2007", ("train", "val")), ("2012", ("train", "val"))):
        for s in sets:
            image_id = f"{year}_{s}"
            devkit[f"VOCdevkit/VOC{year}/JPEGImages/{image_id}.jpg"] = image_bytes(40, 20)
            devkit[f"VOCdevkit/VOC{year}/Annotations/{image_id}.xml"] = voc_xml(
                f"{image_id}.jpg", [("dog", [11, 3, 30, 18], 0), ("cat", [1, 1, 5, 5], 1)])
            devkit[f"VOCdevkit/VOC{year}/ImageSets/Main/{s}.txt"] = f"{image_id}\n"
    test = {"VOCdevkit/VOC2007/JPEGImages/t.jpg": image_bytes(40, 20), "VOCdevkit/VOC2007/ImageSets/Main/test.txt":
            "t\n", "VOCdevkit/VOC2007/Annotations/t.xml": voc_xml("t.jpg", [("person", [1, 1, 40, 20], 0),
                                                               ("cat", [2, 2, 9, 9], 1)])}  # difficult
    write_zip(files["VOCtrainval_06-Nov-2007.zip"], {k: v for k, v in devkit.items() if "VOC2007" in k})
    write_zip(files["VOCtrainval_11-May-2012.zip"], {k: v for k, v in devkit.items() if "VOC2012" in k})
    write_zip(files["VOCtest_06-Nov-2007.zip"], test)
    return [11, (10 + 30) / 2 / 40, (2 + 18) / 2 / 20, 20 / 40, 16 / 20]  # dog; the difficult cat left out


def fixture_visdrone(files: dict[str, Path]) -> list[float]:
    for split in ("train", "val", "test-dev"):
        folder = f"VisDrone2019-DET-{split}"
        rows = "10,2,20,8,1,4,0,0\n0,0,5,5,0,0,0,0\n1,1,3,3,1,11,0,0\n"  # a car; an ignored region; 'others'
        write_zip(files[f"{folder}.zip"], {f"{folder}/images/0001.jpg": image_bytes(40, 20),
                                           f"{folder}/annotations/0001.txt": rows})
    return [3, 20 / 40, 6 / 20, 20 / 40, 8 / 20]


def fixture_sku110k(files: dict[str, Path]) -> list[float]:
    content: dict[str, bytes | str] = {}
    for split in ("train", "val", "test"):
        content[f"SKU110K_fixed/images/{split}_0.jpg"] = image_bytes(40, 20)
        content[f"SKU110K_fixed/annotations/annotations_{split}.csv"] = f"{split}_0.jpg,4,2,24,12,object,40,20\n"
    write_tar(files["SKU110K_fixed.tar.gz"], content)
    return [0, 14 / 40, 7 / 20, 20 / 40, 10 / 20]


def fixture_globalwheat(files: dict[str, Path]) -> list[float]:
    images = {f"{d}/{d}_0.png": image_bytes(40, 20, ".png") for d in WHEAT_DOMAINS}
    write_zip(files["global-wheat-codalab-official.zip"], {**images, "arvalis_1.json": "{}"})
    write_zip(files["GlobalWheat2020_labels.zip"], {f"labels/{d}/{d}_0.txt": "0 0.5 0.5 0.25 0.5\n"
                                                    for d in WHEAT_DOMAINS})
    return [0, 0.5, 0.5, 0.25, 0.5]


def fixture_xview(files: dict[str, Path]) -> list[float]:
    features = [{"properties": {"image_id": f"{i}.tif", "type_id": 18, "bounds_imcoords": "4,2,24,22"}}
                for i in range(10)]
    features.append({"properties": {"image_id": "0.tif", "type_id": 75, "bounds_imcoords": "1,1,9,9"}})  # no class
    write_zip(files["train_labels.zip"], {"xView_train.geojson": json.dumps({"features": features})})
    write_zip(files["train_images.zip"], {f"train_images/{i}.tif": image_bytes(40, 20, ".tif") for i in range(10)})
    write_zip(files["val_images.zip"], {"val_images/99.tif": image_bytes(40, 20, ".tif")})
    return [5, 14 / 40, 11 / 20, 20 / 40, 18 / 20]  # type 18 is class 5 (Small Car); clipped at the bottom


def fixture_objects365(files: dict[str, Path]) -> list[float]:
    names = yaml.safe_load((ROOT / "data" / "Objects365.yaml").read_text())["names"]
    categories = [{"id": i + 1, "name": names[i]} for i in range(365)]
    for split, patch_file in (("train", "patch0.tar.gz"), ("val", "patch0.tar.gz")):
        doc = {"images": [{"id": 7, "file_name": f"images/v1/patch0/o365_{split}_7.jpg", "width": 40,
                           "height": 20}], "categories": categories,
               "annotations": [{"id": 1, "image_id": 7, "category_id": 3, "bbox": [4, 2, 20, 10], "iscrowd": 0},
                               {"id": 2, "image_id": 7, "category_id": 1, "bbox": [0, 0, 5, 5], "iscrowd": 1}]}
        patches = {p for p in files.values() if p.name.startswith("patch") and f"/{split}/" in str(p)}
        for patch in patches:
            content = {f"v1/patch0/o365_{split}_7.jpg": image_bytes(40, 20)} if patch.name == patch_file else {}
            write_tar(patch, content)
        if split == "train":
            write_tar(files["zhiyuan_objv2_train.tar.gz"], {"zhiyuan_objv2_train.json": json.dumps(doc)})
        else:
            files["zhiyuan_objv2_val.json"].write_text(json.dumps(doc))
    return [2, 14 / 40, 7 / 20, 20 / 40, 10 / 20]  # category 3 is class 2 (Chair); the crowd box left out


ZOO: dict[str, tuple[str, Callable[[dict[str, Path]], list[float]]]] = {
    "voc": ("VOC.yaml", fixture_voc),
    "visdrone": ("VisDrone.yaml", fixture_visdrone),
    "sku110k": ("SKU-110K.yaml", fixture_sku110k),
    "globalwheat2020": ("GlobalWheat2020.yaml", fixture_globalwheat),
    "xview": ("xView.yaml", fixture_xview),
    "objects365": ("Objects365.yaml", fixture_objects365),
}


def test_every_converter_has_a_yaml_and_a_fixture():
    assert set(ZOO) == set(CONVERTERS)
    for converter, (name, _) in ZOO.items():
        assert yaml.safe_load((ROOT / "data" / name).read_text())["convert"] == converter


def _patch_paths(files: dict[str, Path], served: Path, data: dict) -> dict[str, Path]:
    """Objects365 names many files 'patchN.tar.gz': key those by their served path instead."""
    return {**files, **{str(served_path(served, e["url"])): served_path(served, e["url"]) for e in data["download"]}}


@pytest.mark.parametrize("converter", sorted(ZOO))
def test_zoo_yaml_downloads_and_converts_its_tiny_fixture(converter, tmp_path, monkeypatch):
    name, write_fixture = ZOO[converter]
    served, root = tmp_path / "served", tmp_path / "data" / "set"
    root.parent.mkdir(parents=True)
    with serve_folder(served) as base:
        data_yaml, files = loopback_yaml(name, root, served, base)
        data = yaml.safe_load(data_yaml.read_text())
        expected = write_fixture(_patch_paths(files, served, data) if converter == "objects365" else files)
        config = load_data_config(data_yaml)
    train = YoloDataset(config.train, img_size=64, nc=config.nc)
    assert train.scan.corrupt == 0 and train.scan.found == len(train)
    first = next(lab for lab in train.labels if len(lab))
    np.testing.assert_allclose(first[0], np.float32(expected), rtol=0, atol=1e-6)
    assert len(first) == 1  # ignored regions, difficult and crowd boxes, unknown classes: left out
    val = YoloDataset(config.val, img_size=64, nc=config.nc)
    assert val.scan.corrupt == 0
    if converter == "voc":  # validation reads VOC XML: the difficult cat is an ignore region, not a label
        assert [len(lab) for lab in val.labels] == [1]
        assert val.ignore_regions(val.im_files[0]).shape[0] == 1
    assert not list(root.rglob("*.tar.gz")) and not list(root.rglob("*.zip"))


def test_an_unknown_converter_is_one_line(tmp_path):
    data = tmp_path / "d.yaml"
    data.write_text("train: a\nval: a\nnc: 1\nconvert: voc2\n")
    with pytest.raises(DataError, match="convert: 'voc2' is not a known converter"):
        load_data_config(data)


def test_untar_never_replaces_a_file(tmp_path: Path) -> None:
    from utils.data.zoo import safe_untar

    archive = tmp_path / "set.tar"
    with tarfile.open(archive, "w") as tar:
        for name, content in (("set/a.txt", b"from the archive"), ("set/b.txt", b"new")):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "a.txt").write_text("the user's")
    safe_untar(archive, tmp_path)
    assert (tmp_path / "set" / "a.txt").read_text() == "the user's"
    assert (tmp_path / "set" / "b.txt").read_text() == "new"
