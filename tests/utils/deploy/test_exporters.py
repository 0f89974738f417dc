"""The export writers' arguments: only keywords the installed torch has."""

from __future__ import annotations

import torch

from utils.deploy.exporters import onnx_export_kwargs


def test_onnx_export_keywords_exist_in_this_torch() -> None:
    import argparse
    import inspect

    parameters = inspect.signature(torch.onnx.export).parameters
    for dynamic in (False, True):
        for dynamo in (False, True):
            opt = argparse.Namespace(opset=17, verbose=False, dynamic=dynamic, dynamo=dynamo)
            assert set(onnx_export_kwargs(opt)) <= set(parameters), (dynamic, dynamo)
