"""COCO JSON and VOC XML splits: exact boxes, classes in the stated order, the crowd/difficult rule, backgrounds,
the cache, the same counted warnings, one line for a malformed file, and the YAML keys' errors.

``write_sets`` writes one small data set three times over the same images (YOLO txt, COCO JSON, VOC XML); the
whole-training comparison in tests/test_datasets.py uses it too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from utils.data.config import DataError, load_data_config
from utils.data.datasets import YoloDataset

NAMES = ["circle", "square", "triangle"]
CATEGORY_IDS = [2, 5, 9]  # sparse, as COCO's 80 of 91 are: classes 0, 1, 2 in ascending id order
SIZES = [(64, 48), (48, 64), (64, 64)]  # (w, h)


def _objects(rng: np.random.Generator, w: int, h: int, count: int) -> list[tuple[int, list[int]]]:
    """(class, [x1, y1, x2, y2]) boxes on whole pixels, at least 6 px a side."""
    out = []
    for _ in range(count):
        x1, y1 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
        x2, y2 = int(rng.integers(x1 + 6, w + 1)), int(rng.integers(y1 + 6, h + 1))
        out.append((int(rng.integers(0, 3)), [x1, y1, x2, y2]))
    return out


def _draw(path: Path, w: int, h: int, objects: list, rng: np.random.Generator) -> None:
    img = np.full((h, w, 3), 40, np.uint8) + rng.integers(0, 20, (h, w, 3), dtype=np.uint8)
    for cls, (x1, y1, x2, y2) in objects:
        cv2.rectangle(img, (x1, y1), (x2 - 1, y2 - 1), (80 * (cls + 1), 255 - 60 * cls, 120), -1)
    cv2.imwrite(str(path), img)


def _voc_xml(name: str, w: int, h: int, objects: list, difficult: list) -> str:
    rows = "".join(
        f"<object><name>{NAMES[c]}</name><difficult>{int(d)}</difficult><bndbox><xmin>{x1 + 1}</xmin>"
        f"<ymin>{y1 + 1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
        for (c, (x1, y1, x2, y2)), d in zip(objects, difficult))
    return (f"<annotation><filename>{name}</filename><size><width>{w}</width><height>{h}</height><depth>3</depth>"
            f"</size>{rows}</annotation>")


def write_split(root: Path, split: str, count: int, seed: int) -> dict:
    """Images in images/<split>, and the same boxes as YOLO txt (labels/), VOC XML (voc/<split>/) and a COCO
    dict (returned). Image 0 has a crowd/difficult box more; image 1 has no object (a background)."""
    rng = np.random.default_rng(seed)
    for folder in (root / "images" / split, root / "labels" / split, root / "voc" / split):
        folder.mkdir(parents=True, exist_ok=True)
    coco: dict = {"images": [], "annotations": [],
                  "categories": [{"id": i, "name": n} for i, n in zip(CATEGORY_IDS[::-1], NAMES[::-1])]}
    for index in range(count):
        w, h = SIZES[index % len(SIZES)]
        objects = [] if index == 1 else _objects(rng, w, h, int(rng.integers(1, 4)))
        crowd = [(0, [0, 0, 7, 7])] if index == 0 else []
        name, image_id = f"img_{index:03d}.jpg", 1000 + 7 * index
        _draw(root / "images" / split / name, w, h, objects + crowd, rng)
        if index != 1:  # the background has no label file (YOLO), but an XML without objects (VOC)
            (root / "labels" / split / f"img_{index:03d}.txt").write_text("".join(
                f"{c} {(x1 + x2) / 2 / w!r} {(y1 + y2) / 2 / h!r} {(x2 - x1) / w!r} {(y2 - y1) / h!r}\n"
                for c, (x1, y1, x2, y2) in objects))
        xml = _voc_xml(name, w, h, objects + crowd, [False] * len(objects) + [True] * len(crowd))
        (root / "voc" / split / f"img_{index:03d}.xml").write_text(xml)
        coco["images"].append({"id": image_id, "file_name": name, "width": w, "height": h})
        for c, (x1, y1, x2, y2) in objects + crowd:
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": image_id,
                                        "category_id": CATEGORY_IDS[c], "bbox": [x1, y1, x2 - x1, y2 - y1],
                                        "area": (x2 - x1) * (y2 - y1), "iscrowd": int((c, [x1, y1, x2, y2]) in crowd)})
    (root / "annotations").mkdir(exist_ok=True)
    (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))
    return coco


def write_sets(root: Path, n_train: int = 8, n_val: int = 6) -> dict[str, Path]:
    """The same data set as a YOLO, a COCO JSON and a VOC XML data YAML (one image folder)."""
    write_split(root, "train", n_train, seed=0)
    write_split(root, "val", n_val, seed=1)
    splits = {
        "yolo": {s: f"images/{s}" for s in ("train", "val")},
        "coco": {s: {"coco": f"annotations/instances_{s}.json", "images": f"images/{s}"} for s in ("train", "val")},
        "voc": {s: {"voc": f"voc/{s}", "images": f"images/{s}"} for s in ("train", "val")},
    }
    yamls = {}
    for kind, entries in splits.items():
        yamls[kind] = root / f"{kind}.yaml"
        yamls[kind].write_text(yaml.safe_dump({"path": str(root), **entries, "nc": 3, "names": NAMES}))
    return yamls


@pytest.fixture
def sets(tmp_path: Path) -> dict[str, Path]:
    return write_sets(tmp_path / "set", n_train=4, n_val=2)


def test_coco_boxes_classes_crowd_and_backgrounds(sets, yolo_log):
    coco = json.loads((sets["coco"].parent / "annotations" / "instances_train.json").read_text())
    data = load_data_config(sets["coco"])
    dataset = YoloDataset(data.train, img_size=64, nc=3)
    assert [Path(f).name for f in dataset.im_files] == [f"img_{i:03d}.jpg" for i in range(4)]
    first = [a for a in coco["annotations"] if a["image_id"] == 1000 and not a["iscrowd"]]
    x, y, w, h = first[0]["bbox"]
    expected = [CATEGORY_IDS.index(first[0]["category_id"]), (x + w / 2) / 64, (y + h / 2) / 48, w / 64, h / 48]
    np.testing.assert_array_equal(dataset.labels[0][0], np.float32(expected))  # top-left xywh pixels -> YOLO
    assert len(dataset.labels[0]) == len(first) and len(dataset.labels[1]) == 0  # crowd out; a background
    assert dataset.scan.line() == "4 found, 0 missing, 1 empty, 0 corrupt"
    assert any("1 crowd boxes excluded from training" in line for line in yolo_log)
    kept = YoloDataset(load_data_config(yaml_with(sets["coco"], keep_crowd=True)).train, img_size=64, nc=3)
    assert len(kept.labels[0]) == len(first) + 1  # keep_crowd: true trains on it


def yaml_with(path: Path, **keys: object) -> Path:
    """A copy of a data YAML whose split mappings get ``keys``."""
    data = yaml.safe_load(path.read_text())
    for split in ("train", "val"):
        data[split] = {**data[split], **keys}
    out = path.with_name(f"{path.stem}-{len(keys)}.yaml")
    out.write_text(yaml.safe_dump(data))
    return out


def test_voc_one_based_corners_difficult_and_missing_xml(sets):
    root = sets["voc"].parent
    xml = (root / "voc" / "train" / "img_002.xml").read_text()
    xmin = int(xml.split("<xmin>")[1].split("<")[0])
    xmax = int(xml.split("<xmax>")[1].split("<")[0])
    (root / "voc" / "train" / "img_003.xml").unlink()  # an image without its XML: a background, counted missing
    dataset = YoloDataset(load_data_config(sets["voc"]).train, img_size=64, nc=3)
    w = SIZES[2][0]
    assert dataset.labels[2][0, 3] == np.float32((xmax - (xmin - 1)) / w)  # 1-based inclusive: xmax - xmin + 1
    assert dataset.labels[2][0, 1] == np.float32((xmin - 1 + xmax) / 2 / w)
    assert dataset.scan.line() == "3 found, 1 missing, 1 empty, 0 corrupt"
    coco = YoloDataset(load_data_config(sets["coco"]).train, img_size=64, nc=3)
    for a, b in zip(dataset.labels[:3], coco.labels[:3]):
        assert a.tobytes() == b.tobytes()  # difficult (VOC) and crowd (COCO) boxes are left out alike


def test_the_parse_is_cached_and_rebuilt_when_the_file_changes(sets, yolo_log):
    data = load_data_config(sets["coco"])
    YoloDataset(data.train, img_size=64, nc=3)
    cache = sets["coco"].parent / "annotations" / "instances_train.all.cache"
    assert cache.is_file() and sum("New cache created" in line for line in yolo_log) == 1
    yolo_log.clear()
    YoloDataset(data.train, img_size=64, nc=3)
    assert not any("New cache created" in line for line in yolo_log)
    assert any(f"Scanning '{cache}'" in line for line in yolo_log)
    annotations = sets["coco"].parent / "annotations" / "instances_train.json"
    doc = json.loads(annotations.read_text())
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != 1000]
    annotations.write_text(json.dumps(doc))
    os.utime(annotations, ns=(1, 1))  # another mtime even on a coarse clock
    yolo_log.clear()
    assert len(YoloDataset(data.train, img_size=64, nc=3).labels[0]) == 0
    assert any("New cache created" in line for line in yolo_log)


def test_bad_entries_are_counted_corrupt_with_one_line_each(sets, yolo_log):
    root = sets["coco"].parent
    annotations = root / "annotations" / "instances_train.json"
    doc = json.loads(annotations.read_text())
    doc["annotations"][0]["category_id"] = 4  # not a category
    doc["images"][2]["width"] = 10  # disagrees with the image
    doc["images"][3]["file_name"] = "../escape.jpg"
    annotations.write_text(json.dumps(doc))
    dataset = YoloDataset(load_data_config(sets["coco"]).train, img_size=64, nc=3)
    assert dataset.scan.line() == "1 found, 0 missing, 1 empty, 3 corrupt"
    warnings = [line for line in yolo_log if "ignoring corrupt" in line]
    assert len(warnings) == 3 and all("\n" not in w for w in warnings)
    assert any("bad category_id 4" in w for w in warnings) and any("10x64 pixels" in w for w in warnings)
    assert any("bad file_name '../escape.jpg'" in w for w in warnings)
    (root / "voc" / "train" / "img_002.xml").write_text("<annotation><object>")  # malformed XML
    (root / "voc" / "train" / "img_003.xml").write_text('<!DOCTYPE a [<!ENTITY x "y">]><annotation/>')
    yolo_log.clear()
    voc = YoloDataset(load_data_config(sets["voc"]).train, img_size=64, nc=3)
    assert voc.scan.corrupt == 2
    warnings = [line for line in yolo_log if "ignoring corrupt" in line]
    assert any("img_002.xml: not valid XML" in w for w in warnings) and any("DOCTYPE" in w for w in warnings)


@pytest.mark.parametrize("text, message", [
    ("{", "not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
    ('{"images": []}', "not a COCO annotation file"),
    ('{"images": [], "categories": [{"id": 1, "name": "cat"}]}', "1 categories, but the data YAML lists 3 names"),
])
def test_a_malformed_coco_file_is_one_line(sets, text, message):
    (sets["coco"].parent / "annotations" / "instances_train.json").write_text(text)
    with pytest.raises(DataError, match="instances_train.json: " + message.replace("(", r"\(").replace(")", r"\)")):
        YoloDataset(load_data_config(sets["coco"]).train, img_size=64, nc=3)


def test_coco_names_must_match_the_yaml(sets):
    data = yaml.safe_load(sets["coco"].read_text())
    data["names"] = ["circle", "triangle", "square"]
    sets["coco"].write_text(yaml.safe_dump(data))
    with pytest.raises(DataError, match="class 1 is category 5 'square' in the file but 'triangle' in the data YAML"):
        YoloDataset(load_data_config(sets["coco"]).train, img_size=64, nc=3)


@pytest.mark.parametrize("split, message", [
    ({"coco": "a.json"}, "needs 'images'"),
    ({"coco": "a.json", "voc": "x", "images": "i"}, "2 formats"),
    ({"coco": "a.json", "images": "i", "crowd": True}, "unknown key 'crowd'"),
    ({"coco": "a.json", "images": "i", "keep_crowd": "yes"}, "'keep_crowd' must be true or false"),
    ({"coco": "missing.json", "images": "images/train"}, "split path coco annotations .*missing.json does not exist"),
])
def test_split_mapping_errors_are_one_line(sets, split, message):
    data = yaml.safe_load(sets["coco"].read_text())
    data["train"] = split
    sets["coco"].write_text(yaml.safe_dump(data))
    with pytest.raises(DataError, match=message):
        load_data_config(sets["coco"])


def test_splits_mix_formats_and_lists(sets):
    data = yaml.safe_load(sets["coco"].read_text())
    data["train"] = ["images/val", {"voc": "voc/train", "images": "images/train"}]
    sets["coco"].write_text(yaml.safe_dump(data))
    config = load_data_config(sets["coco"])
    dataset = YoloDataset(config.train, img_size=64, nc=3)
    assert len(dataset) == 6 and dataset.scan.line() == "5 found, 1 missing, 1 empty, 0 corrupt"
    assert YoloDataset(config.val, img_size=64, nc=3).scan.empty == 1  # val: COCO


def test_a_voc_list_picks_the_split_and_names_missing_xml_files(sets):
    root = sets["voc"].parent
    (root / "ids.txt").write_text("img_002\nimg_000\n\nimg_003\n")
    (root / "voc" / "train" / "img_003.xml").unlink()
    data = yaml.safe_load(sets["voc"].read_text())
    data["val"] = {"voc": "voc/train", "images": "images/train", "list": "ids.txt"}
    sets["voc"].write_text(yaml.safe_dump(data))
    split = load_data_config(sets["voc"]).val[0]
    assert split.cache_path().name == "train.ids.cache"  # one cache per list, beside the XML folder
    dataset = YoloDataset([split], img_size=64, nc=3)
    assert [Path(f).name for f in dataset.im_files] == ["img_000.jpg", "img_002.jpg", "img_003.jpg"]
    assert dataset.scan.line() == "2 found, 1 missing, 0 empty, 0 corrupt"


def test_an_unknown_voc_name_or_a_bad_bbox_makes_the_image_corrupt(sets, yolo_log):
    root = sets["voc"].parent
    xml = root / "voc" / "train" / "img_000.xml"
    xml.write_text(xml.read_text().replace("<name>", "<name>x", 1))
    annotations = root / "annotations" / "instances_train.json"
    doc = json.loads(annotations.read_text())
    doc["annotations"][0]["bbox"] = [1, 2, "3", 4]
    annotations.write_text(json.dumps(doc))
    assert YoloDataset(load_data_config(sets["voc"]).train, img_size=64, nc=3).scan.corrupt == 1
    assert YoloDataset(load_data_config(sets["coco"]).train, img_size=64, nc=3).scan.corrupt == 1
    assert any("is not in the data YAML's names" in line for line in yolo_log)
    assert any("has a bad bbox" in line for line in yolo_log)
