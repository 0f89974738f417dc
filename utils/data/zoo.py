"""The converters the public data sets' YAMLs name (``convert: voc``): each turns the files a set's official
download unpacks into the YOLO layout its YAML reads. Code lives here, registered by name; a YAML only names it.

Each converter takes the data set's root and its YAML's class names, and works on what is there, so a download
that was interrupted and resumed converts the same way. Boxes outside an image are clipped to it; boxes with no
area left, and classes a set marks as ignored, are dropped.
"""

from __future__ import annotations

import csv
import json
import os
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from utils.data.annotations import AnnotationSplit, ImageEntry, corner_rows, path_inside
from utils.data.coco_json import coco_entries, read_coco
from utils.data.convert import label_text, place_file
from utils.data.errors import DataError
from utils.data.image_io import exif_size, opened_image
from utils.data.regular_files import open_regular
from utils.data.voc import parse_voc
from utils.log import LOGGER

Converter = Callable[[Path, Sequence[str]], None]


def safe_untar(archive: Path, dest: Path) -> None:
    """Extract a tar archive with tarfile's 'data' filter (nothing outside ``dest``, no devices, no links out),
    never replacing a file already there (kept, and counted in a warning), then delete it."""
    kept = []

    def keep_existing(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        member = tarfile.data_filter(member, path)
        if not member.isdir() and os.path.lexists(os.path.join(path, member.name)):
            kept.append(member.name)
            return None  # an existing file is never replaced
        return member

    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter=keep_existing)
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"{archive}: cannot extract ({str(e)[:200]}); delete it and download again") from None
    if kept:
        LOGGER.warning(f"WARNING: {len(kept)} file(s) of {archive.name} were already in {dest} and were kept, not "
                       "replaced")
    archive.unlink()


def untar_all(folder: Path) -> None:
    """Extract every ``*.tar``, ``*.tar.gz`` and ``*.tgz`` directly in ``folder`` into it."""
    for archive in sorted(p for p in folder.glob("*") if p.name.endswith((".tar", ".tar.gz", ".tgz"))):
        LOGGER.info(f"Extracting {archive} ...")
        safe_untar(archive, folder)


def image_size(path: Path) -> tuple[int, int]:
    """(w, h) as the data set reads it (EXIF orientation applied), from the header only; one DataError line for a
    file that is not a regular file holding an image of a listed format within the pixel limit."""
    try:
        with open_regular(path) as f, opened_image(f) as img:
            return exif_size(img)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: {getattr(e, 'strerror', None) or e}") from None


