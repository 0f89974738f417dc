"""Fuzzers for the COCO JSON and VOC XML readers, in the style of tests/utils/weights/test_fuzz.py: documents
assembled from a fixed seed (random structure, deep nesting, huge and non-finite numbers, odd encodings, unhashable
ids, ids and file names that leave their folders). Each must end as parsed entries, each of which the scan's check
turns into a sample or one counted corrupt sample, or as one DataError line; never another exception, never a path
outside the image folder, nothing written.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import cv2
import numpy as np

from utils.data.annotations import AnnotationSplit, ImageEntry, check_entry
from utils.data.coco_json import parse_coco
from utils.data.config import DataError
from utils.data.voc import parse_voc

SEED, CASES = 20261231, 300
NAMES = ("circle", "square", "triangle")
FILE_NAMES = ["img_0.jpg", "img_1.jpg", "../img_0.jpg", "/etc/passwd", "sub/../img_1.jpg", "link.jpg", "", ".",
              "img_0.jpg\x00", "a" * 300, "pipe.jpg", "missing.jpg"]
NUMBERS = ["0", "1", "-1", "64", "48", "1e999", "-1e999", "NaN", "Infinity", "1" * 60, "9" * 70, "3.5", "1e-320",
           "2147483648", "-0"]


def make_images(folder: Path) -> None:
    """Two real images, a symbolic link leading out of the folder, a file outside it."""
    folder.mkdir(parents=True)
    for i, (h, w) in enumerate(((48, 64), (64, 48))):
        cv2.imwrite(str(folder / f"img_{i}.jpg"), np.full((h, w, 3), 90 + 40 * i, np.uint8))
    (folder.parent / "outside.jpg").write_bytes((folder / "img_0.jpg").read_bytes())
    (folder / "link.jpg").symlink_to(folder.parent / "outside.jpg")


class JsonFuzzer:
    """Random COCO-like documents as JSON text: right and wrong types everywhere, raw numbers Python's json turns
    into inf, nan or huge ints, nesting deeper than the stack, and damaged text."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def leaf(self) -> str:
        r = self.rng
        return r.choice([lambda: r.choice(NUMBERS), lambda: json.dumps(r.choice(FILE_NAMES)),
                         lambda: json.dumps(r.choice(NAMES)), lambda: r.choice(["true", "false", "null"]),
                         lambda: "[]", lambda: "{}", lambda: json.dumps(r.randint(-3, 1010))])()

    def value(self, depth: int) -> str:
        r = self.rng
        if depth <= 0 or r.random() < 0.4:
            return self.leaf()
        if r.random() < 0.5:
            return "[" + ", ".join(self.value(depth - 1) for _ in range(r.randint(0, 3))) + "]"
        keys = ["id", "file_name", "width", "height", "image_id", "category_id", "bbox", "iscrowd", "name", "x"]
        return "{" + ", ".join(f'"{r.choice(keys)}": {self.value(depth - 1)}' for _ in range(r.randint(0, 4))) + "}"

    def image(self, index: int) -> str:
        r = self.rng
        fields = {"id": r.choice([str(1000 + index), "[1]", '{"a": 1}', "null", '"x"', "1e999", "true"]),
                  "file_name": r.choice([json.dumps(r.choice(FILE_NAMES)), "[\"img_0.jpg\"]", "7"]),
                  "width": r.choice(NUMBERS + ["[64]", '"64"']), "height": r.choice(NUMBERS + ['"48"'])}
        return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items() if r.random() < 0.9) + "}"

    def annotation(self) -> str:
        r = self.rng
        bbox = r.choice(["[1, 2, 10, 12]", "[1, 2, 1e999, 4]", f"[1, 2, {'7' * 60}, 4]", "[1, 2]", '"box"',
                         "[NaN, 0, 1, 1]", "[-5, -5, 100, 100]", self.value(2)])
        fields = {"image_id": r.choice(["1000", "1001", "[1000]", '{"id": 1}', "1e999", "99", self.leaf()]),
                  "category_id": r.choice(["2", "5", "9", "[5]", "null", "5.0", self.leaf()]),
                  "bbox": bbox, "iscrowd": r.choice(["0", "1", "[1]", "2", "true", "0.0"]), "id": self.leaf()}
        return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items() if r.random() < 0.9) + "}"

    def document(self) -> bytes:
        r = self.rng
        good = '[{"id": 2, "name": "circle"}, {"id": 5, "name": "square"}, {"id": 9, "name": "triangle"}]'
        categories = good if r.random() < 0.75 else r.choice(['[{"id": [2], "name": "circle"}]', self.value(2),
                                                               '[{"id": 2, "name": {}}]', '[{"id": 1e999}]'])
        parts = {"images": "[" + ", ".join(self.image(i) for i in range(r.randint(0, 4))) + "]",
                 "annotations": "[" + ", ".join(self.annotation() for _ in range(r.randint(0, 6))) + "]",
                 "categories": categories}
        if r.random() < 0.1:
            parts[r.choice(list(parts))] = self.value(4)
        text = "{" + ", ".join(f'"{k}": {v}' for k, v in parts.items() if r.random() < 0.95) + "}"
        return self.damage(text)

    def damage(self, text: str) -> bytes:
        r = self.rng
        roll = r.random()
        if roll < 0.05:
            depth = r.choice([500, 5000, 100_000])
            text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
        elif roll < 0.1:
            text = text[:r.randint(0, len(text))]
        elif roll < 0.15:
            return text.encode(r.choice(["utf-16", "utf-32", "utf-8-sig", "latin-1"]), "replace")
        elif roll < 0.2:
            text = text.replace('"', "'", 1)
        return text.encode("utf-8", "surrogatepass")


