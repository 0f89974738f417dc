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
