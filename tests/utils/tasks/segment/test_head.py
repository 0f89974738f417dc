"""utils/tasks/segment/head.py:
Proto and the Segment heads, checked against the reference's facts (parameter counts, state
dict names and shapes) and, for YOLOv5, against the v7.0 release fixture's outputs and prototypes."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from models.yolo import Model
from tests.helpers import built_on_meta
from utils.tasks.contract import OutputContract, postprocess
from utils.tasks.segment.head import AnchorFreeSegment, Proto, Segment, coefficient_convs
from utils.weights.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from utils.weights.release_reader import RELEASE_SOURCE, flat_state, read_records

pytestmark = pytest.mark.usefixtures("one_torch_thread")
N_CHANNELS = (64, 128, 256)  # P3, P4, P5 widths of the n models (yolov5n, yolov8n, yolo11n)
TOLERANCE = 1e-4
FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"


def params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def yolov5n_seg() -> Model:
    return Model("yolov5n-seg.yaml")


# Parameters with nc=80 (the n counts are the references' releases; s..x what the YAMLs build, docs/models.md).
PARAMETERS = {
    "yolov5": (1_991_549, 7_621_277, 21_990_397, 47_924_957, 88_819_517),
    "yolov8": (3_409_968, 11_821_056, 27_285_968, 45_997_728, 71_827_888),
    "yolo11": (2_876_848, 10_113_248, 22_420_896, 27_678_368, 62_142_656),
    "yolo26": (3_126_280, 11_505_800, 27_112_072, 31_515_528, 70_693_800),  # n: ultralytics' (fixtures README)
}
PROTOTYPE_WIDTHS = {"yolov5": (64, 128, 192, 256, 320), "yolov8": (64, 128, 192, 256, 320),
                    "yolo11": (64, 128, 256, 256, 384), "yolo26": (64, 128, 256, 256, 384)}  # 256 x width multiple
NAMES = [f"{family}{scale}-seg" for family in PARAMETERS for scale in "nsmlx"]


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_of_every_segmenter(name: str) -> None:
    layers = built_on_meta(name)
    expected = PARAMETERS[name[:-5]]["nsmlx".index(name[-5])]
    assert sum(p.numel() for p in layers.parameters()) == expected
    assert layers[-1].task == "segment" and layers[-1].family == name[:-5]
    assert layers[-1].nm == 32 and layers[-1].npr == PROTOTYPE_WIDTHS[name[:-5]]["nsmlx".index(name[-5])]


def test_proto_shapes_and_sizes() -> None:
    x = torch.rand(2, 64, 6, 5)
    for upsample, size in (("nearest", 76_096), ("transpose", 92_544)):
        proto = Proto(64, 64, 32, upsample)
        assert params(proto) == size
        assert proto(x).shape == (2, 32, 12, 10)
        assert list(dict(proto.named_children())) == ["cv1", "upsample", "cv2", "cv3"]
    with pytest.raises(ValueError, match="upsample"):
        Proto(8, 8, 4, "bilinear")


def test_yolov5n_seg_release_file_loads_and_matches_its_outputs(tmp_path: Path) -> None:
    """The v7.0 yolov5n-seg release file goes through the restricted reader (no pickled code runs) into our
    yolov5n-seg, every tensor by name; the outputs (boxes, scores, the 32 coefficients) and the prototypes equal the
    reference's on its input, fused or not; the checkpoint records the task and rebuilds after a save."""
    ckpt = load_checkpoint(FIXTURES / "yolov5n-seg-v7.0.pt")
    assert (ckpt["family"], ckpt["task"], ckpt["source"]) == ("yolov5", "segment", RELEASE_SOURCE)
    assert ckpt["release"]["model_class"] == "models.yolo.SegmentationModel"
    model = model_from_checkpoint(ckpt).eval()
    assert isinstance(model.head, Segment) and params(model) == 1_991_549
    data = np.load(FIXTURES / "yolov5n-seg-v7.0.npz")
    expected, expected_protos = torch.from_numpy(data["output"]), torch.from_numpy(data["protos"])
    fused = copy.deepcopy(model).fuse()
    for candidate in (model, fused):
        with torch.no_grad():
            decoded, protos = candidate(torch.from_numpy(data["input"]))
        assert decoded.shape == expected.shape == (2, 2268, 117) and protos.shape == expected_protos.shape
        diff = (decoded - expected).abs()
        assert diff[..., 4:85].max() < TOLERANCE  # objectness and class scores in [0, 1]
        assert (diff[..., :4] <= TOLERANCE + 1e-6 * expected[..., :4].abs()).all()  # boxes in pixels
        assert (diff[..., 85:] <= TOLERANCE * (1 + expected[..., 85:].abs())).all()  # coefficients: raw
        assert ((protos - expected_protos).abs() <= TOLERANCE * (1 + expected_protos.abs())).all()
    again = load_checkpoint(save_checkpoint(ckpt, tmp_path / "yolov5n-seg.pt"))  # ours: weights_only
    assert again["task"] == "segment" and model_from_checkpoint(again).head.task == "segment"