def write_yolo_label(path: Path, boxes: np.ndarray, classes: np.ndarray, size: tuple[int, int]) -> int:
    """Pixel corners (k, 4) clipped to the image, empty ones dropped, written as YOLO rows; returns boxes kept."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4).copy()
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, size[0])
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, size[1])
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(label_text(corner_rows(boxes[keep], np.asarray(classes)[keep], size)))
    return int(keep.sum())


def write_entries(entries: Sequence[ImageEntry], images: Path, labels: Path) -> int:
    """Parsed entries' images moved into ``images`` and their labels written to ``labels``; unusable entries
    are skipped with one warning line. Returns the images converted."""
    done, skipped = 0, []
    for entry in entries:
        source = Path(entry.path)
        if entry.problem or not source.is_file():
            skipped.append(f"{source.name}: {entry.problem or 'image not found'}")
            continue
        try:
            size = entry.size or image_size(source)
        except DataError as e:
            skipped.append(str(e))
            continue
        place_file(source, images / source.name, move=True)
        write_yolo_label(labels / f"{source.stem}.txt", entry.boxes, entry.classes, size)
        done += 1
    if skipped:
        LOGGER.warning(f"WARNING: {len(skipped)} images not converted, e.g. {skipped[0]}")
    return done


VOC_SETS = (("2012", "train"), ("2012", "val"), ("2007", "train"), ("2007", "val"))  # 2007 test: read as XML


def convert_voc(root: Path, names: Sequence[str]) -> None:
    """VOCdevkit (unpacked into ``images/``) -> ``images/{set}{year}`` and ``labels/{set}{year}``, difficult
    objects left out, as the VOC YAML reads it."""
    devkit = root / "images" / "VOCdevkit"
    for year, image_set in VOC_SETS:
        base = devkit / f"VOC{year}"
        listed = base / "ImageSets" / "Main" / f"{image_set}.txt"
        if not listed.is_file():
            continue
        split = AnnotationSplit("voc", base / "Annotations", base / "JPEGImages", listed, tuple(names))
        entries, _ = parse_voc(split)
        done = write_entries(entries, root / "images" / f"{image_set}{year}", root / "labels" / f"{image_set}{year}")
        LOGGER.info(f"VOC{year} {image_set}: {done} images converted")


VISDRONE_SETS = ("VisDrone2019-DET-train", "VisDrone2019-DET-val", "VisDrone2019-DET-test-dev")


def convert_visdrone(root: Path, names: Sequence[str]) -> None:
    """VisDrone ``annotations/*.txt`` (x, y, w, h, score, category, ...) -> ``labels/*.txt``: score 0 rows
    (ignored regions) and categories outside 1..10 are dropped, category c becomes class c - 1."""
    for folder in (root / d for d in VISDRONE_SETS):
        for annotation in sorted((folder / "annotations").glob("*.txt")):
            rows = [r.split(",") for r in annotation.read_text().split() if r.strip()]
            kept = [(int(r[5]) - 1, [float(v) for v in r[:4]]) for r in rows
                    if len(r) >= 6 and r[4] != "0" and 1 <= int(r[5]) <= len(names)]
            boxes = np.array([[x, y, x + w, y + h] for _, (x, y, w, h) in kept], np.float64)
            classes = np.array([c for c, _ in kept], np.int64)
            size = image_size(folder / "images" / f"{annotation.stem}.jpg")
            write_yolo_label(folder / "labels" / f"{annotation.stem}.txt", boxes, classes, size)


def convert_sku110k(root: Path, names: Sequence[str]) -> None:
    """SKU110K_fixed (tar.gz) -> ``images/``, ``labels/`` and ``{train,val,test}.txt`` from its CSV files
    (image, x1, y1, x2, y2, class, image width, image height); one class."""
    untar_all(root)
    unpacked = root / "SKU110K_fixed"
    if unpacked.is_dir():
        for item in unpacked.iterdir():
            place_file(item, root / item.name, move=True)
        unpacked.rmdir()
    for split in ("train", "val", "test"):
        by_image: dict[str, list] = {}
        with open(root / "annotations" / f"annotations_{split}.csv", newline="") as f:
            for row in csv.reader(f):
                if len(row) >= 8:
                    by_image.setdefault(row[0], []).append([float(v) for v in (*row[1:5], *row[6:8])])
        for image, rows in by_image.items():
            values = np.array(rows, np.float64)
            write_yolo_label(root / "labels" / f"{Path(image).stem}.txt", values[:, :4], np.zeros(len(values)),
                             (int(values[0, 4]), int(values[0, 5])))
        (root / f"{split}.txt").write_text("".join(f"./images/{image}\n" for image in sorted(by_image)))


WHEAT_DOMAINS = ("arvalis_1", "arvalis_2", "arvalis_3", "ethz_1", "rres_1", "inrae_1", "usask_1", "utokyo_1",
                 "utokyo_2", "nau_1", "uq_1")


def convert_globalwheat(root: Path, names: Sequence[str]) -> None:
    """The competition's domain folders -> ``images/<domain>`` (their JSON files -> ``annotations/``); the
    labels come in YOLO format in the labels archive (``labels/<domain>``)."""
    for domain in WHEAT_DOMAINS:
        if (root / domain).is_dir():
            place_file(root / domain, root / "images" / domain, move=True)
        if (root / f"{domain}.json").is_file():
            place_file(root / f"{domain}.json", root / "annotations" / f"{domain}.json", move=True)


# xView type ids 11..94 -> the 60 classes of the YAML (-1: not a class).
XVIEW_CLASSES = (-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, -1, 3, -1, 4, 5, 6, 7, 8, -1, 9, 10, 11, 12, 13,
                 14, 15, -1, -1, 16, 17, 18, 19, 20, 21, 22, -1, 23, 24, 25, -1, 26, 27, -1, 28, -1, 29, 30, 31, 32, 33,
                 34, 35, 36, 37, -1, 38, 39, 40, 41, 42, 43, 44, 45, -1, -1, -1, -1, 46, 47, 48, 49, -1, 50, 51, -1,
                 52, -1, -1, -1, 53, 54, -1, 55, -1, -1, 56, -1, 57, -1, 58, 59)


def _xview_boxes(geojson: Path, images: Path) -> dict[str, list]:
    """Per image file: [(class, [x1, y1, x2, y2])] of the features with a known class and image."""
    try:
        features = json.loads(geojson.read_bytes())["features"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{geojson}: not a readable xView GeoJSON file ({type(e).__name__})") from None
    boxes: dict[str, list] = {}
    for feature in features:
        props = feature.get("properties", {}) if isinstance(feature, dict) else {}
        try:
            box = [float(v) for v in str(props["bounds_imcoords"]).split(",")]
            cls = XVIEW_CLASSES[int(props["type_id"])]
        except (KeyError, ValueError, IndexError):
            continue
        if len(box) == 4 and cls >= 0 and (images / str(props.get("image_id"))).is_file():
            boxes.setdefault(str(props["image_id"]), []).append((cls, box))
    return boxes


def convert_xview(root: Path, names: Sequence[str]) -> None:
    """xView_train.geojson -> ``labels/train``; train_images, val_images -> ``images/train``, ``images/val``;
    a fixed 90/10 split of the labelled images into ``images/autosplit_{train,val}.txt``."""
    for image, items in _xview_boxes(root / "xView_train.geojson", root / "train_images").items():
        size = image_size(root / "train_images" / image)
        write_yolo_label(root / "labels" / "train" / f"{Path(image).stem}.txt", np.array([b for _, b in items]),
                         np.array([c for c, _ in items]), size)
    for folder, target in (("train_images", "train"), ("val_images", "val")):
        if (root / folder).is_dir():
            place_file(root / folder, root / "images" / target, move=True)
    files = sorted(p.name for p in (root / "images" / "train").iterdir())
    rng = np.random.default_rng(0)
    to_val = rng.random(len(files)) < 0.1
    if len(files) > 1 and not to_val.any():  # a small set still gets a val image
        to_val[-1] = True
    for name, chosen in (("autosplit_train.txt", ~to_val), ("autosplit_val.txt", to_val)):
        listed = [f"./train/{f}\n" for f, c in zip(files, chosen) if c]
        (root / "images" / name).write_text("".join(listed))


def convert_objects365(root: Path, names: Sequence[str]) -> None:
    """The image patches (tar.gz) -> ``images/{train,val}`` flat; zhiyuan_objv2_{split}.json -> ``labels/``
    (categories in ascending id order, crowd boxes left out)."""
    untar_all(root)
    for split in ("train", "val"):
        images = root / "images" / split
        untar_all(images)
        for file in list(images.rglob("*.jpg")):
            if file.parent != images:
                place_file(file, images / file.name, move=True)
        annotations = root / f"zhiyuan_objv2_{split}.json"
        entries, _, _ = coco_entries(read_coco(annotations), annotations, images,
                                     locate=lambda name, folder=images: path_inside(folder, Path(str(name)).name))
        done = write_entries(entries, images, root / "labels" / split)
        LOGGER.info(f"Objects365 {split}: {done} images converted")


CONVERTERS: dict[str, Converter] = {
    "voc": convert_voc,
    "visdrone": convert_visdrone,
    "sku110k": convert_sku110k,
    "globalwheat2020": convert_globalwheat,
    "xview": convert_xview,
    "objects365": convert_objects365,
}
