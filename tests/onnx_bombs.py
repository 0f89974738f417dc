"""Small ONNX files that ask a runtime for memory out of proportion to their size (issue 31, finding 7); shared
by tests/utils/deploy/test_onnx.py and the memory measurements of tests/test_untrusted_files.py."""

from __future__ import annotations

from pathlib import Path


def onnx_bomb(path: Path, kind: str = "constant", elements: int = 2**31) -> Path:
    """``constant``: ConstantOfShape of ``elements`` floats from a constant shape (folded while the session is
    made); ``computed``: the shape computed from the static input's (8 x 8) times a constant; ``many``: 40
    constant expressions of ``elements`` floats each; ``external``: a weight stored in another file; ``sparse``: a
    sparse constant of ``elements`` floats when dense."""
    from onnx import TensorProto, helper

    nodes, inits, sparse = [], [], []
    if kind == "constant":
        nodes = [helper.make_node("Constant", [], ["shape"], value=helper.make_tensor("v", TensorProto.INT64, [1],
                                                                                      [elements])),
                 helper.make_node("ConstantOfShape", ["shape"], ["output0"])]
    elif kind == "computed":
        nodes = [helper.make_node("Shape", ["images"], ["s"]),
                 helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.INT64, [1],
                                                                                  [elements])),
                 helper.make_node("Mul", ["s", "k"], ["shape"]), helper.make_node("ConstantOfShape", ["shape"],
                                                                                  ["output0"])]
    elif kind == "many":
        inits = [helper.make_tensor("shape", TensorProto.INT64, [1], [elements])]
        nodes = [helper.make_node("ConstantOfShape", ["shape"], [f"c{i}"]) for i in range(40)]
        nodes.append(helper.make_node("Sum", [f"c{i}" for i in range(40)], ["output0"]))
    elif kind == "external":
        weight = helper.make_tensor("w", TensorProto.FLOAT, [4], [0.0] * 4)
        weight.ClearField("float_data")
        weight.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "../../../etc/hostname"), ("length", "16")):
            entry = weight.external_data.add()
            entry.key, entry.value = key, value
        inits = [weight]
        nodes = [helper.make_node("Identity", ["w"], ["output0"])]
    elif kind == "sparse":
        values = helper.make_tensor("d", TensorProto.FLOAT, [1], [1.0])
        indices = helper.make_tensor("i", TensorProto.INT64, [1], [0])
        sparse = [helper.make_sparse_tensor(values, indices, [elements])]
        nodes = [helper.make_node("Identity", ["d"], ["output0"])]
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, None)], inits,
                              sparse_initializer=sparse)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path
