"""Test-time augmentation: scaled passes padded like the reference, boxes mapped back to the input's frame, the
reference's level clipping."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import box_iou

from tests.helpers import bright_box_predict
from utils.boxes import non_max_suppression
from utils.evaluation.tta import PAD_VALUE, DetectLayout, augmented_forward, scale_image

LAYOUT = DetectLayout((8.0, 16.0, 32.0), 3)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def scene(height: int = 192, width: int = 256, box: tuple[int, int, int, int] = (150, 40, 227, 117)) -> torch.Tensor:
    """A black (1, 3, h, w) image with one white rectangle x1, y1, x2, y2 (off-centre, so a wrong un-flip shows)."""
    image = torch.zeros(1, 3, height, width)
    x1, y1, x2, y2 = box
    image[..., y1:y2, x1:x2] = 1.0
    return image


def best_box(pred: torch.Tensor) -> torch.Tensor:
    return non_max_suppression(pred, 0.25, 0.45)[0][:1, :4]


def test_scale_image_resizes_and_pads_to_the_stride_with_grey() -> None:
    images = torch.rand(2, 3, 192, 256)
    assert scale_image(images, 1.0, 32) is images
    scaled = scale_image(images, 0.67, 32)
    assert scaled.shape == (2, 3, 160, 192)  # 128 x 171 resized, padded up to multiples of 32
    assert torch.all(scaled[..., 128:, :] == PAD_VALUE) and torch.all(scaled[..., :, 171:] == PAD_VALUE)
    assert scaled[..., :128, :171].std() > 0.1  # the picture itself, not padding


def test_augmented_boxes_are_in_the_input_frame_and_differ_from_the_plain_run() -> None:
    images = scene()
    plain = best_box(bright_box_predict(images))
    torch.testing.assert_close(plain, torch.tensor([[150.0, 40.0, 227.0, 117.0]]))
    augmented = augmented_forward(bright_box_predict, images, LAYOUT)
    tta = best_box(augmented)
    assert box_iou(tta, plain).item() > 0.9  # mapped back: de-scaled and un-flipped
    assert not torch.equal(tta, plain)  # the 77 px box fits the 0.83 pass best: its box wins, not the plain one
    # each pass alone lands on the object too (a missing un-flip would put the flipped pass's box at x 29..106)
    counts = [LAYOUT.counts(192, 256), LAYOUT.counts(160, 224), LAYOUT.counts(160, 192)]
    first = sum(counts[0][:-1])
    flipped = augmented[:, first:first + sum(counts[1])]
    assert box_iou(best_box(flipped), plain).item() > 0.9


def test_levels_are_clipped_as_the_reference_does() -> None:
    images = scene()
    augmented = augmented_forward(bright_box_predict, images, LAYOUT)
    scale1, scale083, scale067 = LAYOUT.counts(192, 256), LAYOUT.counts(160, 224), LAYOUT.counts(160, 192)
    # scale 1 without its coarsest level, the flipped 0.83 pass whole, scale 0.67 without its finest level
    assert augmented.shape[1] == sum(scale1[:-1]) + sum(scale083) + sum(scale067[1:])
    unknown = augmented_forward(lambda x: bright_box_predict(x)[:, :10], images, LAYOUT)  # rows of another layout
    assert unknown.shape[1] == 30  # kept whole
