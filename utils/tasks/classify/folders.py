"""Classification data as ImageNet lays it out: one folder per split (``train/``, ``val/``, or ``test/``), in it one
folder per class holding that class's images (``train/<class>/*.jpg``, nested folders allowed); the class names
are the folder names, sorted, the same for every split (a split may lack a class, but not bring a new one).

Reading a stranger's folder is bounded: at most MAX_CLASSES class folders and MAX_IMAGES images a split, names of
at most MAX_NAME_LENGTH printable characters; only regular files with an image suffix are listed, symbolic links
are followed only where they stay inside the split's folder (others are left out and counted), hidden entries
(``.name``) are skipped. Every refusal is one DataError line naming the folder. Images are decoded by the bounded
reader (utils/data/image_io.py) when a sample is read. Images may also be listed one by one (``listed_split``):
each is of the class its folder is named after.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from utils.data.errors import MAX_NAME_LENGTH, DataError
from utils.data.image_io import ImageRefused, read_image
from utils.paths import IMG_SUFFIXES

MAX_CLASSES = 10_000
MAX_IMAGES = 20_000_000  # one split's images (ImageNet-21k has 14 million)
VAL_SPLITS = ("val", "test")  # the first that exists validates


@dataclass
class ClassSplit:
    """One split: its folder, the class names, every image (paths relative to the folder, sorted per class) with
    its class index, and how many entries were left out (links leading outside, other files)."""

    root: Path
    names: list[str]
    files: list[str] = field(default_factory=list)
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    outside: int = 0
    others: int = 0

    def __len__(self) -> int:
        return len(self.files)

    def counts(self) -> np.ndarray:
        """Images per class (len(names),)."""
        return np.bincount(self.labels, minlength=len(self.names))

    def read(self, index: int) -> tuple[np.ndarray, int]:
        """(BGR pixels, class index) of image ``index``; DataError with the reason for an image that is refused."""
        path = self.root / self.files[index]
        try:
            return read_image(path), int(self.labels[index])
        except ImageRefused as e:
            raise DataError(f"{path}: {e}") from None


def _check_name(name: str, folder: Path) -> str:
    if len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise DataError(f"{folder}: class folder {name[:60]!r} is not a class name (at most {MAX_NAME_LENGTH} "
                        "printable characters)")
    return name


def class_folders(split: Path) -> tuple[list[str], int]:
    """(the class folder names of a split, sorted; how many linked folders were left out for leading outside it);
    DataError when there are none or too many."""
    if not split.is_dir():
        raise DataError(f"{split}: no such folder (a classification split holds one folder per class)")
    names, outside = [], 0
    with os.scandir(split) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=True):
                continue
            if entry.is_symlink() and not _inside(Path(entry.path), split.resolve()):
                outside += 1
                continue
            if len(names) >= MAX_CLASSES:
                raise DataError(f"{split}: more than {MAX_CLASSES} class folders")
            names.append(_check_name(entry.name, split))
    if not names:
        raise DataError(f"{split}: no class folders (expected {split.name}/<class>/<image>, e.g. "
                        f"{split.name}/cat/1.jpg)")
    return sorted(names), outside


def names_in_split(split: Path) -> list[str] | None:
    """The class names of a training split that is a folder of class folders (the registry's ``class_names``: a
    data folder or YAML without ``names``), sorted; None for any other folder (a YOLO image folder holds its images
    itself) or when it has no class folders."""
    if not split.is_dir():
        return None
    with os.scandir(split) as entries:
        if any(e.is_file() and Path(e.name).suffix.lower() in IMG_SUFFIXES for e in entries):
            return None
    try:
        return class_folders(split)[0]
    except DataError:
        return None


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):
        return False


def _class_images(folder: Path, root: Path, budget: int) -> tuple[list[str], int, int]:
    """Image paths under one class folder, relative to ``root``, sorted; (paths, links outside, other files)."""
    found, outside, others = [], 0, 0
    for top, dirs, files in os.walk(folder, followlinks=False):
        top_path = Path(top)
        kept_dirs = []
        for d in dirs:
            if d.startswith("."):
                continue
            if (top_path / d).is_symlink():  # a linked folder: walked only when it stays inside the split
                if not _inside(top_path / d, root):
                    outside += 1
                    continue
            kept_dirs.append(d)
        dirs[:] = sorted(kept_dirs)
        for name in files:
            path = top_path / name
            if name.startswith(".") or Path(name).suffix.lower() not in IMG_SUFFIXES:
                others += 1
                continue
            if path.is_symlink() and not _inside(path, root):
                outside += 1
                continue
            if not path.is_file():
                others += 1
                continue
            found.append(path.relative_to(root).as_posix())
            if len(found) > budget:
                raise DataError(f"{root}: more than {MAX_IMAGES} images in one split")
    return sorted(found), outside, others


def scan_split(split: str | Path, names: Sequence[str] | None = None) -> ClassSplit:
    """A split folder -> its images and classes. With ``names`` (the training split's), the split's class folders
    must be among them: one DataError line names a folder that is not."""
    root = Path(split).resolve()
    found, linked_out = class_folders(root)
    names = list(names) if names is not None else found
    index = {name: i for i, name in enumerate(names)}
    unknown = [name for name in found if name not in index]
    if unknown:
        raise DataError(f"{root}: class folder {unknown[0]!r} is not one of the {len(names)} training classes "
                        f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})")
    result = ClassSplit(root, names, outside=linked_out)
    files, labels = [], []
    for name in found:
        images, outside, others = _class_images(root / name, root, MAX_IMAGES - len(files))
        files += images
        labels += [index[name]] * len(images)
        result.outside += outside
        result.others += others
    if not files:
        raise DataError(f"{root}: no images in its class folders (suffixes: {', '.join(sorted(IMG_SUFFIXES))})")
    result.files, result.labels = files, np.array(labels, np.int64)
    return result


def listed_split(files: Sequence[str | Path], names: Sequence[str]) -> ClassSplit:
    """Images named one by one (a sample of a split, as --int8's check takes one) -> a ClassSplit of them in that
    order, each of the class that its nearest folder named after one of ``names`` is (nested folders allowed, as in
    a split), rooted at the folder that holds them all. DataError for a file that is no image in such a folder."""
    if len(files) > MAX_IMAGES:
        raise DataError(f"more than {MAX_IMAGES} images listed")
    index = {name: i for i, name in enumerate(names)}
    paths, labels = [Path(f).absolute() for f in files], []
    for path in paths:
        found = next((index[folder.name] for folder in path.parents if folder.name in index), None)
        if found is None or path.suffix.lower() not in IMG_SUFFIXES or not path.is_file():
            raise DataError(f"{path}: not an image in a class folder (one of {', '.join(names[:5])}"
                            f"{', ...' if len(names) > 5 else ''})")
        labels.append(found)
    if not paths:
        raise DataError("no images listed")
    root = Path(os.path.commonpath([path.parent for path in paths]))
    return ClassSplit(root, list(names), [path.relative_to(root).as_posix() for path in paths],
                      np.array(labels, np.int64))


@dataclass
class ClassificationData:
    """A classification data set: the training split, the validation split (``val``, else ``test``) or None, and
    the class names (the training split's folders)."""

    names: list[str]
    train: ClassSplit
    val: ClassSplit | None


def scan_classification(root: str | Path) -> ClassificationData:
    """``root/train`` and ``root/val`` (or ``root/test``) -> the data set; DataError when ``root/train`` is not a
    class-folder split."""
    root = Path(root)
    train = scan_split(root / "train")
    val_dir = next((root / s for s in VAL_SPLITS if (root / s).is_dir()), None)
    val = scan_split(val_dir, train.names) if val_dir is not None else None
    return ClassificationData(train.names, train, val)


def summary(split: ClassSplit) -> str:
    """One line: images, classes, and what was left out."""
    left = f"; {split.outside} links leading outside and {split.others} other files left out" \
        if split.outside or split.others else ""
    return f"{split.root.name}: {len(split)} images in {len(split.names)} classes{left}"
