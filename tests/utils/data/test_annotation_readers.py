"""The COCO JSON and VOC XML readers against files crafted by hand: ids that leave their folders, encodings that hide
a DOCTYPE, numbers Python cannot convert, nesting deeper than the stack, unhashable ids, FIFOs and sparse files.
Each bad file is one line; each bad entry is one counted corrupt sample, and the scan goes on."""

from __future__ import annotations

import codecs
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT
from tests.utils.data.special_files import fifos
from tests.utils.data.test_formats import NAMES, write_sets
from utils.data.annotations import AnnotationSplit
from utils.data.config import DataError, load_data_config
from utils.data.datasets import YoloDataset
from utils.data.voc import MAX_XML_BYTES, parse_voc, read_voc_xml

DOCTYPE = '<!DOCTYPE a [<!ENTITY x "yyyyyyyy">]>'


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_sets(tmp_path / "set", n_train=4, n_val=2)["voc"].parent


def voc_split(root: Path, listed: str | None = None) -> AnnotationSplit:
    ids = None
    if listed is not None:
        ids = root / "ids.txt"
        ids.write_text(listed)
    return AnnotationSplit("voc", root / "voc" / "train", root / "images" / "train", ids, tuple(NAMES))


def scan(split: AnnotationSplit) -> YoloDataset:
    return YoloDataset([split], img_size=64, nc=3)


def corrupt_lines(log: list[str]) -> list[str]:
    lines = [line for line in log if "ignoring corrupt" in line]
    assert all("\n" not in line and len(line) < 600 for line in lines), lines
    return lines


# ------------------------------------------------------------------------------------------------ VOC list ids
def test_voc_list_ids_that_leave_their_folders_are_corrupt_and_nothing_outside_is_read(root: Path,
                                                                                       yolo_log: list[str]) -> None:
    outside = root.parent / "x"
    outside.mkdir()
    (outside / "photo.xml").write_text((root / "voc" / "train" / "img_000.xml").read_text())
    (outside / "photo.jpg").write_bytes((root / "images" / "train" / "img_000.jpg").read_bytes())
    (root / "voc" / "train" / "link.xml").symlink_to(outside / "photo.xml")  # inside by name, outside by target
    split = voc_split(root, f"img_000\n../../../x/photo\n{outside / 'photo'}\nlink\nimg_002\n")
    dataset = scan(split)
    assert [Path(f).name for f in dataset.im_files] == ["img_000.jpg", "img_002.jpg"]
    assert dataset.scan.line() == "2 found, 0 missing, 0 empty, 3 corrupt"
    lines = corrupt_lines(yolo_log)
    assert sum("leads outside" in line for line in lines) == 3, lines
    assert not any(str(outside / "photo.jpg") == f for f in dataset.im_files)


def test_convert_never_writes_outside_out_nor_over_a_label_it_did_not_write(root: Path, tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    from utils.data.convert import main

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "photo.txt").write_text("mine\n")
    (victim / "photo.xml").write_text((root / "voc" / "train" / "img_000.xml").read_text())
    (victim / "photo.jpg").write_bytes((root / "images" / "train" / "img_000.jpg").read_bytes())
    listed = tmp_path / "ids.txt"
    listed.write_text("img_000\n../../../victim/photo\nimg_002\n")
    out = tmp_path / "out"
    args = ["--from", "voc", "--annotations", str(root / "voc" / "train"), "--images", str(root / "images" / "train"),
            "--list", str(listed), "--names", *NAMES, "--out", str(out)]
    assert main(args) == 0
    assert (victim / "photo.txt").read_text() == "mine\n"
    assert sorted(p.name for p in (out / "labels").iterdir()) == ["img_000.txt", "img_002.txt"]
    written = {p for p in tmp_path.rglob("*") if p.is_file()} - {p for p in root.rglob("*") if p.is_file()}
    assert all(out in p.parents or p in (victim / "photo.txt", victim / "photo.xml", victim / "photo.jpg", listed)
               for p in written), written
    assert main(args) == 0  # again: it may rewrite what it wrote itself
    (out / "labels" / "img_003.txt").write_text("someone else's\n")
    listed.write_text("img_003\n")
    capsys.readouterr()
    assert main(args) == 2
    error = capsys.readouterr().err.split("convert: error: ")[1]  # after the scan's progress bar
    assert "img_003.txt exists and was not written by" in error and error.count("\n") == 1 and error.endswith("\n")
    assert (out / "labels" / "img_003.txt").read_text() == "someone else's\n"
    assert not (out / "images" / "img_003.jpg").exists()  # nothing of a refused run is written


