"""The label formats a data YAML's split may use, by name, and the one scan the dataset asks for.

A split is a YOLO folder or ``.txt`` list (labels in ``labels/`` beside ``images/``), or a mapping naming an
annotation format:

    train: {coco: annotations/instances_train.json, images: images/train}
    val: {voc: VOC2007/Annotations, images: VOC2007/JPEGImages, list: VOC2007/ImageSets/Main/val.txt}

with ``keep_crowd: true`` to train on crowd boxes / difficult objects too. A split may also be a list of these.
Without it, those boxes are the split's ignore regions, which only evaluation reads (``ignore_regions``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from utils.data.annotations import (
    BOXES,
    AnnotationFormat,
    AnnotationSplit,
    LabelReader,
    concat_results,
    scan_annotations,
)
from utils.data.coco_json import coco_files, parse_coco
from utils.data.errors import DataError
from utils.data.label_cache import ScanResult, cache_dir_for, cached_scan, img2label_paths, list_image_files
from utils.data.shared_scan import shared_scan
from utils.data.voc import parse_voc, voc_files
from utils.distributed import comm as dist
from utils.paths import confined
from utils.safe_yaml import shown
from utils.tasks.registry import get_task

FORMATS: dict[str, AnnotationFormat] = {
    "coco": AnnotationFormat(parse=parse_coco, files=coco_files),
    "voc": AnnotationFormat(parse=parse_voc, files=voc_files),
}
SPLIT_KEYS = {"images", "list", "keep_crowd"}


def _resolve(value: Any, root: Path, where: str) -> Path:
    """A path of a split mapping, resolved and confined to the data set's folder ``root``."""
    if not isinstance(value, str) or not value:
        raise DataError(f"{where}: expected a path, got {shown(value)}")
    return confined(value, root, where, DataError)


def split_from_mapping(value: dict, root: Path, names: Sequence[str], yaml_file: Path) -> AnnotationSplit:
    """A YAML split mapping -> AnnotationSplit (paths relative to the data set's root); one DataError line for an
    unknown format or key, or a missing ``images``."""
    kinds = [k for k in value if k in FORMATS]
    unknown = sorted(set(value) - set(FORMATS) - SPLIT_KEYS, key=str)
    if len(kinds) != 1 or unknown:
        what = f"unknown key {shown(unknown[0])}" if unknown else f"{len(kinds)} formats"
        raise DataError(f"{yaml_file}: split {shown(value)}: {what}; a split mapping names one format "
                        f"({', '.join(FORMATS)}) and 'images', optionally 'list' and 'keep_crowd'")
    kind, where = kinds[0], f"{yaml_file}: split '{kinds[0]}'"
    if "images" not in value:
        raise DataError(f"{where}: needs 'images', the folder its images are in")
    if not isinstance(value.get("keep_crowd", False), bool):
        raise DataError(f"{where}: 'keep_crowd' must be true or false")
    image_list = _resolve(value["list"], root, where) if value.get("list") is not None else None
    return AnnotationSplit(kind, _resolve(value[kind], root, where), _resolve(value["images"], root, where),
                           image_list, tuple(names), bool(value.get("keep_crowd", False)))


def label_reader(task: str | None, task_options: Mapping[str, Any] | None = None) -> LabelReader:
    """How ``task``'s labels are read (its registered LabelReader, or the one its registered function makes of the
    data set's ``task_options``; the base task's: the boxes alone)."""
    found = get_task(task).load("labels")
    if found is None:
        return BOXES
    return found if isinstance(found, LabelReader) else found(dict(task_options or {}))


def scan_sources(sources: Any, nc: int | None, prefix: str = "",
                 reader: LabelReader = BOXES) -> tuple[ScanResult, Path, Path]:
    """The checked scan of a split's sources, YOLO ones first, then each annotation split:
    (result, the first source's cache file, its cache folder). A task's ``reader`` reads what its labels add
    beside the boxes, kept per object (``ScanResult.extras``). All local ranks build it zero-first."""
    items = list(sources) if isinstance(sources, list | tuple) else [sources]
    yolo = [s for s in items if not isinstance(s, AnnotationSplit)]
    parts = []
    if yolo:
        im_files = list_image_files(yolo)
        label_files = img2label_paths(im_files)
        result, path = cached_scan(im_files, label_files, nc, prefix, check=reader.check, kind=reader.kind)
        parts.append((result, path, cache_dir_for(label_files)))
    for split in (s for s in items if isinstance(s, AnnotationSplit)):
        parts.append((scan_annotations(split, FORMATS[split.format], nc, prefix, reader), split.cache_path(),
                      split.cache_dir()))
    if not parts or not sum(len(r.im_files) for r, _, _ in parts):
        raise DataError(f"no images found in {', '.join(map(str, items))}")
    return concat_results([r for r, _, _ in parts]), parts[0][1], parts[0][2]


def shared_scan_sources(sources: Any, nc: int | None, prefix: str = "",
                        reader: LabelReader = BOXES) -> ScanResult | None:
    """Under DDP, before the dataset is built: the YOLO txt files of a split are scanned by every rank together
    when a cache is missing or stale (utils.data.shared_scan), so the dataset then reads the cache;
    ``reader`` as scan_sources'. Returns that scan (None when nothing was scanned). Annotation-file splits are
    read as before. All ranks must call it; a no-op for one process."""
    items = list(sources) if isinstance(sources, list | tuple) else [sources]
    yolo = [s for s in items if not isinstance(s, AnnotationSplit)]
    if dist.get_world_size() == 1 or not yolo:
        return None
    im_files = list_image_files(yolo)
    return shared_scan(im_files, img2label_paths(im_files), nc, prefix, check=reader.check, kind=reader.kind)


def ignore_regions(sources: Any, single_cls: bool = False) -> dict[str, np.ndarray]:
    """The ignore regions (crowd boxes, difficult objects) of every image of a split's annotation sources that
    has any, by image path: (r, 6) [cls, x1, y1, x2, y2, crowd] in the image's pixels. Parsed from the files
    when evaluation first asks (training never does). ``single_cls`` makes every region class 0."""
    items = list(sources) if isinstance(sources, list | tuple) else [sources]
    regions: dict[str, np.ndarray] = {}
    for split in (s for s in items if isinstance(s, AnnotationSplit)):
        for entry in FORMATS[split.format].parse(split)[0]:
            if len(entry.ignore):
                regions[entry.path] = entry.ignore.copy()
                if single_cls:
                    regions[entry.path][:, 0] = 0
    return regions
