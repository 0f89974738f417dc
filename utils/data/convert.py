"""Convert label files between formats: YOLO txt from a COCO JSON file or VOC XML, and a COCO JSON file from YOLO
txt. The input goes through the same checks as training reads it (corrupt images and boxes are left out, with
the same counted warnings).

    python -m utils.data.convert --from coco --annotations instances_val.json --images val2017 --out coco-yolo
    python -m utils.data.convert --from voc --annotations VOC2007/Annotations --images VOC2007/JPEGImages \\
        --list VOC2007/ImageSets/Main/val.txt --names aeroplane bicycle ... --out voc-yolo
    python -m utils.data.convert --from yolo --images set/images/train --names cat dog --out instances_train.json
    python -m utils.data.convert --from dota --annotations DOTA/train/labelTxt --images DOTA/train/images \
        --names plane ship "storage tank" ... --out dota-yolo-obb

``--from dota`` writes YOLO-OBB label files (class and four corners, normalised: utils/data/dota.py), difficult
objects only with ``--keep-crowd``.

``--to shards`` writes any of them as tar shards (utils.data.shards) for streaming, by local path or from object
storage:

    python -m utils.data.convert --from yolo --to shards --images set/images/train --names cat dog --out shards

writes ``OUT/train-000000.tar ...`` (``--shard-samples`` images each) and ``OUT/train.index.json`` (``--prefix``
names them); a data YAML then names ``train: shards/train-{000000..000003}.tar`` or their URL.

``--to yolo`` writes ``OUT/images/`` (hard links, or copies across file systems) and ``OUT/labels/`` in the
layout a data YAML's YOLO split reads; ``--to coco`` writes one annotation file (category ids 1..nc). Nothing is
written outside ``--out``, and no file is replaced that this command did not write (its list, ``.yolo-convert``,
is kept beside what it wrote): a run that would replace one stops with one line before writing anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from utils.data.annotations import AnnotationSplit
from utils.data.coco_json import coco_document, read_coco
from utils.data.dota import convert_dota_folder, find_image
from utils.data.errors import DataError
from utils.data.formats import scan_sources
from utils.data.label_cache import STATES, ScanResult
from utils.data.regular_files import read_regular
from utils.data.shards import SampleSource, shard_names, write_shards
from utils.errors import UserError
from utils.log import LOGGER, setup_logging
from utils.paths import confined


def label_text(rows: np.ndarray) -> str:
    """YOLO rows as text: each value the shortest decimal that reads back as the same float32, so a file written
    here loads to exactly the labels it came from."""
    lines = []
    for cls, *coords in np.asarray(rows, np.float32).tolist():
        values = " ".join(np.format_float_positional(np.float32(v), trim="-") for v in coords)
        lines.append(f"{int(cls)} {values}\n")
    return "".join(lines)


def place_file(source: Path, target: Path, move: bool = False) -> None:
    """Put ``source`` at ``target``: moved, else hard-linked, else copied (another file system)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not move:
        return
    if move:
        os.replace(source, target)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


MANIFEST = ".yolo-convert"  # in a folder this command writes to: the files it wrote there, one relative path a line
MAX_MANIFEST_BYTES = 256 << 20


class Written:
    """The files this command wrote in ``folder`` (its manifest there): a file in the way that is not listed is
    someone else's and is never replaced. The manifest is updated before the files are written, so a run that
    stops midway can be repeated."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.manifest = folder, folder / MANIFEST
        self.names: set[str] = set()
        if self.manifest.exists():
            try:
                self.names = set(read_regular(self.manifest, MAX_MANIFEST_BYTES).decode().splitlines())
            except (OSError, ValueError) as e:
                raise DataError(f"{self.manifest}: cannot read this command's list of the files it wrote ({e}); "
                                "choose another --out") from None

    def claim(self, targets: Sequence[Path]) -> None:
        """Refuse (one DataError line, nothing written) when a target exists and was not written here; else record
        every target as this command's."""
        names = [target.relative_to(self.folder).as_posix() for target in targets]
        for target, name in zip(targets, names):
            if (target.exists() or target.is_symlink()) and name not in self.names:
                raise DataError(f"{target} exists and was not written by python -m utils.data.convert; choose "
                                "another --out, or move it away (nothing was written)")
        self.names.update(names)
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.manifest.with_name(f"{MANIFEST}.tmp{os.getpid()}")
        tmp.write_text("".join(f"{name}\n" for name in sorted(self.names)))
        os.replace(tmp, self.manifest)


