"""What validation writes: COCO result rows and YOLO label files."""

from __future__ import annotations

from pathlib import Path

import torch

from utils.evaluation.outputs import COCO80_TO_91, json_rows, save_label_file


def test_json_rows_are_coco_boxes_in_original_pixels() -> None:
    det = torch.tensor([[10.0, 20.0, 50.0, 80.0, 0.9, 2.0]])
    assert json_rows("images/000042.jpg", det, is_coco=True) == [
        {"image_id": 42, "category_id": 3, "bbox": [10.0, 20.0, 40.0, 60.0], "score": 0.9}]
    assert json_rows("a/cat.png", det, is_coco=False)[0]["image_id"] == "cat"
    assert len(COCO80_TO_91) == 80 and COCO80_TO_91[-1] == 90


def test_label_file_rows_are_normalised_to_the_original_image(tmp_path: Path) -> None:
    det = torch.tensor([[10.0, 20.0, 50.0, 80.0, 0.5, 1.0]])
    save_label_file("x/img.jpg", det, (100, 200), tmp_path, save_conf=True)
    assert (tmp_path / "img.txt").read_text() == "1 0.15 0.5 0.2 0.6 0.5\n"
