"""tutorial.ipynb runs from top to bottom in a fresh kernel (nbclient), in a temporary folder, and is committed
without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import ROOT

NOTEBOOK = ROOT / "tutorial.ipynb"
pytestmark = [pytest.mark.ddp, pytest.mark.slow]  # it starts two training processes: scheduled first


def test_the_committed_notebook_holds_no_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert len(code) >= 6
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


def test_the_tutorial_runs_from_top_to_bottom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where the checkout is importable but the working folder is tmp_path, with the data set there too, so
    that nothing is written into the checkout."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "datasets"))
    monkeypatch.setenv("NO_COLOR", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for output in cell.outputs if output.output_type == "stream")
    runs = tmp_path / "runs" / "tutorial"
    weights = runs / "train" / "exp" / "weights"
    assert (weights / "best.pt").is_file() and (weights / "best.onnx").is_file()
    assert (weights / "best.torchscript").is_file()
    assert (runs / "val" / "exp").is_dir() and (runs / "detect" / "exp" / "shapes1.jpg").is_file()
    assert (runs / "train" / "exp2" / "weights" / "last.pt").is_file()  # the two-process run
    assert printed.count("'mAP_0.5:0.95':") == 2 and "boxes per image from the ONNX file" in printed
    images = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs
              if o.output_type == "display_data" and "image/jpeg" in o.get("data", {})]
    assert len(images) == 1
