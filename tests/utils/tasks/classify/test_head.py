"""utils/tasks/classify/head.py: the Classify head and the -cls YAMLs, checked against the reference's facts
(parameter counts of every scale, children) and its behaviour (logits in training, probabilities in eval, the
``probs`` output contract)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.registry import ModelConfigError
from models.yolo import Model, load_model_config
from tests.helpers import built_on_meta
from utils.tasks.classify.head import HIDDEN, Classify
from utils.tasks.contract import ContractError, OutputContract

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Parameters at nc 1000, what ultralytics 8.4 prints for its yolov8-cls, yolo11-cls and yolo26-cls YAMLs (the n
# counts are the fixtures', tests/fixtures/ultralytics/README.md; YOLO26-cls is YOLO11-cls's network).
PARAMETERS = {
    "yolov8": (2_719_288, 6_361_736, 17_053_336, 37_480_744, 57_422_840),
    "yolo11": (2_812_104, 6_724_008, 11_634_216, 14_115_624, 29_637_064),
    "yolo26": (2_812_104, 6_724_008, 11_634_216, 14_115_624, 29_637_064),
}
GFLOPS = {  # at 640 px, what Model.flops counts (the README's models table)
    "yolov8": (3.4, 12.6, 41.8, 99.0, 154.1),
    "yolo11": (3.3, 12.1, 39.5, 49.6, 110.7),
    "yolo26": (3.3, 12.1, 39.5, 49.6, 110.7),
}
NAMES = [f"{family}{scale}-cls" for family in PARAMETERS for scale in "nsmlx"]


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_of_the_fifteen_classifiers(name: str) -> None:
    layers = built_on_meta(name)
    family = name[:-5]
    assert sum(p.numel() for p in layers.parameters()) == PARAMETERS[family]["nsmlx".index(name[-5])]
    head = layers[-1]
    assert isinstance(head, Classify) and head.task == "classify" and head.nc == 1000
    assert head.family == ("yolov8" if family == "yolov8" else "yolo11")
    assert list(dict(head.named_children())) == ["conv", "pool", "drop", "linear"]
    assert head.linear.in_features == HIDDEN and head.drop.p == 0.0


def test_train_logits_eval_probabilities_and_contract() -> None:
    torch.manual_seed(0)
    model = Model("yolov8n-cls.yaml", nc=7)
    assert model.stride.tolist() == [32.0] and "model.9.stride" not in model.state_dict()
    assert all(m.eps == 1e-5 and m.momentum == 0.1 for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    images = torch.rand(3, 3, 64, 64)
    logits = model(images)
    assert logits.shape == (3, 7)
    model.eval()
    with torch.no_grad():
        probs = model(images)
    assert probs.shape == (3, 7) and torch.allclose(probs.sum(1), torch.ones(3), atol=1e-6)
    with torch.no_grad():
        model.train()
        for m in model.modules():  # the same arithmetic: BatchNorm on its running statistics
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        assert torch.allclose(model(images).softmax(1), probs, atol=1e-6)
    contract = model.head.contract
    assert contract == OutputContract("probs", 7, task="classify") and contract.columns == 7 and contract.rank == 2
    contract.check(probs)
    with pytest.raises(ContractError, match=r"has shape \(3, 7, 1\); its contract \(probs, nc 7, classify task"):
        contract.check(probs.unsqueeze(-1))
    assert OutputContract.from_metadata(contract.metadata()) == contract
    meta = model.head.export_metadata()
    assert meta == {"contract": {"layout": "probs", "nc": 7, "extra": 0, "task": "classify"}, "stride": [32.0]}


def test_fused_equals_unfused_and_a_list_input_is_concatenated() -> None:
    torch.manual_seed(1)
    model = Model("yolo11n-cls.yaml", nc=5).eval()
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        plain = model(images)
        fused = Model("yolo11n-cls.yaml", nc=5)
        fused.load_state_dict(model.state_dict())
        fused = fused.eval().fuse()
        assert torch.allclose(fused(images), plain, atol=1e-5)
    head = Classify(6, 3).eval()
    a, b = torch.rand(1, 2, 4, 4), torch.rand(1, 4, 4, 4)
    with torch.no_grad():
        assert torch.equal(head([a, b]), head(torch.cat((a, b), 1)))


@pytest.mark.parametrize("args, message", [
    (["nc", 9], "kernel and stride in 1..7"),
    ([0], "class count"),
    ([True], "class count"),
    ([10, 1, 1, 1], "kernel and stride"),
])
def test_bad_classify_rows_are_refused_in_one_line(args: list, message: str) -> None:
    cfg, _ = load_model_config("yolov8n-cls.yaml")
    cfg["head"] = [[-1, 1, "Classify", args]]
    cfg["nc"] = 3
    with pytest.raises(ModelConfigError, match=message):
        Model(cfg)


@pytest.mark.parametrize("family", list(GFLOPS))
def test_the_stated_gflops_are_what_the_builder_counts(family: str) -> None:
    from models.yolo import Model

    assert Model(f"{family}n-cls.yaml").flops(640) == pytest.approx(GFLOPS[family][0], abs=0.05)
