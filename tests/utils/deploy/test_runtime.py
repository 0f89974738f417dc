"""InferenceModel: one runner for .pt and every registered export; files it cannot trust are refused."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch

from utils.deploy.runtime import InferenceModel, InferenceModelError, check_img_size, weights_format
from utils.errors import UserError


def test_foreign_or_damaged_exports_are_refused(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["output0"])], "foreign",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 3, 64, 64])])
    foreign = tmp_path / "foreign.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(foreign))
    with pytest.raises(UserError, match="no stride/class-name metadata; re-export"):
        InferenceModel(foreign)
    damaged = tmp_path / "damaged.torchscript"
    damaged.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(UserError, match="not a readable TorchScript file"):
        InferenceModel(damaged, trusted=True)


def test_weights_format_and_image_size_rounding(tmp_path: Path) -> None:
    names = [weights_format(Path(p)).name for p in ("a.pt", "b.torchscript", "c.onnx", "d.xml", "e_openvino_model")]
    assert names == ["pytorch", "torchscript", "onnx", "openvino", "openvino"]
    with pytest.raises(InferenceModelError, match=r"unknown format '.bin' \(use one of .pt, .torchscript, .onnx"):
        weights_format(Path("d.bin"))
    assert check_img_size([70], 32) == (96, 96) and check_img_size([64, 100], 32) == (64, 128)
    with pytest.raises(InferenceModelError, match="give one positive size or two"):
        check_img_size([1, 2, 3], 32)


def test_a_pt_backend_runs_the_checkpoint(tiny_weights: Path) -> None:
    backend = InferenceModel(tiny_weights)
    out = backend(torch.zeros(2, 3, 64, 64))
    assert out.shape == (2, 3 * (64 + 16 + 4), 8) and backend.stride == 32 and len(backend.names) == 3
    assert backend.kind == "pytorch" and backend.as_module() is backend.module and backend.dynamic
