"""utils/tasks/pose/head.py: the Pose heads (YOLOv8/YOLO11, YOLO26), checked against the reference's facts
(parameter counts of every scale, state-dict layout), hand-computed keypoint decodes, the flow's density against
torch.distributions and its own Jacobian, and one-line refusals."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from models.registry import ModelConfigError
from models.yolo import Model, load_model_config
from tests.helpers import built_on_meta
from utils.tasks.contract import OutputContract, postprocess
from utils.tasks.pose.head import AnchorFreePoseHead, EndToEndPoseHead, RealNVP, decode_keypoints

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# At each YAML's own class count (nc 1 for yolov8-pose, 80 for the others, as ultralytics' YAMLs are written). The n
# counts are ultralytics 8.4's (tests/fixtures/ultralytics/README.md); yolo11-pose s..x are the summaries its YAML
# prints; the rest what the same YAML facts build (checked below against the
# published figures in millions).
PARAMETERS = {
    "yolov8-pose": (3_295_470, 11_626_046, 26_464_462, 44_489_196, 69_491_724),
    "yolo11-pose": (2_908_507, 9_948_811, 20_973_273, 26_230_745, 58_889_881),
    "yolo26-pose": (3_747_554, 11_870_498, 24_344_482, 28_747_938, 62_914_350),
}
NAMES = [family.replace("-", f"{scale}-") for family in PARAMETERS for scale in "nsmlx"]


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_of_every_scale(name: str) -> None:
    family = name.replace(name[name.index("-") - 1] + "-", "-")
    layers = built_on_meta(name)
    assert params(layers) == PARAMETERS[family]["nsmlx".index(name[name.index("-") - 1])]
    head = layers[-1]
    assert head.task == family.split("-")[1].replace("seg", "segment")
    assert head.family == family.split("-")[0]


# Published parameter counts (millions) of the released models (nc 1, COCO keypoints): YOLO11-pose's of the models as
# built; YOLO26-pose's of the deployed model (the one-to-one branches only, no flow or scales, BatchNorm folded into
# the convolutions); YOLOv8-pose's table dates from an earlier release and rounds within 0.1 of ours.
PUBLISHED_POSE = {"yolov8": (3.3, 11.6, 26.4, 44.4, 69.4), "yolo11": (2.9, 9.9, 20.9, 26.2, 58.8),
                  "yolo26": (2.9, 10.4, 21.5, 25.9, 57.6)}
DEPLOYED_AWAY = ("cv2", "cv3", "cv4", "cv4_kpts", "cv4_sigma", "one2one_cv4_sigma", "flow_model")


def deployed_parameters(layers: nn.Sequential) -> int:
    """Parameters of the model as ultralytics deploys YOLO26: the one-to-many branches, the flow and the scale convs
    removed, each BatchNorm folded into its convolution's bias (two parameters per channel become one)."""
    head = layers[-1]
    away = {id(m) for name in DEPLOYED_AWAY for m in getattr(head, name).modules()}
    kept = [m for m in layers.modules() if id(m) not in away]
    weights = sum(p.numel() for m in kept for p in m.parameters(recurse=False))
    return weights - sum(m.num_features for m in kept if isinstance(m, nn.BatchNorm2d))


@pytest.mark.parametrize("family", list(PUBLISHED_POSE))
def test_pose_counts_agree_with_the_published_figures(family: str) -> None:
    for scale, published in zip("nsmlx", PUBLISHED_POSE[family]):
        layers = built_on_meta(f"{family}{scale}-pose", nc=1)
        count = deployed_parameters(layers) if family == "yolo26" else params(layers)
        tolerance = 0.1 if family == "yolov8" else 0.05
        assert abs(count / 1e6 - published) <= tolerance + 1e-9, (family, scale, count)


def test_the_fixture_counts_at_one_class() -> None:
    """ultralytics' own files (one class, tests/fixtures/ultralytics/README.md)."""
    assert params(built_on_meta("yolo11n-pose", nc=1)) == 2_874_462
    assert params(built_on_meta("yolo26n-pose", nc=1)) == 3_679_464


