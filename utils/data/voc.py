"""Pascal VOC XML: a folder of ``<annotation>`` files (one per image) read as a split.

VOC corners are 1-based pixel indices, both ends inclusive: a box ``xmin..xmax`` covers the continuous span
``[xmin - 1, xmax]`` in 0-based pixels, so ``x1 = xmin - 1`` and ``x2 = xmax``. An object's ``name`` is looked
up in the data YAML's ``names``. The split is the ids of its ``list`` file (VOC's ``ImageSets/Main/*.txt``), else
every image in its image folder. ``difficult`` objects are left out of training unless the split says
``keep_crowd: true``; they become the image's ignore regions (VOC's own evaluation ignores detections of them).
An image listed without an XML file is a background image (counted 'missing', as a YOLO image without a label
file is). A listed id must keep its XML file and its image inside their folders; an XML file is read only when it
is a regular file of at most MAX_XML_BYTES, in UTF-8, ASCII or Latin-1, without a DOCTYPE or entities; each
refusal makes that one image corrupt (counted), never the whole scan.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import xml.etree.ElementTree as ET
from pathlib import Path

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
from utils.data.errors import DataError
from utils.data.regular_files import FileRefused, read_regular
from utils.errors import UserError
from utils.paths import IMG_SUFFIXES, confined

MAX_XML_BYTES = 4 << 20  # one image's annotation file; larger ones are refused from their size, never read
MAX_LIST_BYTES = 64 << 20  # an image-id list (VOC2012 trainval: 11540 ids, 130 kB)
# The encodings read (the name an XML declaration gives -> Python's codec); every other one is refused, so the text
# checked for a DOCTYPE is exactly the text parsed.
ENCODINGS = {"utf-8": "utf-8", "utf8": "utf-8", "us-ascii": "ascii", "ascii": "ascii", "iso-8859-1": "latin-1",
             "iso_8859-1": "latin-1", "latin-1": "latin-1", "latin1": "latin-1"}
DECLARATION = re.compile(rb"<\?xml\s[^>]*?\bencoding\s*=\s*(['\"])(.{0,40}?)\1")
DOCTYPE = re.compile(r"<!\s*(doctype|entity)", re.IGNORECASE)


def voc_ids(split: AnnotationSplit) -> list[str]:
    """The split's image ids: the lines of its list file, else the stems of the images in the image folder (as a
    YOLO split is its images: one without an XML file is a background). Ids are checked where they are used."""
    if split.image_list is None:
        return sorted({p.stem for p in split.images.glob("*") if p.suffix.lower() in IMG_SUFFIXES})
    try:
        text = read_regular(split.image_list, MAX_LIST_BYTES).decode("utf-8-sig")
        if "\0" in text:
            raise ValueError("NUL characters (UTF-16 or UTF-32 text?)")
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise DataError(f"{split.image_list}: cannot read the image list: {reason}") from None
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def voc_xml_path(split: AnnotationSplit, image_id: str) -> Path:
    """``Annotations/<id>.xml`` for an id from a list file, refused (UserError, one line) unless the id keeps both
    its XML file and its image inside their folders, symbolic links resolved."""
    try:
        for folder, suffix in ((split.images, ".jpg"), (split.annotations, ".xml")):
            try:
                path = confined(f"{image_id}{suffix}", folder)
            except UserError:
                raise UserError(f"VOC image id {short(image_id)} leads outside {folder.resolve()}; refused") \
                    from None
        path.exists()  # raises for a name too long
        return path
    except (OSError, ValueError):  # a NUL character, a name too long
        raise UserError(f"VOC image id {short(image_id)} is not a usable file name") from None


def voc_files(split: AnnotationSplit) -> list[str]:
    """A VOC split's cache depends on its list file and every XML file it names (inside its folder)."""
    listed = [str(split.image_list)] if split.image_list else []
    files = []
    for image_id in voc_ids(split):
        with contextlib.suppress(UserError):
            files.append(str(voc_xml_path(split, image_id)))
    return listed + files


def _text(node: ET.Element | None, tag: str) -> str:
    child = node.find(tag) if node is not None else None
    if child is None or child.text is None:
        raise ValueError(f"<{tag}> missing")
    return child.text.strip()


def _image_path(split: AnnotationSplit, image_id: str, root: ET.Element | None) -> Path:
    """The XML's <filename> inside the image folder when that file exists, else the id with an image suffix."""
    named = path_inside(split.images, root.findtext("filename", "").strip()) if root is not None else None
    if named is not None and _is_file(named):
        return named
    found = [split.images / f"{image_id}{s}" for s in (".jpg", *sorted(IMG_SUFFIXES)) if
             _is_file(split.images / f"{image_id}{s}")]
    return found[0] if found else split.images / f"{image_id}.jpg"


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long
        return False