def test_yolov5_segment_modes_contract_and_metadata() -> None:
    model = yolov5n_seg()
    head = model.head
    assert (head.task, head.family, head.anchor_based) == ("segment", "yolov5", True)
    assert head.contract == OutputContract("xywh_obj_cls", 80, 32, "segment") and head.contract.columns == 117
    maps, protos = model(torch.rand(1, 3, 64, 96))
    assert [tuple(m.shape) for m in maps] == [(1, 3, 8, 12, 117), (1, 3, 4, 6, 117), (1, 3, 2, 3, 117)]
    assert protos.shape == (1, 32, 16, 24)
    model.eval()
    with torch.no_grad():
        decoded, protos = model(torch.rand(2, 3, 64, 96))
    assert decoded.shape == (2, 3 * (96 + 24 + 6), 117) and protos.shape == (2, 32, 16, 24)
    assert ((decoded[..., 4:85] >= 0) & (decoded[..., 4:85] <= 1)).all()
    assert (decoded[..., 85:] < 0).any()  # coefficients are not squashed
    rows = postprocess(decoded, head.contract, conf_thres=0.0, max_det=10)
    assert rows[0].shape[1] == 6 + 32
    meta = head.export_metadata()
    assert meta["nm"] == 32 and meta["proto_stride"] == 4.0 and meta["contract"]["extra"] == 32
    assert meta["task"] == "segment" and len(meta["anchors"]) == 3


def test_yolov5_segment_bias_priors_leave_the_coefficients() -> None:
    head = Segment(3, [[10, 13, 16, 30, 33, 23]], 4, 8, (16,))
    head.stride.fill_(8.0)
    before = head.m[0].bias.detach().clone().view(3, -1)
    head.init_biases()
    after = head.m[0].bias.detach().view(3, -1)
    assert torch.equal(after[:, 8:], before[:, 8:])  # 5 + nc = 8: the 4 coefficient biases are unchanged
    assert (after[:, 4] - before[:, 4]).allclose(torch.tensor(np.log(8 / (640 / 8) ** 2), dtype=torch.float32))


class PlainAnchorFreeDetect(nn.Module):
    """A stand-in for the families branch's anchor-free Detect (built in parallel): what AnchorFreeSegment needs
    of its base, with the reference's box/class branch widths, and a decode that only lays rows out (boxes are
    the families' tests' business): one row per anchor point, level by level, row-major."""

    family, task, anchor_based = "yolov8", "detect", False

    def __init__(self, nc: int = 80, ch: tuple[int, ...] = (), reg_max: int = 16) -> None:
        super().__init__()
        self.nc, self.nl, self.reg_max = nc, len(ch), reg_max
        self.register_buffer("stride", torch.tensor([8.0, 16.0, 32.0][:len(ch)]))
        self.cv2 = nn.ModuleList(nn.Conv2d(c, 4 * reg_max, 1) for c in ch)
        self.cv3 = nn.ModuleList(nn.Conv2d(c, nc, 1) for c in ch)

    @property
    def contract(self) -> OutputContract:
        return OutputContract("xywh_cls", self.nc)

    def export_metadata(self) -> dict:
        return {"contract": self.contract.metadata(), "stride": self.stride.tolist()}

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor] | torch.Tensor:
        for i in range(self.nl):  # like the reference, writes into its input list
            xs[i] = torch.cat((self.cv2[i](xs[i]), self.cv3[i](xs[i])), 1)
        if self.training:
            return xs
        rows = torch.cat([x.flatten(2) for x in xs], 2).transpose(1, 2)  # (b, n, 4 * reg_max + nc)
        return torch.cat((rows[..., :4], rows[..., 4 * self.reg_max:].sigmoid()), 2)


