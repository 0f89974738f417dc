"""utils/tasks/obb/synthetic.py: the built-in oriented-box set's rectangles are exactly where their labels say, of
their class's aspect, and ensure_synthetic_obb makes it through the generated-set mechanism (never over a user's
file)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from utils.data.generated import GeneratedSetError
from utils.data.synthetic import make_spec
from utils.tasks.obb.labels import read_obb_label_file
from utils.tasks.obb.rotated import xywhr2corners
from utils.tasks.obb.sample import rotated_boxes
from utils.tasks.obb.synthetic import ASPECTS, OBB_NAMES, OWN_FILES, ensure_synthetic_obb, write_obb_set
from utils.tasks.obb.synthetic import split_counts as obb_counts


def test_synthetic_obb_set_has_exact_rectangles(tmp_path: Path) -> None:
    spec = make_spec(5, 2, (64, 80), seed=1)
    names = write_obb_set(tmp_path, spec)
    assert all(OWN_FILES.fullmatch(n) for n in names) and len(names) == 2 * sum(obb_counts(spec).values()) // 2
    labels = sorted((tmp_path / "labels" / "train").glob("*.txt"))
    assert len(labels) == 5
    for label in labels:
        rows, state, _, _ = read_obb_label_file(label, len(OBB_NAMES))
        img = cv2.imread(str(tmp_path / "images" / "train" / f"{label.stem}.jpg"))
        h, w = img.shape[:2]
        boxes = rotated_boxes(rows[:, 1:].reshape(-1, 4, 2) * [w, h], 1, 1).double().numpy()  # in pixels
        assert state == "found" and len(rows)
        aspect = np.maximum(boxes[:, 2], boxes[:, 3]) / np.minimum(boxes[:, 2], boxes[:, 3])
        np.testing.assert_allclose(aspect, np.array(ASPECTS)[rows[:, 0].astype(int)], rtol=1e-4)
        covered = np.zeros((h, w), bool)
        for box in boxes[::-1]:  # the last drawn first: earlier ones may lie under it
            inner, ring = region(box, -1.5, (h, w)) & ~covered, region(box, 2.5, (h, w)) & ~region(box, 1.0, (h, w))
            inside = img[inner].astype(np.float64)
            assert inside.std(0).max() < 12  # one solid colour inside the label's rectangle
            assert np.abs(inside.mean(0) - img[ring & ~covered].mean(0)).max() > 25  # and another just outside it
            covered |= region(box, 1.0, (h, w))


def region(box: np.ndarray, grow: float, shape: tuple[int, int]) -> np.ndarray:
    """The pixels whose centres lie in the rotated box ``box`` (xywhr, pixels) with each side moved by ``grow``."""
    grown = torch.tensor([*box[:2], box[2] + 2 * grow, box[3] + 2 * grow, box[4]], dtype=torch.float64)
    mask = np.zeros(shape, np.uint8)
    cv2.fillPoly(mask, [np.round((xywhr2corners(grown).numpy() - 0.5) * 256).astype(np.int32)], 1, cv2.LINE_8,
                 shift=8)
    return mask > 0


def test_ensure_makes_the_set_once_and_never_into_a_users_folder(tmp_path: Path) -> None:
    root = ensure_synthetic_obb(tmp_path / "set", n_train=4, n_val=2, img_size=48)
    assert len(list((root / "labels" / "train").glob("*.txt"))) == 4 and (root / "synthetic.json").is_file()
    assert ensure_synthetic_obb(tmp_path / "set", n_train=4, n_val=2, img_size=48) == root
    (root / "labels" / "train" / "mine.txt").write_text("keep")  # a user's file in it: never removed
    with pytest.raises(GeneratedSetError, match="mine.txt"):
        ensure_synthetic_obb(tmp_path / "set", n_train=5, n_val=2, img_size=48)
    assert (root / "labels" / "train" / "mine.txt").read_text() == "keep"