def test_convert_to_coco_never_replaces_a_file_it_did_not_write(root: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    from utils.data.convert import main

    target = tmp_path / "instances.json"
    target.write_text("precious")
    args = ["--from", "yolo", "--images", str(root / "images" / "train"), "--names", *NAMES, "--out", str(target)]
    assert main(args) == 2 and target.read_text() == "precious"
    assert "instances.json exists and was not written by" in capsys.readouterr().err
    target.unlink()
    assert main(args) == 0 and main(args) == 0  # its own file: rewritten
    assert len(json.loads(target.read_text())["images"]) == 4


# ------------------------------------------------------------------------------------------- VOC encodings
def _doc(body: str = "", declaration: str = "") -> str:
    return f'{declaration}{body}<annotation><filename>img_000.jpg</filename><object><name>&x;</name></object>' \
           '</annotation>' if body else f'{declaration}<annotation><filename>img_000.jpg</filename></annotation>'


@pytest.mark.parametrize("encoding, declared", [
    ("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", ""), ("utf-32", "UTF-32"), ("utf-32-be", ""),
    ("utf-8-sig", ""), ("utf-8", "UTF-8"), ("latin-1", "ISO-8859-1"), ("cp037", ""),
])
def test_a_doctype_is_refused_in_every_encoding(tmp_path: Path, encoding: str, declared: str) -> None:
    declaration = f'<?xml version="1.0" encoding="{declared}"?>' if declared else ""
    path = tmp_path / "a.xml"
    raw = _doc(DOCTYPE, declaration).encode(encoding)
    if encoding == "cp037":  # EBCDIC: the declaration in ASCII, then no byte of '<!DOCTYPE' is what it seems
        raw = b'<?xml version="1.0" encoding="cp037"?>' + _doc(DOCTYPE).encode("cp037")
    path.write_bytes(raw)
    with pytest.raises(ValueError) as info:
        read_voc_xml(path)
    assert "\n" not in str(info.value) and ("DOCTYPE" in str(info.value) or "encoding" in str(info.value)), info.value


@pytest.mark.parametrize("encoding, declared", [("utf-8", ""), ("utf-8-sig", ""), ("utf-8", "utf-8"),
                                                ("ascii", "US-ASCII"), ("latin-1", "ISO-8859-1"),
                                                ("latin-1", "latin1")])
def test_utf8_ascii_and_latin1_files_are_read(tmp_path: Path, encoding: str, declared: str) -> None:
    declaration = f"<?xml version='1.0' encoding='{declared}'?>\n" if declared else ""
    name = "caf\xe9" if encoding != "ascii" else "cafe"
    path = tmp_path / "a.xml"
    path.write_bytes(f"{declaration}<annotation><object><name>{name}</name></object></annotation>".encode(encoding))
    assert read_voc_xml(path).find("object/name").text == name


def test_other_encodings_are_refused_even_without_a_doctype(tmp_path: Path) -> None:
    for raw in (_doc().encode("utf-16"), b'<?xml version="1.0" encoding="cp1252"?>' + _doc().encode(),
                _doc().encode("utf-16-le")):
        (tmp_path / "a.xml").write_bytes(raw)
        with pytest.raises(ValueError, match="encoding|UTF-16|UTF-32"):
            read_voc_xml(tmp_path / "a.xml")


# ---------------------------------------------------------------------------------------- numbers and sizes
@pytest.mark.parametrize("width", ["1e999", "inf", "-inf", "nan", "1" * 5000, "-64", "64abc", "0x40", ""],
                         ids=["1e999", "inf", "-inf", "nan", "5000-digits", "-64", "64abc", "0x40", "empty"])
def test_a_bad_voc_size_is_one_corrupt_sample(root: Path, width: str, yolo_log: list[str]) -> None:
    xml = root / "voc" / "train" / "img_002.xml"
    xml.write_text(xml.read_text().replace("<width>64</width>", f"<width>{width}</width>"))
    assert scan(voc_split(root)).scan.line() == "3 found, 0 missing, 1 empty, 1 corrupt"
    assert len(corrupt_lines(yolo_log)) == 1


@pytest.mark.parametrize("value", ["1e999", "inf", "nan", "9" * 5000], ids=["1e999", "inf", "nan", "5000-digits"])
def test_a_bad_voc_corner_is_one_corrupt_sample(root: Path, value: str, yolo_log: list[str]) -> None:
    xml = root / "voc" / "train" / "img_002.xml"
    text = xml.read_text()
    start = text.index("<xmax>") + len("<xmax>")
    xml.write_text(text[:start] + value + text[text.index("</xmax>"):])
    assert scan(voc_split(root)).scan.line() == "3 found, 0 missing, 1 empty, 1 corrupt"
    assert len(corrupt_lines(yolo_log)) == 1


def test_a_sparse_voc_file_over_the_cap_is_refused_before_it_is_read(root: Path) -> None:
    """Peak memory in a child process: a 1 GB sparse XML file is refused from its size, never read."""
    big = root / "voc" / "train" / "img_002.xml"
    with open(big, "r+b") as f:
        f.truncate(1 << 30)
    code = ("import resource, sys; from pathlib import Path; from utils.data.voc import read_voc_xml\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "try:\n    read_voc_xml(Path(sys.argv[1]))\nexcept ValueError as e:\n    print('refused:', e)\n"
            "print('grew_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    out = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120).stdout
    assert f"refused: annotation file: 1.07 GB, more than the cap of {MAX_XML_BYTES / 1e6:.1f} MB" in out, out
    assert int(out.split("grew_kb")[1]) < 32 * 1024, out  # not a gigabyte


# ----------------------------------------------------------------------------------------------- COCO JSON
def coco_file(root: Path) -> Path:
    return root / "annotations" / "instances_train.json"


def coco_split(root: Path) -> AnnotationSplit:
    return AnnotationSplit("coco", coco_file(root), root / "images" / "train", None, tuple(NAMES))


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
    ('{"images": [], "categories": [], "x": ' + "1" * 5000 + "}", "a number of more than"),
    ('{"images": [], "categories": [{"id": ' + "7" * 4000 + ', "name": "a"}]}', "a number of more than"),
    ('{"images": [], "categories": [{"id": [1], "name": "a"}]}', "integer 'id'"),
    ('{"images": [], "categories": [{"id": 1e999, "name": "a"}]}', "integer 'id'"),
    ('{"images": [], "categories": [{"id": 1, "name": {"a": 1}}]}', "'name'"),
    ('{"images": [], "categories": [{"id": 1, "name": "' + "x" * 200 + '"}]}', "at most 128 characters"),
    ("\ufeff{}", "not a COCO annotation file"), ('{"images": []}\x00', "not valid JSON"),
    ("\xff\xfe{", "not UTF-8 text"),
], ids=["nested", "digits", "digits-in-id", "list-id", "inf-id", "dict-name", "long-name", "bom", "nul",
        "utf16-bom"])
