"""utils/tasks/obb/head.py: the OBB heads and the -obb YAMLs, checked against the reference's facts (parameter
counts of every scale, children in the release files' order), a hand-computed rotated decode, and the outputs of
both head kinds with their output contracts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from models.registry import ModelConfigError
from models.yolo import Model, load_model_config
from tests.helpers import built_on_meta
from utils.tasks.contract import ContractError, OutputContract
from utils.tasks.obb.head import AnchorFreeOBB, EndToEndOBB, dist2rbox

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Parameters at nc 80, what ultralytics 8.4 prints for its yolov8-obb, yolo11-obb and yolo26-obb YAMLs (the n counts
# are in tests/fixtures/ultralytics/README.md; at nc 15, DOTA's, they are the fixtures' counts, checked below).
PARAMETERS = {
    "yolov8": (3_228_867, 11_452_739, 26_463_235, 44_540_355, 69_555_651),
    "yolo11": (2_695_747, 9_744_931, 20_963_523, 26_220_995, 58_875_331),
    "yolo26": (2_715_614, 10_582_142, 23_593_918, 27_997_374, 62_811_678),
}
AT_NC15 = {"yolov8": 3_085_440, "yolo11": 2_664_432, "yolo26": 2_652_984}  # the fixtures' n models
GFLOPS = {  # at 640 px and nc 80, what Model.flops counts (the README's models table)
    "yolov8": (9.0, 29.7, 81.3, 169.1, 263.9),
    "yolo11": (6.8, 22.6, 71.9, 91.0, 203.7),
    "yolo26": (5.7, 21.8, 72.2, 90.5, 202.7),
}
NAMES = [f"{family}{scale}-obb" for family in PARAMETERS for scale in "nsmlx"]


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_of_the_fifteen_obb_models(name: str) -> None:
    layers = built_on_meta(name)
    family = name[:-5]
    assert sum(p.numel() for p in layers.parameters()) == PARAMETERS[family]["nsmlx".index(name[-5])]
    head = layers[-1]
    assert head.task == "obb" and head.family == family and head.ne == 1
    children = ["cv2", "cv3", "dfl", "cv4"] if family != "yolo26" else \
        ["cv2", "cv3", "dfl", "one2one_cv2", "one2one_cv3", "cv4", "one2one_cv4"]
    assert list(dict(head.named_children())) == children
    if name.endswith("n-obb"):
        assert sum(p.numel() for p in built_on_meta(name, nc=15).parameters()) == AT_NC15[family]


def test_dist2rbox_by_hand() -> None:
    sides = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 4, 1)  # left, top, right, bottom in the box's frame
    point = torch.tensor([10.0, 20.0]).view(1, 2, 1)
    flat = dist2rbox(sides, torch.zeros(1, 1, 1), point).flatten().tolist()
    assert flat == [11.0, 21.0, 4.0, 6.0]  # centre offset ((3 - 1) / 2, (4 - 2) / 2), width 1 + 3, height 2 + 4
    turned = dist2rbox(sides, torch.full((1, 1, 1), math.pi / 2), point).flatten()
    assert torch.allclose(turned, torch.tensor([9.0, 21.0, 4.0, 6.0]), atol=1e-6)  # (1, 1) turned by 90 degrees


def test_anchor_free_obb_outputs() -> None:
    torch.manual_seed(0)
    model = Model("yolo11n-obb.yaml", nc=3)
    assert isinstance(model.head, AnchorFreeOBB) and model.head.contract == OutputContract("xywh_cls", 3, 1, "obb")
    images = torch.rand(2, 3, 64, 64)
    for m in model.modules():  # BatchNorm on its running statistics: train and eval mode do the same arithmetic
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    out = model(images)
    assert out["angles"].shape == (2, 1, 84) and out["scores"].shape == (2, 3, 84)
    assert ((out["angles"] >= -math.pi / 4) & (out["angles"] < 3 * math.pi / 4)).all()
    model.eval()
    with torch.no_grad():
        rows = model(images)
    assert rows.shape == (2, 84, 4 + 3 + 1)
    model.head.contract.check(rows)
    assert torch.allclose(rows[..., -1], out["angles"][:, 0], atol=1e-6)  # same weights, same angles
    assert ((rows[..., 4:7] > 0) & (rows[..., 4:7] < 1)).all() and (rows[..., 2:4] > 0).all()
    meta = model.head.export_metadata()
    assert meta["contract"] == {"layout": "xywh_cls", "nc": 3, "extra": 1, "task": "obb"}


def test_end_to_end_obb_outputs_are_the_best_one_to_one_rows() -> None:
    torch.manual_seed(0)
    model = Model("yolo26n-obb.yaml", nc=4)
    head = model.head
    assert isinstance(head, EndToEndOBB) and head.contract == OutputContract("xyxy_score_cls", 4, 1, "obb")
    train = model(torch.rand(1, 3, 64, 64))
    assert set(train) == {"one2many", "one2one"} and train["one2one"]["angles"].shape == (1, 1, 84)
    model.eval()
    captured = {}
    hook = head.register_forward_pre_hook(lambda module, inputs: captured.setdefault("xs", inputs[0]))
    with torch.no_grad():
        final = model(torch.rand(2, 3, 64, 64))
        hook.remove()
        decoded = head.decode_one2one(captured["xs"])  # (b, n, 4 + nc + 1)
    assert final.shape == (2, 84, 7)
    head.contract.check(final)
    scores = decoded[..., 4:8]
    best, flat = scores.flatten(1).max(1)
    for image in range(2):
        cell, cls = divmod(int(flat[image]), 4)
        expected = torch.cat((decoded[image, cell, :4], best[image].view(1), torch.tensor([float(cls)]),
                              decoded[image, cell, 8:]))  # xywh, score, class, angle
        assert torch.allclose(final[image, 0], expected, atol=1e-6)
    assert (final[..., 4].diff(dim=1) <= 0).all()  # best first (column 4: the score)
    head.end_to_end = False
    with torch.no_grad():
        many = model(torch.rand(1, 3, 64, 64))
    assert many.shape == (1, 84, 9) and head.contract.layout == "xywh_cls"


def test_contract_checks_and_bad_rows() -> None:
    contract = OutputContract("xyxy_score_cls", 15, 1, "obb")
    assert contract.end_to_end and contract.columns == 7
    assert OutputContract.from_metadata(contract.metadata()) == contract
    assert OutputContract("xywh_cls", 15, 1, "obb").columns == 20
    with pytest.raises(ContractError, match="needs \\(batch, boxes, 7\\)"):
        contract.check(torch.zeros(1, 5, 6))
    cfg, _ = load_model_config("yolo11n-obb.yaml")
    cfg["head"][-1][-1] = ["nc", 2]
    with pytest.raises(ModelConfigError, match="one angle per box"):
        Model(cfg)


@pytest.mark.parametrize("family", list(GFLOPS))
def test_the_stated_gflops_are_what_the_builder_counts(family: str) -> None:
    from models.yolo import Model

    assert Model(f"{family}n-obb.yaml").flops(640) == pytest.approx(GFLOPS[family][0], abs=0.05)
