"""INT8 calibration images are files from strangers: read by the bounded, header-checked reader, a refused one
skipped and counted, never decoded; each is fitted to the input as the model's task reads images."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.utils.data.test_label_cache import write_bomb_png
from utils.deploy.formats import ExportOptions
from utils.deploy.verify import calibration_batches
from utils.errors import UserError


def write_split(root: Path, images: dict[str, object]) -> Path:
    (root / "images").mkdir(parents=True)
    for name, write in images.items():
        write(root / "images" / name)
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images\nval: images\nnames: [a]\n")
    return root / "data.yaml"


def write_jpg(path: Path) -> None:
    cv2.imwrite(str(path), np.full((40, 60, 3), 200, np.uint8))


def test_a_bomb_among_calibration_images_is_skipped_and_counted(tmp_path: Path, caplog) -> None:
    data = write_split(tmp_path, {"a.jpg": write_jpg, "b.jpg": write_jpg, "c.png": write_bomb_png})
    with caplog.at_level(logging.WARNING, logger="yolo"):
        batches = calibration_batches(str(data), ExportOptions(img_size=(64, 64), batch_size=1, calib_images=8), 32)
    assert [tuple(b.shape) for b in batches] == [(1, 3, 64, 64), (1, 3, 64, 64)]
    assert 0 < float(batches[0].max()) <= 1.0
    assert any("1 of 3 images skipped" in r.getMessage() for r in caplog.records)
    assert any("c.png skipped" in r.getMessage() for r in caplog.records)


def test_only_refused_images_is_one_line_error(tmp_path: Path) -> None:
    data = write_split(tmp_path, {"c.png": write_bomb_png})
    with pytest.raises(UserError, match="no readable training images"):
        calibration_batches(str(data), ExportOptions(img_size=(64, 64), calib_images=8), 32)


def test_calibration_images_are_fitted_as_the_models_task_reads_them(tmp_path: Path) -> None:
    """A detector's are letterboxed, a classifier's resized and centre-cropped (as its validation and detect.py read
    them): calibrated on letterboxed images, a classifier's activation ranges would include grey bars it never sees."""
    from utils.data.augment import letterbox
    from utils.tasks.classify.augment import val_transform

    wide = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    data = write_split(tmp_path, {"a.png": lambda path: cv2.imwrite(str(path), wide)})
    options = ExportOptions(img_size=(32, 32), batch_size=1, calib_images=8)

    def as_input(image: np.ndarray) -> np.ndarray:
        return image[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) / 255

    (boxed,) = calibration_batches(str(data), options, 32)
    np.testing.assert_array_equal(boxed[0].numpy(), as_input(letterbox(wide, (32, 32), stride=32, auto=False)[0]))
    (cropped,) = calibration_batches(str(data), options, 32, task="classify")
    np.testing.assert_array_equal(cropped[0].numpy(), as_input(val_transform(wide, 32)))
