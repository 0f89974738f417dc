"""utils/tasks/classify/predict.py: a classifier's probabilities ranked into rows through the one post-processing
call, and the top-5 listed, drawn and written as detect.py and the hub model show them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from utils.tasks.classify.predict import OUTPUTS, draw_topk, topk, topk_lines
from utils.tasks.contract import OutputContract, postprocess


def test_topk_lines_and_drawing() -> None:
    probs = np.array([0.05, 0.5, 0.1, 0.2, 0.05, 0.1])
    assert topk(probs, 3) == [(1, 0.5), (3, 0.2), (2, 0.1)]  # a tie goes to the lower class
    names = ["a", "b", "c", "d", "e", "f"]
    assert topk_lines(probs, names) == ["0.50 b", "0.20 d", "0.10 c", "0.10 f", "0.05 a"]
    assert topk_lines(probs[:2], None) == ["0.50 1", "0.05 0"]  # fewer classes than five; no names
    img = np.full((120, 160, 3), 100, np.uint8)
    out = draw_topk(img.copy(), probs, names)
    changed = (out != 100).any(2)
    rows = np.nonzero(changed.any(1))[0]
    assert rows.min() < 10 and 40 < rows.max() < 110  # five lines from the top
    assert not changed[:, 120:].any()  # short labels: the right side untouched
    assert (out[2:4, 2:20] == 32).all()  # the dark band behind the text


def test_probabilities_become_ranked_rows_without_thresholds() -> None:
    probs = torch.tensor([[0.1, 0.6, 0.05, 0.25], [0.4, 0.1, 0.4, 0.1]])
    contract = OutputContract("probs", 4, task="classify")
    first, second = postprocess(probs, contract, conf_thres=0.5, iou_thres=0.1)
    assert first.shape == (4, 6) and not first[:, :4].any()  # no boxes; every class, whatever the threshold
    assert first[:, 5].tolist() == [1, 3, 0, 2] and first[:, 4].tolist() == pytest.approx([0.6, 0.25, 0.1, 0.05])
    assert second[:, 5].tolist()[:2] == [0, 2]  # a tie: the lower class first
    only = postprocess(probs, contract, classes=[2, 3], max_det=1)[0]
    assert only[:, 5].tolist() == [3]
    results = OUTPUTS.image(first, (), 0, (32, 32), first[:, :4], (40, 50), None)
    assert results == {"top5": [(1, pytest.approx(0.6)), (3, pytest.approx(0.25)), (0, pytest.approx(0.1)),
                                (2, pytest.approx(0.05))]}
    names = ["a", "b", "c", "d"]
    assert OUTPUTS.describe(first.numpy(), results, names) == "b 0.60, d 0.25, a 0.10, c 0.05"
    assert OUTPUTS.label_rows(first.numpy(), results, (40, 50), False) == ["0.60 1", "0.25 3", "0.10 0", "0.05 2"]
    image = np.full((40, 50, 3), 100, np.uint8)
    drawn = OUTPUTS.draw_labelled(image.copy(), first.numpy(), results, names, 2, False, False)
    assert np.array_equal(drawn, draw_topk(image.copy(), np.array([0.1, 0.6, 0.05, 0.25]), names))
    assert np.array_equal(OUTPUTS.draw_labelled(image.copy(), first.numpy(), results, names, 2, True, False), image)


def test_a_classifier_fits_its_input_as_validation_does_and_the_base_task_letterboxes() -> None:
    """detect.py, the hub model and --int8's calibration read images through the task's fit_input: a classifier's
    are resized and centre-cropped as validation crops them (a letterbox's grey bars are nothing it trained on)."""
    from utils.boxes import scale_boxes
    from utils.data.augment import letterbox
    from utils.evaluation.task_outputs import BOXES_ONLY
    from utils.tasks.classify.augment import val_transform

    wide = np.random.default_rng(0).integers(0, 255, (90, 150, 3), dtype=np.uint8)
    image, ratio_pad = OUTPUTS.fit_input(wide, (64, 64), 32, True)  # stride and auto do not apply to a crop
    assert np.array_equal(image, val_transform(wide, 64))
    no_box = torch.zeros(1, 4)  # a classifier's rows: their box columns stay zeros in the original
    assert not scale_boxes((64, 64), no_box, (90, 150), ratio_pad).any()
    assert OUTPUTS.fit_input(wide, (48, 64), 32, False)[0].shape == (48, 64, 3)  # an (h, w) input: covered, cropped
    assert np.array_equal(OUTPUTS.fit_input(wide, 64)[0], image)
    boxed, ratio_pad = BOXES_ONLY.fit_input(wide, (64, 64), 32, False)
    expected, ratio, pad = letterbox(wide, (64, 64), stride=32, auto=False)
    assert np.array_equal(boxed, expected) and ratio_pad == ((ratio[1], ratio[0]), pad)