def test_keypoint_decode_by_hand() -> None:
    """Cell (x 1, y 2) of a stride-8 level (centre 1.5, 2.5): YOLOv8/YOLO11 put x at (2 * raw + centre - 0.5) * 8,
    YOLO26 at (raw + centre) * 8; visibility is the sigmoid of its raw value."""
    raw = torch.tensor([0.25, -0.5, 0.0, 1.0, 1.0, math.log(3.0)]).view(1, 6, 1)  # two keypoints (x, y, v)
    points, strides = torch.tensor([[1.5, 2.5]]), torch.tensor([[8.0]])
    v8 = decode_keypoints(raw, points, strides, (2, 3), 2.0, -0.5).flatten().tolist()
    assert v8 == pytest.approx([12.0, 8.0, 0.5, 24.0, 32.0, 0.75])
    v26 = decode_keypoints(raw, points, strides, (2, 3), 1.0, 0.0).flatten().tolist()
    assert v26 == pytest.approx([14.0, 16.0, 0.5, 20.0, 28.0, 0.75])
    xy_only = decode_keypoints(raw[:, :4], points, strides, (2, 2), 1.0, 0.0).flatten().tolist()
    assert xy_only == pytest.approx([14.0, 16.0, 1.0, 12.0, 28.0, 1.0])  # no visibility: each reported visible


def tiny(name: str, kpt_shape: list[int] | None = None, flip_idx: list[int] | None = None) -> Model:
    cfg, _ = load_model_config(f"{name}.yaml")
    cfg.update(nc=2, scales={"n": [0.33, 0.25, 1024]}, scale="n")
    if kpt_shape is not None:
        cfg["kpt_shape"] = kpt_shape
    if flip_idx is not None:
        cfg["flip_idx"] = flip_idx
    return Model(cfg)


@pytest.mark.parametrize("name", ["yolov8-pose", "yolo11-pose"])
def test_anchor_free_pose_modes_contract_and_metadata(name: str) -> None:
    model = tiny(name, [5, 3])
    head = model.head
    assert isinstance(head, AnchorFreePoseHead) and (head.task, head.nk, head.kpt_shape) == ("pose", 15, [5, 3])
    assert list(dict(head.named_children())) == ["cv2", "cv3", "dfl", "cv4"]  # ultralytics' order (release files)
    out = model(torch.rand(2, 3, 64, 96))
    n = 8 * 12 + 4 * 6 + 2 * 3
    assert out["keypoints"].shape == (2, 15, n) and out["scores"].shape == (2, 2, n)
    model.eval()
    with torch.no_grad():
        rows = model(torch.rand(2, 3, 64, 96))
    assert rows.shape == (2, n, 4 + 2 + 15)
    visibility = rows[..., 6:].view(2, n, 5, 3)[..., 2]
    assert ((visibility > 0) & (visibility < 1)).all()
    assert head.contract == OutputContract("xywh_cls", 2, 15, "pose") and head.contract.columns == 21
    kept = postprocess(rows, head.contract, conf_thres=0.0, max_det=7)
    assert 1 <= len(kept[0]) <= 7 and kept[0].shape[1] == 6 + 15  # the keypoints ride through NMS with their box
    best = rows[0, rows[0, :, 4:6].amax(1).argmax()]
    assert torch.equal(kept[0][0, 6:], best[6:])
    meta = head.export_metadata()
    assert meta["task"] == "pose" and meta["kpt_shape"] == [5, 3] and meta["contract"]["extra"] == 15
    assert meta["flip_idx"] is None and tiny(name, [5, 3], [0, 2, 1, 4, 3]).head.flip_idx == [0, 2, 1, 4, 3]


def test_yolo26_pose_modes_and_final_rows_carry_their_keypoints() -> None:
    model = tiny("yolo26-pose", [4, 2])
    head = model.head
    assert isinstance(head, EndToEndPoseHead) and head.nk == 8
    assert list(dict(head.named_children())) == [
        "cv2", "cv3", "dfl", "one2one_cv2", "one2one_cv3", "cv4", "one2one_cv4", "flow_model", "cv4_kpts",
        "cv4_sigma", "one2one_cv4_kpts", "one2one_cv4_sigma"]
    out = model(torch.rand(1, 3, 64, 64))
    n = 64 + 16 + 4
    for branch in ("one2many", "one2one"):
        assert out[branch]["keypoints"].shape == (1, 8, n) and out[branch]["keypoint_sigmas"].shape == (1, 8, n)
    one2one_features = [p for p in head.one2one_cv4.parameters()]
    out["one2one"]["keypoints"].sum().backward()  # the one-to-one branches train on detached features
    assert all(p.grad is not None for p in one2one_features)
    assert all(p.grad is None for p in model.model[0].parameters())
    model.eval()
    images = torch.rand(2, 3, 64, 64)
    captured = {}
    hook = head.register_forward_pre_hook(lambda module, inputs: captured.setdefault("xs", inputs[0]))
    with torch.no_grad():
        final = model(images)
        hook.remove()
        decoded = head.decode_one2one(captured["xs"])  # (b, n, 4 + nc + 8), xyxy
    assert final.shape == (2, n, 6 + 12) and head.contract == OutputContract("xyxy_score_cls", 2, 12, "pose")
    assert (final[..., 6:].view(2, n, 4, 3)[..., 2] == 1).all()  # keypoints of (x, y) alone: visible
    for image in range(2):
        for row in final[image]:
            cell = int((decoded[image, :, :4] - row[:4]).abs().sum(1).argmin())
            assert torch.equal(decoded[image, cell, 4 + int(row[5])], row[4])
            assert torch.equal(decoded[image, cell, 6:], row[6:])  # the keypoints of the row's own cell


