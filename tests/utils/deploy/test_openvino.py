"""OpenVINO: float models are compiled to compute in FP32, the precision their tolerance states."""

from __future__ import annotations

from pathlib import Path

import pytest

from utils.deploy.runtime import InferenceModel


def test_float_openvino_computes_in_fp32_not_the_cpus_bfloat16(tiny_exports: dict[str, Path], monkeypatch) -> None:
    openvino = pytest.importorskip("openvino")
    compiled = []
    compile_model = openvino.Core.compile_model

    def keep(core, *args, **kwargs):  # the real compile, its result kept for the assertion
        compiled.append(compile_model(core, *args, **kwargs))
        return compiled[-1]

    monkeypatch.setattr(openvino.Core, "compile_model", keep)
    InferenceModel(tiny_exports["openvino"])
    # with no hint, a CPU with AMX or AVX512-BF16 (this project's) compiles it to bfloat16: 2.3e-4 x image size
    assert compiled[0].get_property("INFERENCE_PRECISION_HINT") == openvino.Type.f32


def test_a_graph_out_of_proportion_is_refused_before_it_is_compiled(tmp_path) -> None:
    """A 2 KB IR broadcasting a constant to 2^31 floats (8 GB once compile_model folds it): one line, first."""
    import numpy as np

    from utils.errors import UserError

    openvino = pytest.importorskip("openvino")
    ops = pytest.importorskip("openvino.opset13")
    images = ops.parameter([1, 3, 8, 8], openvino.Type.f32, name="images")
    bomb = ops.broadcast(ops.constant(np.array([1.0], np.float32)), ops.constant(np.array([2**31], np.int64)))
    folder = tmp_path / "bomb_openvino_model"
    folder.mkdir()
    openvino.save_model(openvino.Model([bomb.output(0)], [images], "bomb"), str(folder / "bomb.xml"))
    (folder / "bomb.yaml").write_text("stride: 32\nnames: [a]\n")
    assert sum(p.stat().st_size for p in folder.iterdir()) < 4000
    with pytest.raises(UserError, match="would hold 8,589,934,592 bytes") as info:
        InferenceModel(folder)
    assert "\n" not in str(info.value)
