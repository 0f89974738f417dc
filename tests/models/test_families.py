"""YOLOv8, YOLO11 and YOLO26 from their family YAMLs: exact sizes, names resolved to scales, the heads' outputs and
interface, fusing, the open registry and the config checks of the new keys."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from torch import nn

import models.yolo as yolo
from models.blocks import C2PSA, Attention, C3k, C3k2
from models.common import Conv, exporting
from models.head_anchor_free import AnchorFreeDetect, make_anchors
from models.head_end_to_end import EndToEndDetect
from models.registry import RowArgs, channel_args, register_module
from models.yolo import Model, ModelConfigError, load_model_config, parse_model
from tests.helpers import built_on_meta
from utils.tasks.contract import OutputContract

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Parameters with nc=80 as ultralytics prints them (YOLO26 s..x: what its YAML builds, see docs/models.md).
PARAMETERS = {
    "yolov8": (3_157_200, 11_166_560, 25_902_640, 43_691_520, 68_229_648),
    "yolo11": (2_624_080, 9_458_752, 20_114_688, 25_372_160, 56_966_176),
    "yolo26": (2_572_280, 10_009_784, 21_896_248, 26_299_704, 58_993_368),
}
NAMES = [f"{family}{scale}" for family in PARAMETERS for scale in "nsmlx"]


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_of_the_fifteen_models(name: str) -> None:
    expected = PARAMETERS[name[:-1]]["nsmlx".index(name[-1])]
    assert sum(p.numel() for p in built_on_meta(name).parameters()) == expected


def test_inner_blocks_follow_the_scale() -> None:
    """YOLO11 m/l/x use C3k inside every C3k2 (the YAML says False), n/s only where the YAML says True; YOLO11 and
    YOLO26 heads have the depthwise class branch, YOLOv8's has not; YOLO26's last neck block has attention."""
    small, medium = built_on_meta("yolo11n"), built_on_meta("yolo11m")
    assert not isinstance(small[2].m[0], C3k) and isinstance(small[6].m[0], C3k)
    assert all(isinstance(block.m[0], C3k) for block in medium if isinstance(block, C3k2))
    assert small[-1].depthwise_cls and not built_on_meta("yolov8n")[-1].depthwise_cls
    yolo26 = built_on_meta("yolo26n")
    assert isinstance(yolo26[22].m[0][1].attn, Attention) and yolo26[9].add and isinstance(yolo26[9].cv1.act,
                                                                                        nn.Identity)
    assert isinstance(yolo26[10], C2PSA) and isinstance(yolo26[-1], EndToEndDetect) and yolo26[-1].reg_max == 1


def test_scaled_names_resolve_to_the_family_file(tmp_path) -> None:
    cfg, source = load_model_config("yolo11s.yaml")
    assert source.endswith("yolo11.yaml") and cfg["scale"] == "s" and cfg["yaml_file"] == "yolo11s.yaml"
    assert load_model_config("yolov8x")[0]["scale"] == "x"
    with pytest.raises(ModelConfigError, match="yolo11q.yaml not found"):
        load_model_config("yolo11q.yaml")
    own = tmp_path / "yolo11.yaml"  # a family file beside the name asked for wins over models/
    own.write_text((yolo.MODELS_DIR / "yolo11.yaml").read_text().replace("nc: 80", "nc: 7"))
    cfg, source = load_model_config(tmp_path / "yolo11l.yaml")
    assert source == str(own) and cfg["nc"] == 7 and cfg["scale"] == "l"


def test_family_file_without_a_scale_takes_the_first_with_a_warning(yolo_log: list[str]) -> None:
    cfg, _ = load_model_config("yolov8.yaml")
    assert "scale" not in cfg
    with torch.device("meta"):
        layers, _, _ = parse_model(cfg, 3, "yolov8.yaml")
    assert sum(p.numel() for p in layers.parameters()) == PARAMETERS["yolov8"][0]
    assert any("no model scale given" in line and "'n'" in line for line in yolo_log)


@pytest.fixture(scope="module")
def models_n() -> dict[str, Model]:
    torch.manual_seed(0)
    return {name: Model(f"{name}.yaml", nc=3) for name in ("yolov8n", "yolo11n", "yolo26n")}


@pytest.mark.parametrize("name, family, layout", [("yolov8n", "yolov8", "xywh_cls"), ("yolo11n", "yolo11", "xywh_cls"),
                                                  ("yolo26n", "yolo26", "xyxy_score_cls")])
def test_head_interface(models_n: dict[str, Model], name: str, family: str, layout: str) -> None:
    head = models_n[name].head
    assert head is models_n[name].detect and head.family == family and head.task == "detect"
    assert not head.anchor_based and head.contract == OutputContract(layout, 3)
    assert head.stride.tolist() == [8.0, 16.0, 32.0] and "stride" in dict(head.named_buffers())
    meta = head.export_metadata()
    assert meta["contract"] == {"layout": layout, "nc": 3, "extra": 0, "task": "detect"}
    assert meta["stride"] == [8.0, 16.0, 32.0]
    assert meta["reg_max"] == (1 if family == "yolo26" else 16)


def test_train_and_eval_outputs_of_the_anchor_free_head(models_n: dict[str, Model]) -> None:
    model = models_n["yolo11n"]
    x = torch.rand(2, 3, 64, 96)
    out = model.train()(x)
    n = 8 * 12 + 4 * 6 + 2 * 3
    assert out["boxes"].shape == (2, 64, n) and out["scores"].shape == (2, 3, n)
    assert out["feature_sizes"] == [(8, 12), (4, 6), (2, 3)]
    assert out["anchor_points"][:2].tolist() == [[0.5, 0.5], [1.5, 0.5]] and out["stride_tensor"][-1].item() == 32
    with torch.no_grad():
        decoded = model.eval()(x)
        model.head.training = True  # the head alone (not its BatchNorms): raw outputs, decoded by hand below
        raw = model(x)
        model.head.training = False
    assert decoded.shape == (2, n, 4 + 3)
    torch.testing.assert_close(decoded, model.head.decode(raw))
    # by hand: expected value of each side's 16-bin softmax around the cell centre, times the stride
    sides = (raw["boxes"].view(2, 4, 16, n).softmax(2) * torch.arange(16.0).view(1, 1, 16, 1)).sum(2)
    centre = raw["anchor_points"].T + (sides[:, 2:] - sides[:, :2]) / 2
    torch.testing.assert_close(decoded[..., :2], (centre * raw["stride_tensor"].T).transpose(1, 2))
    torch.testing.assert_close(decoded[..., 2:4], ((sides[:, :2] + sides[:, 2:]) * raw["stride_tensor"].T)
                               .transpose(1, 2))
    torch.testing.assert_close(decoded[..., 4:], raw["scores"].sigmoid().transpose(1, 2))


def test_end_to_end_head_trains_two_branches_and_returns_final_rows(models_n: dict[str, Model]) -> None:
    model = models_n["yolo26n"]
    x = torch.rand(2, 3, 64, 64)
    out = model.train()(x)
    assert set(out) == {"one2many", "one2one"} and out["one2one"]["boxes"].shape == (2, 4, 84)
    out["one2one"]["scores"].sum().backward()  # the one-to-one branches see detached features
    assert model.model[0].conv.weight.grad is None and model.head.one2one_cv3[0][-1].weight.grad is not None
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        rows = model.eval()(x)
        capture = {}
        hook = model.head.register_forward_pre_hook(lambda m, inputs: capture.setdefault("xs", inputs[0]))
        model(x)
        hook.remove()
        decoded = model.head.decode_one2one(capture["xs"])
    assert rows.shape == (2, 84, 6)  # min(max_det 300, 84 cells)
    scores, classes = decoded[..., 4:].max(-1)
    best = scores[0].argmax()
    assert rows[0, 0, 4] == scores[0].max() and rows[0, 0, 5] == classes[0, best]
    torch.testing.assert_close(rows[0, 0, :4], decoded[0, best, :4])
    assert (rows[..., 4].diff(dim=1) <= 0).all()  # best first


def test_end_to_end_selection_by_hand() -> None:
    """Two cells, two classes, k = 2: the best (cell, class) pairs, a cell may appear twice."""
    head = EndToEndDetect(nc=2, reg_max=1, ch=(16,), max_det=2)
    boxes = torch.tensor([[0.0, 0, 10, 10], [5, 5, 20, 20], [1, 1, 2, 2]])
    scores = torch.tensor([[0.9, 0.8], [0.1, 0.3], [0.85, 0.0]])
    rows = head.select(torch.cat((boxes, scores), 1).unsqueeze(0))
    assert rows[0].tolist() == [[0.0, 0, 10, 10, pytest.approx(0.9), 0], [1, 1, 2, 2, pytest.approx(0.85), 0]]


def test_bias_priors(models_n: dict[str, Model]) -> None:
    for name in ("yolov8n", "yolo26n"):
        head = models_n[name].head
        branches = [(head.cv2, head.cv3)] + ([(head.one2one_cv2, head.one2one_cv3)] if name == "yolo26n" else [])
        for box_branches, cls_branches in branches:
            for box, cls, stride in zip(box_branches, cls_branches, (8, 16, 32)):
                assert torch.all(box[-1].bias == 2.0)
                torch.testing.assert_close(cls[-1].bias, torch.full((3,), math.log(5 / 3 / (640 / stride) ** 2)))
    head = copy.deepcopy(models_n["yolo11n"].head)
    head.init_biases(class_freq=torch.tensor([1.0, 1.0, 2.0]))
    torch.testing.assert_close(head.cv3[0][-1].bias, torch.log(5 * torch.tensor([0.25, 0.25, 0.5]) / 80 ** 2))


@pytest.mark.parametrize("name", ["yolov8n", "yolo11n", "yolo26n"])
def test_fused_equals_unfused(models_n: dict[str, Model], name: str) -> None:
    model = copy.deepcopy(models_n[name]).eval()
    for m in model.modules():  # non-trivial BatchNorm statistics, so folding them is tested
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 1.5)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        unfused = _pre_selection(model, x)
        fused_model = copy.deepcopy(model).fuse()
        fused = _pre_selection(fused_model, x)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused_model.modules())
    torch.testing.assert_close(fused, unfused, rtol=1e-4, atol=1e-3)


def _pre_selection(model: Model, x: torch.Tensor) -> torch.Tensor:
    """The eval output, or for an end-to-end head its decoded rows before the top-k (ties may order differently)."""
    if not isinstance(model.head, EndToEndDetect):
        return model(x)
    capture = {}
    hook = model.head.register_forward_pre_hook(lambda m, inputs: capture.setdefault("xs", inputs[0]))
    model(x)
    hook.remove()
    return model.head.decode_one2one(capture["xs"])


def test_rebuilt_from_its_yaml_dict_gives_the_same_tensors(models_n: dict[str, Model]) -> None:
    model = models_n["yolo26n"]
    again = Model(copy.deepcopy(model.yaml))
    again.load_state_dict(model.state_dict())
    assert again.yaml["scale"] == "n" and isinstance(again.head, EndToEndDetect)


def test_attention_fused_kernel_equals_the_export_path() -> None:
    torch.manual_seed(0)
    attention = Attention(128, num_heads=2).eval()
    x = torch.rand(2, 128, 5, 7)
    with torch.no_grad():
        fast = attention(x)
        traced = torch.jit.trace(attention, x)  # while tracing: the plain products
        assert not exporting()
        plain = traced(x)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


def test_make_anchors_by_hand() -> None:
    points, strides = make_anchors([(1, 2), (1, 1)], [8, 16])
    assert points.tolist() == [[0.5, 0.5], [1.5, 0.5], [0.5, 0.5]] and strides.view(-1).tolist() == [8, 8, 16]


# ------------------------------------------------------------------------------------------ the open registry
def test_a_registered_block_is_usable_from_a_yaml() -> None:
    @register_module("Twice")
    class Twice(nn.Module):
        """A test block: a Conv applied to its input, output channels doubled by the YAML's own number."""

        @classmethod
        def yaml_args(cls, row) -> RowArgs:
            built = channel_args(row)
            return RowArgs(built.args, built.repeats, built.c_out)

        def __init__(self, c_in: int, c_out: int) -> None:
            super().__init__()
            self.conv = Conv(c_in, c_out, 3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

    cfg, _ = load_model_config("yolov8n.yaml")
    cfg["backbone"][1] = [-1, 1, "Twice", [128]]
    model = Model(cfg)
    assert type(model.model[1]).__name__ == "Twice" and model.model[1].type.endswith("Twice")
    assert model.stride.tolist() == [8.0, 16.0, 32.0]


def test_one_name_several_heads_chosen_by_the_row(tiny_cfg: dict) -> None:
    assert type(Model(tiny_cfg).head).__name__ == "Detect"  # [nc, anchors]: YOLOv5's
    cfg, _ = load_model_config("yolo11n.yaml")
    cfg["end2end"] = True
    assert isinstance(Model(cfg).head, EndToEndDetect)
    cfg["end2end"] = False
    assert type(Model(cfg).head) is AnchorFreeDetect


@pytest.mark.parametrize("edit, pattern", [
    (lambda c: c.update(reg_max=0), r"row 23 .*reg_max must be an integer in 1\.\.64"),
    (lambda c: c.update(reg_max=True), r"reg_max must be an integer"),
    (lambda c: c.update(scale="q"), r"scale 'q' is not one of \['l', 'm', 'n', 's', 'x'\]"),
    (lambda c: c["scales"].update(n=[0.5, 99, 1024]), r"width must be a number in \(0, 4\.0\]"),
    (lambda c: c["scales"].update(n=[0.5, 0.25, 2]), r"max_channels must be a number of at least 8"),
    (lambda c: c.update(scales=[1, 2]), r"scales must map scale letters"),
    (lambda c: c["backbone"].__setitem__(10, [-1, 2, "C2PSA", [512]]), r"row 10 .*C2PSA.* is not valid: C2PSA keeps"),
    (lambda c: c["head"].__setitem__(-1, [[16, 19, 22], 1, "Detect", ["nc", 5, 6]]), r"row 23 .*anchors must be"),
    (lambda c: c["head"].__setitem__(-1, [-1, 1, "C3k2", [64]]), r"last head row must be a detection head"),
])
def test_bad_new_keys_are_one_line_errors(edit, pattern: str) -> None:
    cfg, _ = load_model_config("yolo11n.yaml")
    edit(cfg)
    with pytest.raises(ModelConfigError) as info:
        Model(cfg)
    assert "\n" not in str(info.value) and re.search(pattern, str(info.value)), str(info.value)


def test_end_to_end_head_can_give_the_one_to_many_decode_for_nms(models_n: dict[str, Model]) -> None:
    """``end_to_end = False``: the eval output and contract become the one-to-many branches' (as ultralytics 8.4
    without nms=False)."""
    model = copy.deepcopy(models_n["yolo26n"]).eval()
    model.head.end_to_end = False
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        out = model(x)
        model.head.training = True
        raw = model(x)["one2many"]
    assert model.head.contract == OutputContract("xywh_cls", 3) and out.shape == (1, 84, 7)
    torch.testing.assert_close(out, model.head.decode(raw))


# ------------------------------------------------------------------------------------------ docs/models.md
DOC = (yolo.MODELS_DIR.parent / "docs" / "models.md").read_text()
DOC_SIZES = {name: (int(params.replace(",", "")), float(gflops)) for name, params, gflops in
             re.findall(r"\| (yolo\w+) \| ([\d,]+) \| ([\d.]+) ", DOC)}


def test_the_docs_table_lists_the_fifteen_models() -> None:
    assert sorted(DOC_SIZES) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_docs_sizes_are_what_the_builder_prints(name: str) -> None:
    params, gflops = DOC_SIZES[name]
    assert params == PARAMETERS[name[:-1]]["nsmlx".index(name[-1])]
    torch.manual_seed(0)
    assert Model(f"{name}.yaml").flops(640) == pytest.approx(gflops, abs=0.05)


def test_end_to_end_rows_ignore_the_nms_settings(models_n: dict[str, Model]) -> None:
    """docs/models.md: for YOLO26 --iou-thres and --agnostic-nms change nothing; the thresholds only filter rows."""
    from utils.tasks.contract import postprocess

    model = models_n["yolo26n"].eval()
    with torch.no_grad():
        rows = model(torch.rand(2, 3, 64, 64))
    contract = model.head.contract
    base = postprocess(rows, contract, conf_thres=0.0, iou_thres=0.45)
    for other in (postprocess(rows, contract, conf_thres=0.0, iou_thres=0.9),
                  postprocess(rows, contract, conf_thres=0.0, iou_thres=0.1, agnostic=True)):
        assert all(torch.equal(a, b) for a, b in zip(base, other))
    assert [len(r) for r in base] == [84, 84]
    assert [len(r) for r in postprocess(rows, contract, conf_thres=0.0, max_det=5)] == [5, 5]


def test_a_traced_anchor_free_head_follows_the_input_size() -> None:
    """The anchor points of a traced (exported) head come from the traced feature sizes, so a --dynamic export
    decodes any input size: traced at 64 px, run at 96 x 64 it gives the eager model's rows."""
    torch.manual_seed(0)
    model = Model("yolo11n.yaml", nc=3).eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, torch.rand(1, 3, 64, 64), check_trace=False)
        other = torch.rand(2, 3, 96, 64)
        assert torch.allclose(traced(other), model(other), atol=1e-4)
