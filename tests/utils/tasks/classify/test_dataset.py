"""utils/tasks/classify/dataset.py: --fraction keeps every class, and images listed one by one are samples too."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.utils.tasks.classify.test_folders import image
from utils.data.samples import DatasetOptions
from utils.tasks.classify.dataset import ClassFolders, first_of_each_class


def test_fraction_keeps_the_first_share_of_each_class(tmp_path: Path) -> None:
    train = tmp_path / "train"
    for name, count in (("bird", 4), ("cat", 1), ("dog", 6)):
        for i in range(count):
            image(train / name / f"{i}.jpg", 10 * i)
    assert first_of_each_class(np.array([0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2]), 0.5).tolist() == [0, 1, 4, 5, 6, 7]
    names = ["bird", "cat", "dog"]
    half = ClassFolders(train, DatasetOptions(img_size=32, names=names, fraction=0.5, augment=False))
    assert half.im_files == [str(train / p) for p in ("bird/0.jpg", "bird/1.jpg", "cat/0.jpg", "dog/0.jpg",
                                                     "dog/1.jpg", "dog/2.jpg")]
    assert half.classes.tolist() == [0, 0, 1, 2, 2, 2] and len(half.shapes) == len(half) == 6
    whole = ClassFolders(train, DatasetOptions(img_size=32, names=names, augment=False))
    assert len(whole) == 11
    listed = ClassFolders([train / "dog" / "3.jpg", train / "cat" / "0.jpg"],
                          DatasetOptions(img_size=32, names=names, augment=False))
    assert listed.classes.tolist() == [2, 1] and listed[0].image.shape == (3, 32, 32)
