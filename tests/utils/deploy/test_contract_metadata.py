"""Exported files carry the head's export metadata (its output contract first); the runtime builds the contract from
it, a file from before contracts is read as YOLOv5's, and each format's check compares outputs as the contract lays
them out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from utils.deploy.formats import export_metadata
from utils.deploy.runtime import InferenceModel
from utils.deploy.verify import VerificationError, output_errors
from utils.errors import UserError
from utils.tasks.contract import OutputContract


def reshaping_onnx(path: Path, meta: dict) -> Path:
    """An ONNX file whose output is its (1, 3, 64, 64) input reshaped to (1, 1536, 8), with ``meta``."""
    from onnx import TensorProto, helper

    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1536, 8])
    graph = helper.make_graph([helper.make_node("Reshape", ["images", "shape"], ["output0"])], "rows",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 1536, 8])],
                              initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    onnx.save(model, str(path))
    return path


BASE = {"stride": 32, "img_size": [64, 64], "batch_size": 1, "dynamic": False}


def test_the_runtime_reads_the_recorded_contract_and_old_files_are_yolov5(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    old = InferenceModel(reshaping_onnx(tmp_path / "old.onnx", {**BASE, "names": ["a", "b", "c"]}))
    assert old.contract == OutputContract("xywh_obj_cls", 3)  # no contract recorded: a YOLOv5 detector
    head = {"contract": OutputContract("xywh_cls", 4).metadata(), "stride": [8.0, 16.0, 32.0]}
    new = InferenceModel(reshaping_onnx(tmp_path / "new.onnx", {**BASE, "names": list("abcd"), "head": head}))
    assert new.contract == OutputContract("xywh_cls", 4) and new.as_module().contract == new.contract
    images = torch.rand(1, 3, 64, 64)
    assert torch.equal(new(images), images.reshape(1, 1536, 8))


@pytest.mark.parametrize("head, message", [
    ({"contract": {"layout": "xywh_mystery", "nc": 4}}, "output layout 'xywh_mystery' is not one of"),
    ({"contract": {"layout": "xywh_cls", "nc": 3}}, "its output contract has 3 classes but it names 4"),
    ({"contract": "xywh_cls"}, "metadata 'head' .* must be a mapping of the head's fields"),
])
def test_a_contract_that_cannot_be_honoured_is_refused_in_one_line(tmp_path: Path, head: dict, message: str) -> None:
    pytest.importorskip("onnxruntime")
    file = reshaping_onnx(tmp_path / "bad.onnx", {**BASE, "names": list("abcd"), "head": head})
    with pytest.raises(UserError, match=message):  # the metadata check's FormatError or the runtime's error
        InferenceModel(file)


def test_export_metadata_records_the_heads_own(tiny_cfg: dict) -> None:
    from models.yolo import Model

    model = Model(tiny_cfg).eval()
    meta = export_metadata(model, (64, 64), 1, dynamic=False)
    assert meta["head"] == model.head.export_metadata() and meta["head"]["contract"]["layout"] == "xywh_obj_cls"
    assert meta["num_anchors"] == 3 and meta["strides"] == [8.0, 16.0, 32.0]
    assert json.loads(json.dumps(meta)) == meta  # plain values: every format stores it as JSON or YAML


def test_output_errors_read_the_rows_as_the_contract_lays_them_out() -> None:
    contract = OutputContract("xywh_cls", 2, 2, "segment")  # 4 box, 2 class, 2 mask-coefficient columns
    a = torch.zeros(1, 3, 8)
    b = a.clone()
    b[0, 0, 5], b[0, 1, 1], b[0, 2, 7] = 0.125, 2.0, 50.0  # a class score, a box, a coefficient (not compared)
    assert output_errors(a, b, contract) == (2.0, 0.125)
    assert output_errors(a, b) == (2.0, 50.0)  # read as YOLOv5's rows every column after the box is a score


def test_end_to_end_rows_are_compared_pairwise_whatever_their_order() -> None:
    contract = OutputContract("xyxy_score_cls", 3)
    reference = torch.tensor([[[10.0, 10, 20, 20, 0.9, 1], [30, 30, 40, 40, 0.5001, 2], [50, 50, 60, 60, 0.5, 0],
                               [70, 70, 80, 80, 0.1, 0]]])
    swapped = reference[:, [0, 2, 1, 3]].clone()  # two rows of near-equal scores came out the other way round
    swapped[0, 2, 4] += 1e-4
    swapped[0, 0, 0] += 0.01
    box, score = output_errors(reference, swapped, contract)
    assert box == pytest.approx(0.01, rel=1e-4) and score == pytest.approx(1e-4, rel=1e-2)
    other_class = swapped.clone()
    other_class[0, 0, 5] = 0
    with pytest.raises(VerificationError, match="another class"):
        output_errors(reference, other_class, contract)
    assert np.isfinite(output_errors(torch.zeros(1, 0, 6), torch.zeros(1, 0, 6), contract)).all()


def test_a_candidate_that_ties_the_cut_off_may_differ() -> None:
    """The last kept row of an end-to-end output (the lowest score) ties with candidates left out: another runtime
    may keep another one. Rows within the margin of the lowest score are not compared; the others are."""
    contract = OutputContract("xyxy_score_cls", 3)
    reference = torch.tensor([[[10.0, 10, 20, 20, 0.9, 1], [30, 30, 40, 40, 0.004151, 2]]])
    other_tie = reference.clone()
    other_tie[0, 1, :4] = torch.tensor([50.0, 50, 60, 60])  # a different candidate of the same score
    assert output_errors(reference, other_tie, contract) == (0.0, 0.0)
    assert output_errors(reference, other_tie, contract, margin=-1.0)[0] == 20.0  # every row compared: it differs
    moved = reference.clone()
    moved[0, 0, 2] += 3.0  # a row well inside the top k is always compared
    assert output_errors(reference, moved, contract)[0] == pytest.approx(3.0)


class AnchorFreeHead(torch.nn.Module):
    """A stand-in anchor-free head with the head interface (what the new families' heads offer): one 1x1
    convolution per level to 4 + nc channels; eval mode returns (b, cells, 4 + nc) rows in the ``xywh_cls`` layout
    (centre from the cell and a sigmoid offset, size from a sigmoid times 8 strides, sigmoid class scores)."""

    family, task, anchor_based = "yolov8", "detect", False

    def __init__(self, detect: torch.nn.Module) -> None:
        super().__init__()
        self.nc, self.nl = detect.nc, detect.nl
        self.m = torch.nn.ModuleList(torch.nn.Conv2d(conv.in_channels, 4 + self.nc, 1) for conv in detect.m)
        self.register_buffer("stride", detect.stride.clone())
        self.i, self.f, self.type = detect.i, detect.f, "tests.AnchorFreeHead"

    @property
    def contract(self) -> OutputContract:
        return OutputContract("xywh_cls", self.nc)

    def export_metadata(self) -> dict:
        return {"contract": self.contract.metadata(), "stride": [float(s) for s in self.stride]}

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        maps = [conv(x) for conv, x in zip(self.m, xs)]
        if self.training:
            return maps
        rows = []
        for stride, x in zip(self.stride, maps):
            b, _, ny, nx = x.shape
            ys, xs_ = torch.meshgrid(torch.arange(ny, dtype=x.dtype), torch.arange(nx, dtype=x.dtype), indexing="ij")
            y = x.sigmoid()
            cx, cy = (xs_ + y[:, 0]) * stride, (ys + y[:, 1]) * stride
            wh = y[:, 2:4] * 8 * stride
            rows.append(torch.cat((cx[:, None], cy[:, None], wh, y[:, 4:]), 1).flatten(2).transpose(1, 2))
        return torch.cat(rows, 1)


@pytest.mark.parametrize("name", ["onnx", "torchscript", "ncnn"])
def test_an_anchor_free_heads_export_records_its_contract_and_verifies_by_it(tiny_cfg: dict, tmp_path: Path,
                                                                           name: str) -> None:
    """Exported through the same formats, an anchor-free head's file records ``xywh_cls``, the runtime
    post-processes it so, and the float check compares it so (NCNN keeps the decoding in its graph: no anchors)."""
    from models.yolo import Model
    from utils.deploy.formats import FLOAT_TOLERANCE, ExportOptions, get_format
    from utils.deploy.verify import verify_float
    from utils.tasks.contract import postprocess

    fmt = get_format(name)
    missing = [pip for module, pip in (*fmt.export_packages, *fmt.runtime_packages)
               if __import__("importlib").util.find_spec(module) is None]
    if missing:
        pytest.skip(f"needs {missing}")
    torch.manual_seed(0)
    model = Model(tiny_cfg)
    model.model[-1] = head = AnchorFreeHead(model.model[-1])
    with torch.no_grad():  # class scores spread over (0, 1): no near-ties for NMS to break differently
        for conv in head.m:
            conv.weight[4:] *= 20
    model.names = ["a", "b", "c"]
    model = model.fuse().eval()
    images = torch.rand(1, 3, 64, 64)
    meta = export_metadata(model, (64, 64), 1, dynamic=False)
    assert meta["head"]["contract"] == {"layout": "xywh_cls", "nc": 3, "extra": 0, "task": "detect"}
    assert meta["num_anchors"] == 1
    file = fmt.export(model, images, fmt.output_path(tmp_path / "af.pt"), meta, ExportOptions(img_size=(64, 64)))
    check = verify_float(file, model, [images], FLOAT_TOLERANCE, torch.device("cpu"))
    assert check.box_error <= FLOAT_TOLERANCE.box and check.score_error <= FLOAT_TOLERANCE.score
    inference = InferenceModel(file, trusted=True)
    assert inference.contract == OutputContract("xywh_cls", 3)
    with torch.no_grad():
        expected = postprocess(model(images), model.head.contract, 0.3, 0.5)[0]
    found = postprocess(inference(images).float(), inference.contract, 0.3, 0.5)[0]
    assert len(expected) > 0 and found.shape == expected.shape
    torch.testing.assert_close(found[:, :4], expected[:, :4], atol=0.05, rtol=0)


def test_an_int8_tflites_maps_are_decoded_by_the_anchors_or_by_the_heads_own_metadata() -> None:
    from utils.deploy.formats import FormatError
    from utils.deploy.head_maps import RawMapDecoder
    from utils.deploy.tflite import maps_decoder

    anchors = [[[10.0, 13.0]], [[30.0, 61.0]]]
    yolov5 = maps_decoder({"names": ["a"], "anchors": anchors, "strides": [8.0, 16.0]}, Path("a.tflite"))
    maps = [torch.zeros(1, 4, 4, 6), torch.zeros(1, 2, 2, 6)]  # NHWC, one anchor of 5 + 1 channels per cell
    rows = yolov5(maps)
    assert rows.shape == (1, 20, 6) and torch.allclose(rows[0, 0], torch.tensor([4.0, 4.0, 10.0, 13.0, 0.5, 0.5]))
    head = {"contract": {"layout": "xywh_cls", "nc": 2, "nm": 0}, "stride": [8.0, 16.0], "reg_max": 16}
    assert isinstance(maps_decoder({"names": ["a", "b"], "head": head}, Path("b.tflite")), RawMapDecoder)
    with pytest.raises(FormatError, match="carries neither anchors nor its head's metadata"):
        maps_decoder({"names": ["a"]}, Path("c.tflite"))