class XmlFuzzer:
    """Random VOC-like XML: any nesting of the tags VOC uses, numbers Python cannot convert, names outside the data
    set, DOCTYPEs and entities in every encoding, truncation, deep nesting."""

    TAGS = ["object", "name", "bndbox", "xmin", "ymin", "xmax", "ymax", "size", "width", "height", "difficult",
            "filename", "annotation"]

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def text(self) -> str:
        r = self.rng
        return r.choice([r.choice(NUMBERS), r.choice(NAMES), r.choice(FILE_NAMES).replace("\x00", ""), "",
                         "&amp;", "&x;", "&#38;#38;", "\u00e9t\u00e9"])

    def element(self, depth: int) -> str:
        r = self.rng
        tag = r.choice(self.TAGS)
        if depth <= 0 or r.random() < 0.3:
            return f"<{tag}>{self.text()}</{tag}>"
        return f"<{tag}>" + "".join(self.element(depth - 1) for _ in range(r.randint(0, 4))) + f"</{tag}>"

    def good_object(self) -> str:
        r = self.rng
        corners = [r.choice(NUMBERS + ["5", "20", "30"]) for _ in range(4)] if r.random() < 0.3 else \
            ["3", "4", "30", "40"]
        box = "".join(f"<{k}>{v}</{k}>" for k, v in zip(("xmin", "ymin", "xmax", "ymax"), corners))
        return f"<object><name>{r.choice(NAMES * 3 + ('dog',))}</name><difficult>{r.choice('001')}</difficult>" \
               f"<bndbox>{box}</bndbox></object>"

    def document(self, width: int, height: int) -> bytes:
        """A document for an image of ``width`` x ``height``: about a third well formed with the right size."""
        r = self.rng
        right = r.random() < 0.35
        w, h = (width, height) if right else (r.choice(NUMBERS), r.choice(NUMBERS))
        size = f"<size><width>{w}</width><height>{h}</height></size>" if right or r.random() < 0.8 else ""
        body = "".join(self.good_object() if right or r.random() < 0.6 else self.element(3)
                       for _ in range(r.randint(0, 4)))
        text = f"<annotation><filename>{r.choice(FILE_NAMES).replace(chr(0), '')}</filename>{size}{body}" \
               "</annotation>"
        roll = r.random() if not right else 1.0
        if roll < 0.15:
            text = '<!DOCTYPE a [<!ENTITY x "' + "y" * 50 + '"><!ENTITY z "&x;&x;&x;&x;">]>' + text
        elif roll < 0.2:
            text = "<annotation>" * 20_000 + "</annotation>" * 20_000
        elif roll < 0.25:
            text = text[:r.randint(0, len(text))]
        encoding = r.choice(["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32", "latin-1",
                             "cp037"])
        declared = r.choice(["", "", encoding.replace("-sig", ""), "utf-8", "ISO-8859-1", "bogus", "UTF-16"])
        prefix = f'<?xml version="1.0" encoding="{declared}"?>' if declared else ""
        return (prefix + text).encode(encoding, "replace") if encoding != "cp037" else \
            prefix.encode() + text.encode("cp037", "replace")

    def ids(self) -> str:
        r = self.rng
        choices = ["img_0", "img_1", "../img_0", "../../outside", "/etc/passwd", "link", "sub/../img_1", "a" * 300,
                   "x\x00y", "\u00e9", "img_0 extra column", "..", "."]
        return "\n".join(r.choice(choices) for _ in range(r.randint(0, 5))) + "\n"


