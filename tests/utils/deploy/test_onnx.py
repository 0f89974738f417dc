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
