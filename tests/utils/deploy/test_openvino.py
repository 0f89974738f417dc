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
