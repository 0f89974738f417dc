"""INT8 calibration images are files from strangers: read by the bounded, header-checked reader, a refused one
skipped and counted, never decoded."""

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
