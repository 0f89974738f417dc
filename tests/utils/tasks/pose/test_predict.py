"""utils/tasks/pose/predict.py: a pose model's keypoints in the original image's pixels, its --save-txt rows and the
test-time augmentation's passes moved back (scaled, mirrored with flip_idx), by hand; and utils/evaluation/tta.py
merging a pose model's passes while refusing what it cannot merge."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from utils.errors import UserError
from utils.evaluation.tta import AugmentError, DetectLayout, augmented_forward, merges
from utils.tasks.contract import OutputContract
from utils.tasks.pose.labels import parse_pose_rows
from utils.tasks.pose.predict import OUTPUTS, keypoints_in_original


def test_keypoints_go_back_through_the_letterbox() -> None:
    """A 100 x 50 image letterboxed to 64 x 64 (ratio 0.64, 16 px on top): input (32, 24) is original (50, 12.5)."""
    rows = torch.tensor([[0, 0, 10, 10, 0.9, 0, 32.0, 24.0, 0.8, 0.0, 16.0, 0.1]])
    points = keypoints_in_original(rows, (64, 64), (50, 100), ((0.64, 0.64), (0.0, 16.0)))
    assert points.flatten().tolist() == pytest.approx([50.0, 12.5, 0.8, 0.0, 0.0, 0.1])
    centred = keypoints_in_original(rows, (64, 64), (50, 100), None)  # the letterbox computed: the same
    assert torch.allclose(centred, points)


def test_label_rows_are_pose_rows_the_reader_accepts() -> None:
    det = np.array([[10.0, 5.0, 30.0, 45.0, 0.75, 0.0]])
    keypoints = np.array([[[20.0, 10.0, 0.9], [25.0, 40.0, 0.2]]])
    rows = OUTPUTS.label_rows(det, {"keypoints": keypoints}, (50, 100), save_conf=True)
    values = [float(v) for v in rows[0].split()]
    assert values == pytest.approx([0, 0.2, 0.5, 0.2, 0.8, 0.2, 0.2, 0.9, 0.25, 0.8, 0.2, 0.75])
    parsed = parse_pose_rows([rows[0].split()[:-1]], (2, 3), 1)  # without the confidence: a label row
    assert parsed.keypoints.shape == (1, 2, 3)


def test_a_mirrored_pass_is_scaled_mirrored_and_swapped_back() -> None:
    """Two keypoints (left, right) of a row of 1 class: a pass at half scale, mirrored in a 100 px wide input."""
    contract = OutputContract("xywh_cls", 1, 6, "pose")
    rows = torch.tensor([[[40.0, 20.0, 10.0, 10.0, 0.9, 10.0, 5.0, 0.7, 30.0, 6.0, 0.6]]])
    moved = OUTPUTS.deaugment(rows, contract, (0.5, 0.5), True, 100, {"flip_idx": [1, 0]})
    assert moved[0, 0, :5].tolist() == rows[0, 0, :5].tolist()  # boxes are tta's own business
    assert moved[0, 0, 5:].tolist() == pytest.approx([100 - 60.0, 12.0, 0.6, 100 - 20.0, 10.0, 0.7])
    plain = OUTPUTS.deaugment(rows, contract, (0.5, 0.5), False, 100, {})
    assert plain[0, 0, 5:].tolist() == pytest.approx([20.0, 10.0, 0.7, 60.0, 12.0, 0.6])
    with pytest.raises(UserError, match="records no flip_idx") as info:
        OUTPUTS.deaugment(rows, contract, (1.0, 1.0), True, 100, {"flip_idx": None})
    assert "\n" not in str(info.value)


def test_augmented_forward_merges_a_pose_models_passes() -> None:
    """A model that puts one keypoint on its image's brightest column (x = 16.5 in the input): every pass's keypoint
    comes back to it, the mirrored one's too (flipped to 47.5 and mirrored back)."""
    contract = OutputContract("xywh_cls", 1, 3, "pose")

    def predict(images: torch.Tensor) -> torch.Tensor:
        x = float(images[0, 0].sum(0).argmax()) + 0.5
        return torch.tensor([[[x, 8.0, 4.0, 4.0, 0.9, x, 8.0, 1.0]]]).expand(len(images), 1, 8)

    images = torch.zeros(1, 3, 64, 64)
    images[..., 16] = 1.0
    merged = augmented_forward(predict, images, DetectLayout((8.0,), 1, {"flip_idx": [0]}), contract)
    assert merged.shape == (1, 3, 8)
    assert merged[0, :, 5].tolist() == pytest.approx([16.5] * 3, abs=1.0)  # interpolation: within a pixel
    assert torch.equal(merged[0, :, 0], merged[0, :, 5])  # the boxes moved the same way
    assert merges(contract) and not merges(OutputContract("xyxy_score_cls", 1, 3, "pose"))
    assert not merges(OutputContract("xywh_cls", 1, 32, "segment"))  # its prototypes do not follow
    with pytest.raises(AugmentError, match="do not follow them"):
        augmented_forward(predict, images, DetectLayout((8.0,), 1), OutputContract("xywh_cls", 1, 32, "segment"))
