"""The ONNX format's export keywords: only those the installed torch has."""

from __future__ import annotations

import inspect

import torch

from utils.deploy.formats import ExportOptions
from utils.deploy.onnx import onnx_export_kwargs


def test_onnx_export_keywords_exist_in_this_torch() -> None:
    parameters = inspect.signature(torch.onnx.export).parameters
    for dynamic in (False, True):
        for dynamo in (False, True):
            options = ExportOptions(opset=17, verbose=False, dynamic=dynamic, dynamo=dynamo)
            assert set(onnx_export_kwargs(options)) <= set(parameters), (dynamic, dynamo)


def test_graphs_out_of_proportion_to_the_file_are_refused_before_a_session(tmp_path) -> None:
    """Issue 31, finding 7: a 4xx-byte file whose ConstantOfShape asks for 2^31 floats (8 GB, folded by ONNX
    Runtime while it makes the session), a shape computed from the input's times 10^5, 40 constant expressions of
    64 MB, a weight in another file and a huge sparse constant are refused in one line, before any session."""
    import pytest

    from tests.onnx_bombs import onnx_bomb
    from utils.deploy.runtime import InferenceModel
    from utils.errors import UserError

    cases = {("constant", 2**31): "would hold 8,589,934,592 bytes", ("computed", 10**5): "would hold",
             ("many", 2**24): "constant expressions would take", ("external", 0): "external data",
             ("sparse", 2**30): "sparse constant"}
    for (kind, elements), words in cases.items():
        path = onnx_bomb(tmp_path / f"{kind}.onnx", kind, elements)
        assert path.stat().st_size < 2000
        with pytest.raises(UserError, match=words) as info:
            InferenceModel(path)
        assert "\n" not in str(info.value)


def test_int8_leaves_every_heads_decoding_in_float_and_quantizes_its_convolutions(tmp_path) -> None:
    """head_decoding_nodes, which --int8 (ONNX Runtime and OpenVINO) leaves in float, on each family's and task's
    head, from both exporters (TorchScript's and, with --dynamo, torch.export's): all in the head, no convolution
    and nothing a convolution follows (the activations between a branch's convolutions stay quantized), and every
    graph output comes out of it (the rows' concat, a segmenter's prototypes, a classifier's probabilities)."""
    import onnx

    from models.yolo import Model
    from utils.deploy.formats import quiet_jit_warnings
    from utils.deploy.onnx import _top_module, head_decoding_nodes

    cases = (("yolov5n.yaml", False, False), ("yolo11n.yaml", True, False), ("yolo26n.yaml", True, False),
             ("yolo11n-seg.yaml", True, False), ("yolo11n-cls.yaml", False, False), ("yolov5n.yaml", False, True),
             ("yolo11n.yaml", True, True))
    for cfg, branched, dynamo in cases:
        model = Model(cfg).eval()
        file = tmp_path / f"{cfg}-{dynamo}.onnx"
        options = ExportOptions(opset=18 if dynamo else 17, dynamo=dynamo)
        with quiet_jit_warnings():
            torch.onnx.export(model, (torch.zeros(1, 3, 64, 64),), str(file),
                              **onnx_export_kwargs(options, outputs=model.head.contract.outputs))
        proto = onnx.load(str(file))
        excluded, graph, case = set(head_decoding_nodes(proto)), proto.graph, (cfg, dynamo)
        head = f"model.{len(model.model) - 1}"
        in_head = {node.name for node in graph.node if _top_module(node) == head}
        kinds = {node.name: node.op_type for node in graph.node}
        assert excluded and excluded <= in_head and all(kinds[name] != "Conv" for name in excluded), case
        made_by = {output: node.name for node in graph.node for output in node.output}
        assert {made_by[output.name] for output in graph.output} <= excluded, case
        conv_inputs = {name for node in graph.node if node.op_type == "Conv" for name in node.input}
        between = {node.name for node in graph.node if node.name in in_head and node.op_type != "Conv"
                   and set(node.output) & conv_inputs}
        assert bool(between) == branched and not excluded & between, case