def checked(entries: list[ImageEntry], images: Path) -> list[str]:
    """Each entry through the scan's check; returns the states. Asserts the invariants of a parsed entry."""
    states = []
    for entry in entries:
        assert isinstance(entry, ImageEntry) and "\n" not in entry.problem and len(entry.problem) < 600, entry
        if not entry.problem and Path(entry.path).exists():
            resolved = Path(entry.path).resolve()
            assert images.resolve() in resolved.parents, entry.path  # never a file outside the image folder
        labels, shape, state, _, message, repaired = check_entry((entry.path, entry, len(NAMES), None))
        assert state in ("found", "missing", "empty", "corrupt") and "\n" not in message and not repaired
        assert state != "corrupt" or message, entry
        states.append(state)
    return states


def refused_in_one_line(error: DataError, path: Path) -> None:
    assert "\n" not in str(error) and str(path) in str(error) and len(str(error)) < 600, str(error)


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_fuzzed_coco_files_parse_count_or_refuse_in_one_line(tmp_path: Path) -> None:
    images = tmp_path / "images"
    make_images(images)
    path = tmp_path / "instances.json"
    fuzzer, outcomes = JsonFuzzer(random.Random(SEED)), {"refused": 0, "parsed": 0, "corrupt": 0}
    for _ in range(CASES):
        path.write_bytes(fuzzer.document())
        before = snapshot(tmp_path)
        try:
            entries, _ = parse_coco(AnnotationSplit("coco", path, images, None, NAMES))
        except DataError as e:
            refused_in_one_line(e, path)
            outcomes["refused"] += 1
            continue
        states = checked(entries, images)
        outcomes["parsed"] += 1
        outcomes["corrupt"] += states.count("corrupt")
        assert snapshot(tmp_path) == before
    assert all(outcomes.values()), outcomes  # the fuzzer reaches every outcome


def test_fuzzed_voc_files_and_lists_parse_count_or_refuse_in_one_line(tmp_path: Path) -> None:
    images, annotations = tmp_path / "JPEGImages", tmp_path / "Annotations"
    make_images(images)
    annotations.mkdir()
    (tmp_path / "outside.xml").write_text("<annotation><object><name>circle</name></object></annotation>")
    fuzzer, outcomes = XmlFuzzer(random.Random(SEED)), {"refused": 0, "found": 0, "corrupt": 0, "doctype": 0}
    for case in range(CASES):
        for i, (w, h) in enumerate(((64, 48), (48, 64))):
            (annotations / f"img_{i}.xml").write_bytes(fuzzer.document(w, h))
        listed = tmp_path / "ids.txt"
        listed.write_bytes(fuzzer.ids().encode("utf-8") if case % 7 else fuzzer.ids().encode("utf-16"))
        split = AnnotationSplit("voc", annotations, images, listed if case % 3 else None, NAMES, bool(case % 2))
        before = snapshot(tmp_path)
        try:
            entries, _ = parse_voc(split)
        except DataError as e:
            refused_in_one_line(e, listed)
            outcomes["refused"] += 1
            continue
        states = checked(entries, images)
        outcomes["found"] += states.count("found")
        outcomes["corrupt"] += states.count("corrupt")
        outcomes["doctype"] += sum("DOCTYPE" in e.problem or "encoding" in e.problem for e in entries)
        assert not any("y" * 50 in str(e.classes) for e in entries)  # no entity ever expanded
        assert snapshot(tmp_path) == before
    assert all(outcomes.values()), outcomes

