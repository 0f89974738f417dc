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


def _onnx_with(tmp_path: Path, meta: dict[str, str], out_shape: list[int] | None = None, name: str = "m") -> Path:
    """An ONNX file passing its input through (or reshaping it to ``out_shape``), with raw metadata strings."""
    from onnx import TensorProto, helper

    nodes, inits = [helper.make_node("Identity", ["images"], ["output0"])], []
    if out_shape is not None:
        inits = [helper.make_tensor("shape", TensorProto.INT64, [len(out_shape)], out_shape)]
        nodes = [helper.make_node("Reshape", ["images", "shape"], ["output0"])]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


GOOD_META = {"stride": "32", "names": '["a", "b", "c"]', "img_size": "[8, 8]", "batch_size": "1", "dynamic": "false",
             "strides": "[8.0, 16.0, 32.0]", "num_anchors": "3"}
BAD_META = [
    ("stride", "0"), ("stride", "-32"), ("stride", "NaN"), ("stride", "1e999"), ("stride", "1" + "0" * 30),
    ("stride", '"32"'), ("stride", "true"), ("stride", "33.5"), ("names", "[]"), ("names", '{"x": "a"}'),
    ("names", '[["a"]]'), ("names", '["a\\nb"]'), ("names", "[" + ", ".join(['"a"'] * 20_001) + "]"),
    ("names", '{"0": "a", "5": "b"}'), ("img_size", "[8]"), ("img_size", "[1e9, 1e9]"),
    ("batch_size", "0"), ("batch_size", "1000000000"), ("strides", "[0]"), ("strides", '[8, "x"]'),
    ("strides", "[" + ", ".join(["8"] * 100) + "]"), ("num_anchors", "0"), ("num_anchors", "100000"),
    ("dynamic", '"yes"'), ("names", '{"0": "a", "1": ["b"]}'), ("names", "[" * 100_000 + "]" * 100_000),
    ("stride", "9" * 5000),
]


@pytest.mark.parametrize("key, value", BAD_META, ids=[f"{key}-{i}" for i, (key, _) in enumerate(BAD_META)])
def test_metadata_out_of_bounds_is_one_line(tmp_path: Path, key: str, value: str) -> None:
    """Issue 31, finding 8: stride 0 (a ZeroDivisionError), NaN, huge or wrongly typed metadata in an exported
    file is refused in one line naming the file and the field."""
    path = _onnx_with(tmp_path, {**GOOD_META, key: value})
    with pytest.raises(UserError, match=f"{key}|metadata") as info:
        model = InferenceModel(path)
        check_img_size([64], model.stride)
    assert "\n" not in str(info.value) and str(path) in str(info.value) and len(str(info.value)) < 600


def test_good_metadata_and_a_wrong_output_shape(tmp_path: Path) -> None:
    model = InferenceModel(_onnx_with(tmp_path, GOOD_META, [1, 24, 8]))
    assert (model.stride, model.names, model.img_size, model.strides) == (32, ["a", "b", "c"], (8, 8),
                                                                          (8.0, 16.0, 32.0))
    assert model(torch.zeros(1, 3, 8, 8)).shape == (1, 24, 8)  # (b, n, 5 + nc)
    for shape in ([1, 3, 8, 8], [1, 192], [1, 32, 6]):  # another rank, or not 5 + nc columns
        wrong = InferenceModel(_onnx_with(tmp_path, GOOD_META, shape, name=f"w{len(shape)}{shape[-1]}"))
        with pytest.raises(InferenceModelError, match=r"returned a \(.*\) tensor, not \(batch, boxes, 8\)") as info:
            wrong(torch.zeros(1, 3, 8, 8))
        assert "\n" not in str(info.value)


def test_bad_openvino_and_ncnn_metadata_is_the_format_error(tmp_path: Path) -> None:
    from utils.deploy.formats import FormatError

    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "names: *i\n"
    openvino = tmp_path / "m_openvino_model"
    ncnn = tmp_path / "m_ncnn_model"
    for folder, meta in ((openvino, "m.yaml"), (ncnn, "metadata.yaml")):
        folder.mkdir()
        (folder / "m.xml").write_text("<net/>")
        for text in (bomb, "stride: [unclosed\n", "stride: 0\nnames: [a]\nanchors: [[1, 2]]\nstrides: [8]\n"):
            (folder / meta).write_text(text)
            with pytest.raises(FormatError) as info:
                InferenceModel(folder)
            assert "\n" not in str(info.value) and str(folder) in str(info.value)


def test_anchors_and_strides_for_the_head_are_checked(tmp_path: Path) -> None:
    from utils.deploy.formats import FormatError
    from utils.deploy.head_maps import head_from_metadata

    good = {"stride": 32, "names": ["a"], "strides": [8.0, 16.0, 32.0], "anchors": [[[1, 2]] * 3] * 3}
    assert head_from_metadata(good).nc == 1
    for bad in ({"anchors": [[[1, 2]] * 3] * 2}, {"anchors": [[[0, 2]]] * 3}, {"anchors": [[["x", 2]]] * 3},
                {"anchors": [[[1e999, 2]]] * 3}, {"anchors": [[[1, 2]] * 1000] * 3}, {"strides": [8.0, 0, 32.0]},
                {"anchors": 5}):
        with pytest.raises(FormatError, match="anchors|strides"):
            head_from_metadata({**good, **bad})