def test_pose_bad_rows_are_refused_in_one_line() -> None:
    cfg, _ = load_model_config("yolo11-pose.yaml")
    for value, expected in (([17, 4], "kpt_shape must be [keypoints, 2 or 3]"), ([0, 3], "kpt_shape must be"),
                            ("17x3", "kpt_shape must be"), ([400, 3], "with 1..341 keypoints")):
        bad = dict(cfg, kpt_shape=value, scale="n")
        with pytest.raises(ModelConfigError, match=re.escape(expected)) as info:
            Model(bad)
        assert "\n" not in str(info.value)
    missing = dict(cfg, scale="n")
    del missing["kpt_shape"]
    with pytest.raises(ModelConfigError, match="missing key 'kpt_shape'"):
        Model(missing)
    with pytest.raises(ModelConfigError, match=re.escape("flip_idx must pair the 17 keypoints")):
        Model(dict(cfg, scale="n", flip_idx=[1, 0] + list(range(2, 16)) + [0]))
    not_end_to_end, _ = load_model_config("yolo26n-pose.yaml")
    not_end_to_end["end2end"] = False
    with pytest.raises(ModelConfigError, match="Pose26 is the end-to-end head"):
        Model(not_end_to_end)


def test_flow_density_is_a_normal_density_when_the_flow_is_the_identity() -> None:
    flow = RealNVP()
    for module in flow.modules():
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)
    points = torch.randn(16, 2) * 3
    normal = torch.distributions.MultivariateNormal(torch.zeros(2), torch.eye(2))
    assert torch.allclose(flow.log_prob(points), normal.log_prob(points), atol=1e-5)


def test_flow_density_is_the_change_of_variables() -> None:
    """log p(x) = log N(z(x)) + log |det dz/dx| for a flow with weights far from the identity: the log-determinant
    the couplings sum equals the Jacobian's, found by autograd."""
    torch.manual_seed(3)
    flow = RealNVP()
    for module in flow.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.5)
    assert [len(flow.s), len(flow.t), params(flow)] == [6, 6, 53_784]
    normal = torch.distributions.MultivariateNormal(torch.zeros(2, dtype=torch.float64), torch.eye(2).double())
    exact = RealNVP().double()
    exact.load_state_dict(flow.state_dict())
    for point in torch.randn(5, 2, dtype=torch.float64):
        jacobian = torch.autograd.functional.jacobian(lambda x: exact.inverse(x.view(1, 2))[0].view(2), point)
        z, log_det = exact.inverse(point.view(1, 2))
        assert log_det.item() == pytest.approx(torch.logdet(jacobian).item(), abs=1e-9)
        assert flow.log_prob(point.view(1, 2)).item() == pytest.approx(  # float32 arithmetic
            (normal.log_prob(z) + torch.logdet(jacobian)).item(), abs=1e-3)


# ------------------------------------------------------------------------------------------ docs/models.md
DOCS = Path(__file__).resolve().parents[4] / "docs" / "models.md"
DOC_SIZES = {name: (int(params.replace(",", "")), float(gflops)) for name, params, gflops in re.findall(
    r"\| (yolo\w+-pose) \| ([\d,]+) \| ([\d.]+) ", DOCS.read_text())}


def test_the_docs_table_lists_every_pose_model_with_its_size_at_one_class() -> None:
    assert sorted(DOC_SIZES) == sorted(NAMES)
    for name, (params_in_docs, _) in DOC_SIZES.items():
        assert params_in_docs == params(built_on_meta(name, nc=1)), name


@pytest.mark.parametrize("name", ["yolo11n-pose", "yolo26n-pose"])
def test_the_docs_gflops_are_what_the_builder_counts(name: str) -> None:
    torch.manual_seed(0)
    assert Model(f"{name}.yaml", nc=1).flops(640) == pytest.approx(DOC_SIZES[name][1], abs=0.05)