def export_yolo(result: ScanResult, images: Path, out: Path) -> int:
    """Images of a checked scan (paths relative to ``images``) into ``out/images`` and their labels into
    ``out/labels``; corrupt images are left out. Every target is checked to lie inside ``out`` and not to replace a
    file this command did not write there before anything is written. Returns the images written."""
    out = out.resolve()
    plan = []
    for i, (file, state) in enumerate(zip(result.im_files, result.states)):
        if STATES[state] == "corrupt":
            continue
        relative = Path(file).relative_to(images).as_posix()
        image = confined(relative, out / "images", "an image path")
        label = None if STATES[state] == "missing" else \
            confined(Path(relative).with_suffix(".txt"), out / "labels", "a label path")
        plan.append((Path(file), image, label, result.labels[i]))
    Written(out).claim([t for _, image, label, _ in plan for t in (image, label) if t is not None])
    for source, image, label, rows in plan:
        place_file(source, image)
        if label is not None:
            label.parent.mkdir(parents=True, exist_ok=True)
            label.write_text(label_text(rows))
    return len(plan)


def _names(opt: argparse.Namespace) -> list[str]:
    if opt.names:
        return list(opt.names)
    if opt.from_format == "coco":
        from utils.data.coco_json import category_order

        return category_order(read_coco(opt.annotations), opt.annotations)[1]
    raise DataError(f"--from {opt.from_format} needs --names (the class names in class-index order)")


