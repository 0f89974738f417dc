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
from utils.deploy.runtime import InferenceModel, InferenceModelError
from utils.deploy.verify import VerificationError, output_errors
from utils.predictions import OutputContract


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
    ({"contract": "xywh_cls"}, "output contract must be a mapping"),
])
def test_a_contract_that_cannot_be_honoured_is_refused_in_one_line(tmp_path: Path, head: dict, message: str) -> None:
    pytest.importorskip("onnxruntime")
    file = reshaping_onnx(tmp_path / "bad.onnx", {**BASE, "names": list("abcd"), "head": head})
    with pytest.raises(InferenceModelError, match=message):
        InferenceModel(file)


def test_export_metadata_records_the_heads_own(tiny_cfg: dict) -> None:
    from models.yolo import Model

    model = Model(tiny_cfg).eval()
    meta = export_metadata(model, (64, 64), 1, dynamic=False)
    assert meta["head"] == model.head.export_metadata() and meta["head"]["contract"]["layout"] == "xywh_obj_cls"
    assert meta["num_anchors"] == 3 and meta["strides"] == [8.0, 16.0, 32.0]
    assert json.loads(json.dumps(meta)) == meta  # plain values: every format stores it as JSON or YAML


def test_output_errors_read_the_rows_as_the_contract_lays_them_out() -> None:
    contract = OutputContract("xywh_cls", 2, nm=2)  # 4 box, 2 class, 2 mask-coefficient columns
    a = torch.zeros(1, 3, 8)
    b = a.clone()
    b[0, 0, 5], b[0, 1, 1], b[0, 2, 7] = 0.125, 2.0, 50.0  # a class score, a box, a coefficient (not compared)
    assert output_errors(a, b, contract) == (2.0, 0.125)
    assert output_errors(a, b) == (2.0, 50.0)  # read as YOLOv5's rows every column after the box is a score


def test_end_to_end_rows_are_compared_pairwise_whatever_their_order() -> None:
    contract = OutputContract("xyxy_score_cls", 3)
    reference = torch.tensor([[[10.0, 10, 20, 20, 0.9, 1], [30, 30, 40, 40, 0.5001, 2], [50, 50, 60, 60, 0.5, 0]]])
    swapped = reference[:, [0, 2, 1]].clone()  # two rows of near-equal scores came out the other way round
    swapped[0, 2, 4] += 1e-4
    swapped[0, 0, 0] += 0.01
    box, score = output_errors(reference, swapped, contract)
    assert box == pytest.approx(0.01, rel=1e-4) and score == pytest.approx(1e-4, rel=1e-2)
    other_class = swapped.clone()
    other_class[0, 0, 5] = 0
    with pytest.raises(VerificationError, match="another class"):
        output_errors(reference, other_class, contract)
    assert np.isfinite(output_errors(torch.zeros(1, 0, 6), torch.zeros(1, 0, 6), contract)).all()
