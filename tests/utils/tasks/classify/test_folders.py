"""utils/tasks/classify/folders.py: ImageNet-style class folders read with bounds and one-line refusals."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.data.errors import DataError
from utils.tasks.classify.folders import listed_split, scan_classification, scan_split, summary


def image(path: Path, value: int = 80, size: tuple[int, int] = (12, 16)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((*size, 3), value, np.uint8))


def test_class_folders_are_read(tmp_path: Path) -> None:
    root = tmp_path / "set"
    for split, classes in (("train", ("dog", "cat", "bird")), ("val", ("cat", "dog"))):
        for name in classes:
            image(root / split / name / "a.jpg")
    image(root / "train" / "cat" / "nested" / "b.png", 200)
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    image(root / "train" / ".hidden" / "c.jpg")
    outside = tmp_path / "elsewhere"
    image(outside / "x.jpg")
    os.symlink(outside / "x.jpg", root / "train" / "dog" / "linked.jpg")
    os.symlink(outside, root / "train" / "linked-class")
    data = scan_classification(root)
    assert data.names == ["bird", "cat", "dog"] and data.val.names == data.names
    assert data.train.files == ["bird/a.jpg", "cat/a.jpg", "cat/nested/b.png", "dog/a.jpg"]
    assert data.train.labels.tolist() == [0, 1, 1, 2] and data.train.counts().tolist() == [1, 2, 1]
    assert (data.train.outside, data.train.others) == (2, 1)  # a file and a class folder lead outside
    assert summary(data.train) == "train: 4 images in 3 classes; 2 links leading outside and 1 other files left out"
    pixels, label = data.train.read(2)
    assert label == 1 and pixels.shape == (12, 16, 3) and pixels.mean() == pytest.approx(200, abs=2)
    assert data.val.labels.tolist() == [1, 2]
    (root / "train" / "bird" / "a.jpg").write_bytes(b"GIF89a not one")
    with pytest.raises(DataError, match="bird/a.jpg: .*GIF"):
        data.train.read(0)


def test_bad_folders_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such folder"):
        scan_classification(tmp_path)
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        scan_split(tmp_path / "train")
    (tmp_path / "train" / "cat").mkdir()
    with pytest.raises(DataError, match="no images in its class folders"):
        scan_split(tmp_path / "train")
    image(tmp_path / "train" / "cat" / "a.jpg")
    image(tmp_path / "val" / "cow" / "a.jpg")
    with pytest.raises(DataError, match="class folder 'cow' is not one of the 1 training classes"):
        scan_classification(tmp_path)
    (tmp_path / "train" / ("x" * 200)).mkdir()
    with pytest.raises(DataError, match="is not a class name"):
        scan_split(tmp_path / "train")


def test_class_names_come_from_the_folders_when_the_data_gives_none(tmp_path: Path) -> None:
    """A data YAML without nc and names, or ``--data FOLDER`` as ultralytics users type it: the classes are the
    training split's folder names, sorted; any other layout still needs its names, said in one line."""
    from utils.data.config import load_data_config

    for split, classes in (("train", ("dog", "cat", "emu")), ("val", ("cat", "dog"))):
        for name in classes:
            image(tmp_path / "set" / split / name / "1.jpg")
    (tmp_path / "set" / "data.yaml").write_text("path: .\ntrain: train\nval: val\n")
    by_yaml = load_data_config(tmp_path / "set" / "data.yaml")
    by_folder = load_data_config(tmp_path / "set")
    assert by_yaml.names == by_folder.names == ["cat", "dog", "emu"] and by_yaml.nc == by_folder.nc == 3
    assert by_folder.train == [tmp_path.resolve() / "set" / "train"] and by_folder.test is None
    (tmp_path / "set" / "data.yaml").write_text("path: .\ntrain: train\nval: val\nnames: [a, b, c, d]\n")
    assert load_data_config(tmp_path / "set" / "data.yaml").names == ["a", "b", "c", "d"]  # given names win

    image(tmp_path / "yolo" / "images" / "train" / "1.jpg")  # images in the split itself: not class folders
    (tmp_path / "yolo" / "images" / "val").mkdir()
    (tmp_path / "yolo" / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\n")
    with pytest.raises(DataError, match=r"'nc' must be a class count .*class folders") as e:
        load_data_config(tmp_path / "yolo" / "data.yaml")
    assert "\n" not in str(e.value)
    (tmp_path / "only_train" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match=r"holds train/ and val/ \(or test/\) folders"):
        load_data_config(tmp_path / "only_train")


def test_images_listed_one_by_one_take_the_class_their_folder_names(tmp_path: Path) -> None:
    """listed_split: the images in the order given, each of the class its nearest class-named folder is (nested
    folders too), rooted where they all are; a file in no class folder, or no image, is one line."""
    val = tmp_path / "val"
    for path in ("dog/a.jpg", "cat/nested/b.png", "bird/c.jpg"):
        image(val / path)
    split = listed_split([val / "cat" / "nested" / "b.png", str(val / "dog" / "a.jpg")], ["bird", "cat", "dog"])
    assert split.root == val and split.files == ["cat/nested/b.png", "dog/a.jpg"]
    assert split.labels.tolist() == [1, 2] and split.read(1)[1] == 2
    (val / "notes.txt").write_text("not an image")
    image(tmp_path / "loose.jpg")
    os.mkfifo(val / "dog" / "pipe.jpg")  # a FIFO named like an image: never opened
    for bad in (tmp_path / "loose.jpg", val / "notes.txt", val / "dog" / "missing.jpg", val / "dog" / "pipe.jpg"):
        with pytest.raises(DataError, match="not an image in a class folder") as info:
            listed_split([val / "dog" / "a.jpg", bad], ["bird", "cat", "dog"])
        assert "\n" not in str(info.value)
