"""The TensorFlow translations of the classify and obb heads (utils/tasks/classify/export.py,
utils/tasks/obb/export.py), what SavedModel and TFLite run: on ultralytics' own n-scale files (fused as export.py
fuses them) the graph gives the model's eval output: a classifier's probabilities, YOLO11-obb's rotated rows
[x, y, w, h, scores, angle], YOLO26-obb's final rows [x, y, w, h, score, class, angle] after its top-k; neither
has a raw-map (INT8) form, refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from utils.deploy.formats import FormatError, missing_packages
from utils.weights.checkpoint import load_model

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),  # not importorskip: tensorflow must load after triton
              pytest.mark.skipif(missing_packages((("tensorflow", "tensorflow-cpu"),)) != [],
                                 reason="pip install -r requirements-export.txt")]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ultralytics"
RELATIVE = 1e-4  # of each part's scale (its largest magnitude)


def fused(name: str) -> torch.nn.Module:
    """The fixture fused, its last class convolutions scaled so the scores spread over (0, 1) (seed 0)."""
    generator = torch.Generator().manual_seed(0)
    model = load_model(FIXTURES / f"{name}.pt", fuse=True)[0].float().eval()
    with torch.no_grad():
        for attribute in ("cv3", "one2one_cv3"):
            for branch in getattr(model.head, attribute, []):
                branch[-1].weight.mul_(20)
                branch[-1].bias.copy_(torch.randn(branch[-1].bias.shape, generator=generator))
    return model


def translated(model: torch.nn.Module, images: torch.Tensor, raw_maps: bool = False) -> torch.Tensor:
    from utils.deploy.tf_graph import import_tensorflow, nhwc_array, tf_module

    tf = import_tensorflow()
    b, _, h, w = images.shape
    return torch.from_numpy(tf_module(tf, model, (b, h, w, 3), raw_maps).serve(tf.constant(nhwc_array(images)))
                            .numpy())


def assert_close_parts(found: torch.Tensor, expected: torch.Tensor, parts: list[slice]) -> None:
    assert found.shape == expected.shape
    for part in parts:
        scale = expected[..., part].abs().max()
        assert (found[..., part] - expected[..., part]).abs().max() <= RELATIVE * scale, part


def test_a_classifier_translates_to_its_probabilities() -> None:
    model = load_model(FIXTURES / "yolo11n-cls.pt", fuse=True)[0].float().eval()
    images = torch.rand((2, 3, 96, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(images)
    found = translated(model, images)
    assert found.shape == (2, 1000) and found.sum(1).sub(1).abs().max() < 1e-5
    assert_close_parts(found, expected, [slice(None)])
    with pytest.raises(FormatError, match="classifier's TensorFlow export has no raw-map"):
        translated(model, images, raw_maps=True)


@pytest.mark.parametrize("name", ["yolo11n-obb", "yolo26n-obb"])
def test_an_obb_model_translates_to_its_rows(name: str) -> None:
    model = fused(name)
    images = torch.rand((2, 3, 96, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(images)
    found = translated(model, images)
    if model.head.contract.end_to_end:  # (b, k, 7): the same rows, paired by box and score (order may differ)
        assert found.shape == expected.shape and found.shape[-1] == 7
        for image_found, image_expected in zip(found, expected):
            scale = torch.tensor([image_expected[:, :4].abs().max()] * 4 + [1.0], dtype=torch.float64)
            twin = torch.cdist(image_found[:, :5].double() / scale, image_expected[:, :5].double() / scale).argmin(1)
            assert torch.equal(twin.sort().values, torch.arange(len(twin)))  # a one-to-one pairing
            assert torch.equal(image_found[:, 5], image_expected[twin, 5])
            assert_close_parts(image_found, image_expected[twin], [slice(0, 4), slice(4, 5), slice(6, 7)])
    else:  # (b, n, 4 + nc + 1)
        assert expected[..., 4:-1].std() > 0.1  # scores spread: the comparison means something
        assert_close_parts(found, expected, [slice(0, 4), slice(4, -1), slice(-1, None)])
    with pytest.raises(FormatError, match="oriented-box detector's TensorFlow export has no raw-map"):
        translated(model, images, raw_maps=True)