def test_a_malformed_coco_file_is_one_line(root: Path, text: str, message: str) -> None:
    coco_file(root).write_bytes(text.encode("utf-8", "surrogateescape") if "\xff" not in text else
                                text.encode("latin-1"))
    with pytest.raises(DataError) as info:
        scan(coco_split(root))
    assert message in str(info.value) and "\n" not in str(info.value) and len(str(info.value)) < 600, info.value


@pytest.mark.parametrize("edit", [
    lambda d: d["images"][2].update(width=float("inf")),
    lambda d: d["images"][2].update(width=10 ** 40),
    lambda d: d["images"][2].update(id=[1, 2]),
    lambda d: d["images"][2].update(id={"a": 1}),
    lambda d: d["images"][2].update(file_name=[[[["deep"]]]] * 1000),
    lambda d: d["annotations"][1].update(category_id=[5]),
    lambda d: d["annotations"][1].update(bbox=[1, 2, 10 ** 60, 4]),
    lambda d: d["annotations"][1].update(bbox=[1, 2, float("inf"), 4]),
    lambda d: d["annotations"][1].update(bbox={"x": 1}),
    lambda d: d["annotations"][1].update(iscrowd=[1]),
], ids=["width-inf", "width-40-digits", "id-list", "id-dict", "file_name-nested", "category_id-list",
        "bbox-60-digits", "bbox-inf", "bbox-dict", "iscrowd-list"])
def test_a_bad_coco_entry_is_one_corrupt_sample(root: Path, edit, yolo_log: list[str]) -> None:
    doc = json.loads(coco_file(root).read_text())
    for annotation in doc["annotations"]:
        annotation["iscrowd"] = 0
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] in (1000, 1014)][:2]
    doc["annotations"][1]["image_id"] = 1014  # image 2
    edit(doc)
    coco_file(root).write_text(json.dumps(doc, allow_nan=True))
    summary = scan(coco_split(root)).scan
    assert (summary.corrupt, summary.found + summary.corrupt + summary.missing) == (1, 4), summary.line()
    assert len(corrupt_lines(yolo_log)) == 1