class PlainSegment(AnchorFreeSegment, PlainAnchorFreeDetect):
    pass


def test_anchor_free_mask_parts_have_the_reference_sizes_and_names() -> None:
    """Proto (learned upsample) + cv4 of the n models: 252,768 parameters, which is yolov8n-seg 3,409,968 less
    yolov8n 3,157,200 and yolo11n-seg 2,876,848 less yolo11n 2,624,080; every tensor of yolo11n-seg's proto and
    cv4 loads by name and shape into ours."""
    head = PlainSegment(80, 32, 64, N_CHANNELS)
    assert params(head.proto) + params(head.cv4) == 252_768 == 3_409_968 - 3_157_200 == 2_876_848 - 2_624_080
    assert list(dict(head.named_children()))[-2:] == ["proto", "cv4"]  # after the base's, as the reference
    state = flat_state(read_records(FIXTURES / "ultralytics" / "yolo11n-seg.pt")["model"])
    for part in ("proto", "cv4"):
        prefix = f"model.23.{part}."
        theirs = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        module = getattr(head, part)
        assert set(theirs) == set(module.state_dict())
        module.load_state_dict(theirs)  # strict: names and shapes
    assert coefficient_convs((16, 32), 32)[0][0].conv.out_channels == 32  # max(16 // 4, 32)
    assert coefficient_convs((256, 512), 32)[0][0].conv.out_channels == 64  # max(256 // 4, 32)


def test_anchor_free_segment_outputs_line_up_with_the_base_rows() -> None:
    head = PlainSegment(3, 4, 8, (8, 16, 32))
    assert head.task == "segment" and head.family == "yolov8" and not head.anchor_based
    assert head.contract == OutputContract("xywh_cls", 3, 4, "segment") and head.contract.columns == 11
    assert head.export_metadata()["nm"] == 4 and head.export_metadata()["proto_stride"] == 4.0
    xs = [torch.rand(2, 8, 8, 10), torch.rand(2, 16, 4, 5), torch.rand(2, 32, 2, 3)]
    out, coefficients, protos = head(list(xs))
    assert len(out) == 3 and coefficients.shape == (2, 4, 80 + 20 + 6) and protos.shape == (2, 4, 16, 20)
    head.eval()
    with torch.no_grad():
        rows, protos_eval = head(list(xs))
        base_rows = PlainAnchorFreeDetect.forward(head, list(xs))
        expected = head.cv4[1](xs[1])[1, :, 2, 3]  # level 1, image 1, row 2, column 3
    assert rows.shape == (2, 106, 11) and torch.equal(rows[..., :7], base_rows)
    assert torch.allclose(rows[1, 80 + 2 * 5 + 3, 7:], expected)
    assert torch.allclose(protos_eval, head.proto(xs[0]))
    contract_rows = postprocess(rows, head.contract, conf_thres=0.0, max_det=5)
    assert contract_rows[0].shape == (5, 6 + 4)


# ------------------------------------------------------------------------------------------ docs/models.md
DOC_SIZES = {name: (int(params.replace(",", "")), float(gflops)) for name, params, gflops in re.findall(
    r"\| (yolo\w+-seg) \| ([\d,]+) \| ([\d.]+) ", (FIXTURES.parents[1] / "docs" / "models.md").read_text())}


def test_the_docs_table_lists_every_segmenter_with_its_sizes() -> None:
    assert sorted(DOC_SIZES) == sorted(NAMES)
    for name, (params_in_docs, _) in DOC_SIZES.items():
        assert params_in_docs == PARAMETERS[name[:-5]]["nsmlx".index(name[-5])]


@pytest.mark.parametrize("name", ["yolov5n-seg", "yolo11n-seg", "yolo26n-seg"])
def test_the_docs_gflops_are_what_the_builder_counts(name: str) -> None:
    torch.manual_seed(0)
    assert Model(f"{name}.yaml").flops(640) == pytest.approx(DOC_SIZES[name][1], abs=0.05)
