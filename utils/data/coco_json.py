"""COCO annotation JSON: read as a split (boxes, contiguous classes, crowd rule), the original ids for
``--save-json``, and written from checked YOLO labels (``python -m utils.data.convert --to coco``).

Classes are the file's categories in ascending id order (COCO's 80 of 91 ids become 0..79); a data YAML's
``names`` must list the same names in that order. ``bbox`` is [x, y, w, h] from the top-left corner in pixels.
Crowd boxes (``iscrowd: 1``) are left out of training unless the split says ``keep_crowd: true``; they become the
image's ignore regions, and evaluation ignores detections that land on them, as COCOeval does. An image with no
annotation is a background image (counted 'empty').
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from utils.data.annotations import (
    IGNORE_COLUMNS,
    AnnotationSplit,
    ImageEntry,
    crowd_note,
    dimension,
    path_inside,
    short,
)
from utils.data.errors import MAX_NAME_LENGTH, DataError
from utils.data.regular_files import read_regular

ExtrasReader = Callable[[ImageEntry, list[dict]], None]  # fills entry.extras from its boxes' annotations
MAX_COCO_BYTES = 16 << 30  # an annotation file (COCO train2017: 448 MB); larger ones are refused from their size
MAX_DIGITS = 64  # an integer written with more digits is refused before int() sees it (Python stops at 4300)


def _bounded_int(text: str) -> int:
    if len(text) > MAX_DIGITS:
        raise ValueError(f"a number of more than {MAX_DIGITS} digits")
    return int(text)


def read_coco(path: Path) -> dict:
    """The parsed file, checked to be a COCO annotation file; one DataError line otherwise (not a regular file,
    not UTF-8 JSON, nested deeper than Python's recursion limit, integers of more than MAX_DIGITS digits)."""
    try:
        text = read_regular(path, MAX_COCO_BYTES).decode("utf-8-sig")
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else \
            f"not UTF-8 text ({e.reason} at byte {e.start})" if isinstance(e, UnicodeDecodeError) else str(e)
        raise DataError(f"{path}: cannot read the annotation file: {reason}") from None
    try:
        data = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); fix or re-export "
                        "the annotation file") from None
    except RecursionError:
        raise DataError(f"{path}: not valid JSON for this reader (nested deeper than Python's recursion limit)") \
            from None
    except ValueError as e:  # from _bounded_int
        raise DataError(f"{path}: not valid JSON for this reader ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
            or not isinstance(data.get("categories"), list):
        raise DataError(f"{path}: not a COCO annotation file (needs 'images' and 'categories' lists)")
    if not isinstance(data.get("annotations", []), list):
        raise DataError(f"{path}: 'annotations' must be a list")
    return data


def category_order(data: dict, path: Path, names: Sequence[str] = ()) -> tuple[list[int], list[str]]:
    """(category ids, names) in ascending id order: class i is category ids[i]. With ``names`` (the data
    YAML's), they must agree with the file's."""
    try:
        categories = sorted((_category_id(c["id"]), _category_name(c["name"])) for c in data["categories"])
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{path}: every category needs an integer 'id' and a 'name' (a line of at most "
                        f"{MAX_NAME_LENGTH} characters)") from None
    ids, file_names = [c[0] for c in categories], [c[1] for c in categories]
    if len(set(ids)) != len(ids):
        raise DataError(f"{path}: category ids repeat")
    if names and list(names) != file_names:
        if len(names) != len(file_names):
            raise DataError(f"{path}: {len(file_names)} categories, but the data YAML lists {len(names)} names; "
                            "list the file's category names in ascending id order")
        i = next(i for i, (a, b) in enumerate(zip(names, file_names)) if a != b)
        raise DataError(f"{path}: class {i} is category {ids[i]} '{file_names[i]}' in the file but '{names[i]}' in "
                        "the data YAML; list the file's category names in ascending id order")
    return ids, file_names


def _category_id(value: Any) -> int:
    """An integer category id (an integral float too, as some exporters write); TypeError/ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value != int(value):
        raise ValueError("not an integer")
    return int(value)


def _category_name(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH or "\n" in value:
        raise ValueError("not a name")
    return value


def _key(value: Any) -> int | str | None:
    """An image id, category id or image reference usable as a key (int or str, not bool); None otherwise."""
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def _image_entries(data: dict, locate: Callable[[Any], Path | None]) -> dict[Any, ImageEntry]:
    entries: dict[Any, ImageEntry] = {}
    for index, image in enumerate(data["images"]):
        image = image if isinstance(image, dict) else {}
        path, problem = locate(image.get("file_name")), ""
        try:
            size = (dimension(image.get("width")), dimension(image.get("height")))
        except ValueError:
            size, problem = None, "image entry without integer 'width' and 'height'"
        if path is None:
            path, problem = Path(f"<images[{index}]>"), f"bad file_name {short(image.get('file_name'))}"
        key = _key(image.get("id"))
        if key is None or key in entries:
            problem = f"image id {short(image.get('id'))} missing or repeated"
            key = ("bad", index)
        entries[key] = ImageEntry(str(path), size=size, problem=problem)
    return entries


def _box(annotation: dict) -> list[float] | None:
    box = annotation.get("bbox")
    if not isinstance(box, list) or len(box) != 4 or not all(isinstance(v, int | float) for v in box):
        return None
    try:
        x, y, w, h = (float(v) for v in box)
    except OverflowError:  # an integer too large for a float
        return None
    return [x, y, x + w, y + h]


def coco_entries(data: dict, path: Path, images: Path, names: Sequence[str] = (), keep_crowd: bool = False,
                 locate: Callable[[Any], Path | None] | None = None,
                 extras: ExtrasReader | None = None) -> tuple[list[ImageEntry], list[str], str]:
    """One entry per image of a parsed COCO file (sorted by path), the class names, and a note on what was left
    out. ``locate`` maps a ``file_name`` to its path (default: inside ``images``, never outside it). ``extras``
    (a task's: ``extras(entry, annotations)``, the annotations of the entry's boxes in their order) fills
    ``entry.extras`` from what the annotations add (a segmenter's outlines); it sets ``entry.problem`` for a
    malformed one, which makes the image corrupt, as a bad ``bbox`` does."""
    ids, file_names = category_order(data, path, names)
    class_of = {cid: i for i, cid in enumerate(ids)}
    entries = _image_entries(data, locate or (lambda name: path_inside(images, name)))
    boxes: dict[Any, list] = {key: [] for key in entries}
    crowds: dict[Any, list] = {key: [] for key in entries}
    orphans = 0
    for annotation in data.get("annotations", []):
        annotation = annotation if isinstance(annotation, dict) else {}
        image_id = _key(annotation.get("image_id"))
        entry = entries.get(image_id) if image_id is not None else None
        if entry is None:
            orphans += 1
            continue
        box, cls, crowd = _box(annotation), class_of.get(_key(annotation.get("category_id"))), \
            annotation.get("iscrowd", 0)
        if crowd not in (0, 1):
            entry.problem = entry.problem or f"annotation {short(annotation.get('id'))} has a bad iscrowd"
        elif crowd and not keep_crowd:  # an ignore region; a bad one is dropped, not fatal
            crowds[image_id].append([cls, *box, 1.0] if box is not None and cls is not None else None)
        elif box is None or cls is None:
            what = "bbox" if box is None else f"category_id {short(annotation.get('category_id'))}"
            entry.problem = entry.problem or f"annotation {short(annotation.get('id'))} has a bad {what}"
        else:
            boxes[image_id].append((cls, box, annotation))
    for key, entry in entries.items():
        if boxes[key]:
            entry.classes = np.array([c for c, _, _ in boxes[key]], np.int64)
            entry.boxes = np.array([b for _, b, _ in boxes[key]], np.float64)
        if extras is not None and not entry.problem:
            extras(entry, [a for _, _, a in boxes[key]])
        entry.ignore = np.array([r for r in crowds[key] if r is not None], np.float64).reshape(-1, IGNORE_COLUMNS)
    crowd = sum(len(c) for c in crowds.values())
    notes = [crowd_note(crowd, "crowd boxes"), f"{orphans} annotations name no listed image (ignored)" if orphans
             else ""]
    return sorted(entries.values(), key=lambda e: e.path), file_names, "; ".join(n for n in notes if n)


def parse_coco(split: AnnotationSplit) -> tuple[list[ImageEntry], str]:
    """The registered parser of ``coco:`` splits."""
    entries, _, note = coco_entries(read_coco(split.annotations), split.annotations, split.images, split.names,
                                    split.keep_crowd)
    return entries, note


def parse_coco_with(extras: ExtrasReader) -> Callable[[AnnotationSplit], tuple[list[ImageEntry], str]]:
    """``parse_coco`` whose entries also get what ``extras`` reads from their annotations (a task's parser)."""

    def parse(split: AnnotationSplit) -> tuple[list[ImageEntry], str]:
        entries, _, note = coco_entries(read_coco(split.annotations), split.annotations, split.images, split.names,
                                        split.keep_crowd, extras=extras)
        return entries, note

    return parse


def coco_files(split: AnnotationSplit) -> list[str]:
    """A COCO split's cache depends on its one JSON file."""
    return [str(split.annotations)]


@dataclass
class CocoIds:
    """The original ids of a COCO split, for ``--save-json``: image id by image path, category id by class."""

    annotations: Path
    image_ids: dict[str, int | str]
    category_ids: list[int]

    def image_id(self, path: str) -> int | str:
        """The file's id for this image (the file-stem rule for an image it does not list)."""
        stem = Path(path).stem
        return self.image_ids.get(str(path), int(stem) if stem.isnumeric() else stem)


def coco_ids(split: AnnotationSplit) -> CocoIds:
    """Read a COCO split's image and category ids (test.py --save-json writes them)."""
    data = read_coco(split.annotations)
    ids, _ = category_order(data, split.annotations, split.names)
    image_ids = {}
    for image in data["images"]:
        path = path_inside(split.images, image.get("file_name")) if isinstance(image, dict) else None
        if path is not None and _key(image.get("id")) is not None:
            image_ids[str(path)] = image["id"]
    return CocoIds(split.annotations, image_ids, ids)


def coco_document(im_files: Sequence[str], labels: Sequence[np.ndarray], shapes: np.ndarray, names: Sequence[str],
                  images: Path) -> dict:
    """A COCO annotation file for checked YOLO labels: image ids 1..n in the given order, category ids 1..nc
    (class i is id i + 1), file names relative to ``images``."""
    doc: dict = {"images": [], "annotations": [], "categories": [{"id": i + 1, "name": n} for i, n in
                                                                  enumerate(names)]}
    for image_id, (file, rows, (w, h)) in enumerate(zip(im_files, labels, shapes.tolist()), 1):
        doc["images"].append({"id": image_id, "file_name": Path(file).relative_to(images).as_posix(), "width": w,
                              "height": h})
        for cls, cx, cy, bw, bh in rows.astype(np.float64).tolist():
            box = [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
            doc["annotations"].append({"id": len(doc["annotations"]) + 1, "image_id": image_id,
                                       "category_id": int(cls) + 1, "bbox": box, "area": box[2] * box[3],
                                       "iscrowd": 0})
    return doc