def test_an_unhashable_annotation_image_id_names_no_image(root: Path, yolo_log: list[str]) -> None:
    doc = json.loads(coco_file(root).read_text())
    doc["annotations"][0]["image_id"] = [1000]
    coco_file(root).write_text(json.dumps(doc))
    assert scan(coco_split(root)).scan.corrupt == 0
    assert any("1 annotations name no listed image (ignored)" in line for line in yolo_log)


# -------------------------------------------------------------------------------------------------- FIFOs
@pytest.mark.timeout(60)
def test_fifos_in_place_of_annotation_files_and_images_are_refused(root: Path, yolo_log: list[str]) -> None:
    images = root / "images" / "train"
    (images / "img_003.jpg").unlink()
    (root / "voc" / "train" / "img_003.xml").unlink()  # no XML, no image: VOC falls back to img_003.jpg
    with fifos(images / "img_003.jpg", root / "fifo-ids.txt", root / "fifo.json"):
        dataset = scan(voc_split(root))
        assert dataset.scan.line() == "3 found, 0 missing, 1 empty, 1 corrupt"
        assert any("img_003.jpg: ignoring corrupt image/label: not a regular file (a FIFO)" in line
                   for line in yolo_log)
        doc = json.loads(coco_file(root).read_text())
        assert doc["images"][3]["file_name"] == "img_003.jpg"
        assert scan(coco_split(root)).scan.corrupt == 1  # COCO's file_name names the FIFO
        listed = AnnotationSplit("voc", root / "voc" / "train", images, root / "fifo-ids.txt", tuple(NAMES))
        with pytest.raises(DataError, match="fifo-ids.txt: cannot read the image list: not a regular file .a FIFO."):
            parse_voc(listed)
        with pytest.raises(DataError, match="fifo.json: cannot read the annotation file: not a regular file"):
            scan(AnnotationSplit("coco", root / "fifo.json", images, None, tuple(NAMES)))


def test_a_yaml_split_with_an_escaping_list_is_read_safely(root: Path, yolo_log: list[str]) -> None:
    """The same ids through a data YAML's split mapping (its 'list')."""
    (root / "ids.txt").write_text("img_000\n../../../../../etc/passwd\n")
    data = yaml.safe_load((root / "voc.yaml").read_text())
    data["train"] = {"voc": "voc/train", "images": "images/train", "list": "ids.txt"}
    (root / "voc.yaml").write_text(yaml.safe_dump(data))
    dataset = YoloDataset(load_data_config(root / "voc.yaml").train, img_size=64, nc=3)
    assert dataset.scan.line() == "1 found, 0 missing, 0 empty, 1 corrupt"
    assert [line.split("ignoring corrupt image/label: ")[1] for line in corrupt_lines(yolo_log)] == [
        f"VOC image id '../../../../../etc/passwd' leads outside {(root / 'images' / 'train').resolve()}; refused"]


def test_bom_and_utf16_list_files_are_read_or_refused_in_one_line(root: Path) -> None:
    (root / "ids.txt").write_bytes(codecs.BOM_UTF8 + b"img_000\nimg_002\n")
    split = AnnotationSplit("voc", root / "voc" / "train", root / "images" / "train", root / "ids.txt", tuple(NAMES))
    assert [Path(e.path).name for e in parse_voc(split)[0]] == ["img_000.jpg", "img_002.jpg"]
    (root / "ids.txt").write_bytes("img_000\n".encode("utf-16"))
    with pytest.raises(DataError, match="ids.txt: cannot read the image list"):
        parse_voc(split)
    assert os.path.isfile(root / "ids.txt")


def test_an_oversized_list_or_label_file_is_refused_from_its_size(root: Path, yolo_log: list[str]) -> None:
    from utils.data.voc import MAX_LIST_BYTES

    with open(root / "ids.txt", "wb") as f:
        f.truncate(MAX_LIST_BYTES + 1)
    split = AnnotationSplit("voc", root / "voc" / "train", root / "images" / "train", root / "ids.txt", tuple(NAMES))
    with pytest.raises(DataError, match="ids.txt: cannot read the image list: 67.1 MB, more than the cap of 67.1 MB"):
        parse_voc(split)
    with open(root / "labels" / "train" / "img_000.txt", "r+b") as f:
        f.truncate(9 << 20)  # YOLO labels: 8 MB at most
    assert YoloDataset(root / "images" / "train", img_size=64, nc=3).scan.corrupt == 1
    assert any("img_000.jpg: ignoring corrupt image/label: label file: 9.4 MB, more than the cap of 8.4 MB" in line
               for line in yolo_log)