def export_shards(result: ScanResult, out: Path, prefix: str, per_shard: int, names: list[str]) -> Path:
    """The usable images of a checked scan and their labels into tar shards and their index in ``out`` (the
    targets claimed first: nothing of the user's is replaced). Returns the index path."""
    out = out.resolve()
    keep = [i for i, state in enumerate(result.states) if STATES[state] != "corrupt"]
    if not keep:
        raise DataError("no usable images to write into shards")
    samples = [SampleSource(Path(result.read_path(i)), label_text(result.labels[i]), result.labels[i],
                            (int(result.shapes[i][0]), int(result.shapes[i][1]))) for i in keep]
    count = -(-len(samples) // per_shard)
    Written(out).claim([out / name for name in shard_names(prefix, count)] + [out / f"{prefix}.index.json"])
    index = write_shards(samples, out, prefix, per_shard, names)
    LOGGER.info(f"Wrote {len(samples)} images and their labels into {count} shards {out}/{prefix}-"
                f"{{000000..{count - 1:06d}}}.tar and their index {index.name}")
    return index


def _scan(opt: argparse.Namespace, names: list[str]) -> ScanResult:
    if opt.from_format == "yolo":
        return scan_sources([opt.images], len(names))[0]
    if opt.annotations is None:
        raise DataError(f"--from {opt.from_format} needs --annotations")
    split = AnnotationSplit(opt.from_format, opt.annotations, opt.images, opt.list, tuple(names), opt.keep_crowd)
    return scan_sources(split, len(names))[0]


def convert_dota(opt: argparse.Namespace, names: list[str]) -> Path:
    """DOTA's label files (``--annotations``) -> ``OUT/labels`` in YOLO-OBB form, their images linked into
    ``OUT/images`` (utils/data/dota.py); difficult objects only with ``--keep-crowd``."""
    if opt.annotations is None:
        raise DataError("--from dota needs --annotations (the folder of DOTA label files)")
    out = opt.out.resolve()
    written = Written(out)
    counts = convert_dota_folder(opt.annotations, opt.images, out / "labels", names, opt.keep_crowd,
                                 claim=written.claim)
    images = [image for label in sorted(opt.annotations.glob("*.txt"))
              if (out / "labels" / f"{label.stem}.txt").is_file() and (image := find_image(opt.images, label.stem))]
    written.claim([out / "images" / image.name for image in images])
    for image in images:
        place_file(image, out / "images" / image.name)
    LOGGER.info(f"Wrote {counts['files']} DOTA label files ({counts['objects']} oriented boxes) and their images to "
                f"{opt.out}/labels and {opt.out}/images (classes: {', '.join(names)})")
    return opt.out


def convert(opt: argparse.Namespace) -> Path:
    """Run one conversion; returns what it wrote (the output folder, JSON file or shard index)."""
    names = _names(opt)
    if opt.from_format == "dota":
        return convert_dota(opt, names)
    if opt.to_format == "shards":
        if not 1 <= opt.shard_samples <= 1_000_000 or not re.fullmatch(r"[A-Za-z0-9_]{1,64}", opt.prefix):
            raise DataError("--shard-samples must be 1..1000000 and --prefix 1-64 letters, digits or _")
        return export_shards(_scan(opt, names), opt.out, opt.prefix, opt.shard_samples, names)
    result = _scan(opt, names)
    if opt.from_format == "yolo":
        keep = [i for i, s in enumerate(result.states) if STATES[s] != "corrupt"]
        doc = coco_document([result.im_files[i] for i in keep], [result.labels[i] for i in keep],
                            result.shapes[keep], names, opt.images)
        out = opt.out.resolve()
        Written(out.parent).claim([out])
        out.write_text(json.dumps(doc))
        LOGGER.info(f"Wrote {len(doc['images'])} images and {len(doc['annotations'])} boxes to {opt.out}")
        return opt.out
    written = export_yolo(result, opt.images, opt.out)
    LOGGER.info(f"Wrote {written} images and their labels to {opt.out}/images and {opt.out}/labels "
                f"(classes: {', '.join(names)})")
    return opt.out


def parse_opt(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command's options."""
    p = argparse.ArgumentParser(prog="python -m utils.data.convert", description="Convert detection labels "
                                "between YOLO txt, COCO JSON and Pascal VOC XML, and DOTA's to YOLO-OBB")
    p.add_argument("--from", dest="from_format", required=True, choices=("coco", "voc", "yolo", "dota"))
    p.add_argument("--to", dest="to_format", choices=("yolo", "coco", "shards"),
                   help="default: yolo, or coco from yolo; shards: tar shards and their index (any --from)")
    p.add_argument("--annotations", type=Path, help="COCO JSON file, or the folder of VOC XML files")
    p.add_argument("--images", type=Path, required=True, help="the image folder")
    p.add_argument("--list", type=Path, help="VOC: a list of image ids (ImageSets/Main/*.txt)")
    p.add_argument("--names", nargs="+", help="class names in class-index order (COCO: read from the file)")
    p.add_argument("--keep-crowd", action="store_true", help="keep crowd boxes / difficult objects")
    p.add_argument("--out", type=Path, required=True, help="output folder (--to yolo, shards) or JSON file "
                   "(--to coco)")
    p.add_argument("--shard-samples", type=int, default=1000, help="--to shards: images per shard")
    p.add_argument("--prefix", default="train", help="--to shards: the shards' name, PREFIX-000000.tar ...")
    opt = p.parse_args(argv)
    opt.to_format = opt.to_format or ("coco" if opt.from_format == "yolo" else "yolo")
    if opt.from_format == "dota" and opt.to_format != "yolo":
        p.error("--from dota converts to YOLO-OBB label files only (--to yolo)")
    if opt.to_format != "shards" and (opt.from_format == "yolo") != (opt.to_format == "coco"):
        p.error(f"--from {opt.from_format} --to {opt.to_format}: supported are coco/voc -> yolo, yolo -> coco and "
                "any -> shards")
    return opt


def main(argv: Sequence[str] | None = None) -> int:
    """Exit code 0 on success, 2 with one line for a user error."""
    setup_logging()
    try:
        convert(parse_opt(argv))
    except UserError as e:
        print(f"convert: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
