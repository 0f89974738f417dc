"""Pascal VOC XML: a folder of ``<annotation>`` files (one per image) read as a split.

VOC corners are 1-based pixel indices, both ends inclusive: a box ``xmin..xmax`` covers the continuous span
``[xmin - 1, xmax]`` in 0-based pixels, so ``x1 = xmin - 1`` and ``x2 = xmax``. An object's ``name`` is looked
up in the data YAML's ``names``. The split is the ids of its ``list`` file (VOC's ``ImageSets/Main/*.txt``), else
every image in its image folder. ``difficult`` objects are left out of training unless the split says
``keep_crowd: true``; they become the image's ignore regions (VOC's own evaluation ignores detections of them).
An image listed without an XML file is a background image (counted 'missing', as a YOLO image without a label
file is). XML with a DOCTYPE or entities is refused.
"""

from __future__ import annotations

import contextlib
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from utils.data.annotations import IGNORE_COLUMNS, AnnotationSplit, ImageEntry, crowd_note, path_inside
from utils.data.config import DataError
from utils.paths import IMG_SUFFIXES

MAX_XML_BYTES = 4 << 20  # one image's annotation file; larger ones are refused, not parsed


def voc_ids(split: AnnotationSplit) -> list[str]:
    """The split's image ids: the lines of its list file, else the stems of the images in the image folder (as a
    YOLO split is its images: one without an XML file is a background)."""
    if split.image_list is None:
        return sorted({p.stem for p in split.images.glob("*") if p.suffix.lower() in IMG_SUFFIXES})
    try:
        return [line.split()[0] for line in split.image_list.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{split.image_list}: cannot read the image list ({type(e).__name__})") from None


def voc_files(split: AnnotationSplit) -> list[str]:
    """A VOC split's cache depends on its list file and every XML file it names."""
    listed = [str(split.image_list)] if split.image_list else []
    return listed + [str(split.annotations / f"{i}.xml") for i in voc_ids(split)]


def _text(node: ET.Element | None, tag: str) -> str:
    child = node.find(tag) if node is not None else None
    if child is None or child.text is None:
        raise ValueError(f"<{tag}> missing")
    return child.text.strip()


def _image_path(split: AnnotationSplit, image_id: str, root: ET.Element | None) -> Path:
    """The XML's <filename> inside the image folder when that file exists, else the id with an image suffix."""
    named = path_inside(split.images, root.findtext("filename", "").strip()) if root is not None else None
    if named is not None and named.is_file():
        return named
    found = [split.images / f"{image_id}{s}" for s in (".jpg", *sorted(IMG_SUFFIXES)) if
             (split.images / f"{image_id}{s}").is_file()]
    return found[0] if found else split.images / f"{image_id}.jpg"


def _corners(obj: ET.Element) -> list[float]:
    """An object's 1-based inclusive ``bndbox`` as 0-based corners [x1, y1, x2, y2]; ValueError when malformed."""
    box = obj.find("bndbox")
    xmin, ymin, xmax, ymax = (float(_text(box, k)) for k in ("xmin", "ymin", "xmax", "ymax"))
    return [xmin - 1, ymin - 1, xmax, ymax]


def read_voc_xml(path: Path) -> ET.Element:
    """The parsed <annotation>; ValueError (one line) for a file that is not safe, valid VOC XML."""
    raw = path.read_bytes()
    if len(raw) > MAX_XML_BYTES:
        raise ValueError(f"annotation file larger than {MAX_XML_BYTES >> 20} MB")
    if b"<!DOCTYPE" in raw or b"<!ENTITY" in raw:
        raise ValueError("XML with a DOCTYPE or entity declarations is refused")
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as e:
        raise ValueError(f"not valid XML ({e})") from None
    if root.tag != "annotation":
        raise ValueError(f"root element <{root.tag}>, expected <annotation>")
    return root


def voc_entry(split: AnnotationSplit, image_id: str) -> tuple[ImageEntry, int]:
    """One image's entry and how many difficult objects were left out."""
    xml = split.annotations / f"{image_id}.xml"
    if not xml.is_file():
        return ImageEntry(str(_image_path(split, image_id, None)), no_labels="missing"), 0
    root = None
    try:
        root = read_voc_xml(xml)
        size = root.find("size")
        declared = (int(float(_text(size, "width"))), int(float(_text(size, "height")))) if size is not None \
            else None
        boxes, classes, ignore, difficult = [], [], [], 0
        for obj in root.iter("object"):
            name = _text(obj, "name")
            if name not in split.names:
                raise ValueError(f"object name '{name}' is not in the data YAML's names")
            if (obj.findtext("difficult") or "0").strip() not in ("0", "") and not split.keep_crowd:
                difficult += 1
                with contextlib.suppress(ValueError):  # an ignore region; a bad one is dropped, not fatal
                    ignore.append([split.names.index(name), *_corners(obj), 0.0])
                continue
            boxes.append(_corners(obj))
            classes.append(split.names.index(name))
    except (OSError, ValueError) as e:
        return ImageEntry(str(_image_path(split, image_id, root)), problem=f"{xml.name}: {e}"), 0
    entry = ImageEntry(str(_image_path(split, image_id, root)), np.array(boxes, np.float64).reshape(-1, 4),
                       np.array(classes, np.int64), declared,
                       ignore=np.array(ignore, np.float64).reshape(-1, IGNORE_COLUMNS))
    return entry, difficult


def parse_voc(split: AnnotationSplit) -> tuple[list[ImageEntry], str]:
    """The registered parser of ``voc:`` splits: one entry per listed image, sorted by path."""
    if not split.names:
        raise DataError(f"{split}: a VOC split needs the data YAML's 'names' (object names map to classes)")
    results = [voc_entry(split, i) for i in voc_ids(split)]
    entries = sorted((e for e, _ in results), key=lambda e: e.path)
    return entries, crowd_note(sum(d for _, d in results), "difficult objects")
