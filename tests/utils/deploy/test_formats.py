"""The format registry: every format found by name and by file, options checked per format, missing packages
named in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from utils.deploy.formats import (
    FLOAT_TOLERANCE,
    HALF_TOLERANCE,
    ExportOptions,
    FormatError,
    all_formats,
    export_format_names,
    format_for,
    get_format,
    require,
)


def test_registry_names_suffixes_and_lookup_by_file() -> None:
    assert [f.name for f in all_formats()][:4] == ["pytorch", "torchscript", "onnx", "openvino"]
    assert "pytorch" not in export_format_names() and "onnx" in export_format_names()
    weights = Path("runs/best.pt")
    for fmt in all_formats()[1:]:
        written = fmt.output_path(weights)
        assert written.parent == weights.parent and format_for(written) is fmt
    assert get_format("onnx").output_path(weights, ExportOptions(int8=True)).name == "best-int8.onnx"
    assert get_format("openvino").output_path(weights, ExportOptions(int8=True)).name == "best-int8_openvino_model"
    assert format_for(Path("model.bin")) is None


def test_options_a_format_cannot_serve_are_refused() -> None:
    with pytest.raises(FormatError, match="--include torchscript does not support --int8"):
        get_format("torchscript").check(ExportOptions(int8=True))
    with pytest.raises(FormatError, match="unknown format"):
        get_format("pytorch")  # the .pt is what exports start from, not a target
    assert get_format("onnx").tolerance(ExportOptions()) == FLOAT_TOLERANCE
    assert get_format("onnx").tolerance(ExportOptions(half=True)) == HALF_TOLERANCE


def test_a_missing_package_is_one_line_naming_it() -> None:
    with pytest.raises(FormatError) as raised:
        require((("no_such_module_xyz", "no-such-package"),), "--include thing")
    assert str(raised.value) == ("--include thing needs no-such-package: pip install no-such-package "
                                 "(or pip install -r requirements-export.txt)")