def _corners(obj: ET.Element) -> list[float]:
    """An object's 1-based inclusive ``bndbox`` as 0-based corners [x1, y1, x2, y2]; ValueError when malformed."""
    box = obj.find("bndbox")
    xmin, ymin, xmax, ymax = (float(_text(box, k)) for k in ("xmin", "ymin", "xmax", "ymax"))
    return [xmin - 1, ymin - 1, xmax, ymax]


def xml_text(raw: bytes) -> str:
    """An XML file's text, decoded here (UTF-8 with or without its BOM, ASCII or Latin-1, as its declaration says)
    and refused (ValueError) in any other encoding or when it holds a DOCTYPE or entity declaration: the check is
    made on the text that is parsed, so no encoding can hide one."""
    if b"\0" in raw:
        raise ValueError("XML in a UTF-16 or UTF-32 encoding (NUL bytes) is refused; only UTF-8, ASCII and Latin-1 "
                         "are read")
    bom = raw.startswith(codecs.BOM_UTF8)
    body = raw[len(codecs.BOM_UTF8):] if bom else raw
    declared = DECLARATION.match(body[:200])
    name = declared.group(2).decode("latin-1").lower() if declared else "utf-8"
    codec = ENCODINGS.get(name)
    if codec is None or (bom and codec != "utf-8"):
        raise ValueError(f"XML in encoding {short(name)} is refused; only UTF-8, ASCII and Latin-1 are read")
    try:
        text = body.decode(codec)
    except UnicodeDecodeError as e:
        raise ValueError(f"not {codec} text ({e.reason} at byte {e.start})") from None
    if DOCTYPE.search(text):
        raise ValueError("XML with a DOCTYPE or entity declarations is refused")
    return text


def read_voc_xml(path: Path) -> ET.Element:
    """The parsed <annotation>; ValueError (one line) for a file that is not safe, valid VOC XML: not a regular
    file, over MAX_XML_BYTES (from its size, before reading), another encoding, a DOCTYPE, malformed."""
    try:
        text = xml_text(read_regular(path, MAX_XML_BYTES))
    except FileRefused as e:
        raise ValueError(f"annotation file: {e}") from None
    try:
        root = ET.fromstring(text)  # text, not bytes: parsed as the text checked, whatever the declaration says
    except (ET.ParseError, RecursionError) as e:
        raise ValueError(f"not valid XML ({str(e)[:200]})") from None
    if root.tag != "annotation":
        raise ValueError(f"root element <{short(root.tag)}>, expected <annotation>")
    return root


def _objects(split: AnnotationSplit, root: ET.Element) -> tuple[list, list, list, int]:
    """(boxes, classes, ignore regions, difficult objects left out) of an <annotation>; ValueError when malformed."""
    boxes, classes, ignore, difficult = [], [], [], 0
    for obj in root.iter("object"):
        name = _text(obj, "name")
        if name not in split.names:
            raise ValueError(f"object name {short(name)} is not in the data YAML's names")
        if (obj.findtext("difficult") or "0").strip() not in ("0", "") and not split.keep_crowd:
            difficult += 1
            with contextlib.suppress(ValueError):  # an ignore region; a bad one is dropped, not fatal
                ignore.append([split.names.index(name), *_corners(obj), 0.0])
            continue
        boxes.append(_corners(obj))
        classes.append(split.names.index(name))
    return boxes, classes, ignore, difficult


def voc_entry(split: AnnotationSplit, image_id: str) -> tuple[ImageEntry, int]:
    """One image's entry and how many difficult objects were left out; a bad id or file is a corrupt entry."""
    try:
        xml = voc_xml_path(split, image_id)
    except UserError as e:
        return ImageEntry(f"<VOC id {short(image_id)}>", problem=str(e)), 0
    if not xml.exists():  # one that exists but is no regular file is refused by read_voc_xml: corrupt
        return ImageEntry(str(_image_path(split, image_id, None)), no_labels="missing"), 0
    root = None
    try:
        root = read_voc_xml(xml)
        size = root.find("size")
        declared = (dimension(_text(size, "width")), dimension(_text(size, "height"))) if size is not None \
            else None
        boxes, classes, ignore, difficult = _objects(split, root)
    except (OSError, ValueError, OverflowError, TypeError, RecursionError) as e:
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
