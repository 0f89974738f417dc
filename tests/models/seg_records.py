"""Test-only reading of the segmentation release fixtures, until the product's readers learn them (phase 2).

The product's restricted unpickler (utils.weights.safe_pickle) refuses YOLOv5's segmentation file, which pickles
``builtins.getattr`` (its Segment head keeps ``Detect.forward`` as an attribute), and classes outside its record
namespaces (ultralytics.*). This subclass, used by tests only, answers ``getattr`` with an inert None and makes
ultralytics classes inert records too; everything else is the product's reader, tensors checked as there.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

from utils.weights.release_reader import flat_state
from utils.weights.safe_pickle import _LEGACY_MODULES, SafeUnpickler, _Allowed, data_pickle_name
from utils.weights.untrusted import check_zip_members, tensor_budget

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class _SegmentationFixtureUnpickler(SafeUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        module = _LEGACY_MODULES.get(module, module)
        if f"{module}.{name}" == "builtins.getattr":
            return _Allowed("builtins.getattr", lambda *args: None)
        if module.startswith("ultralytics.") and name[:1].isupper():
            return self._record_type(f"{module}.{name}")
        return super().find_class(module, name)


def fixture_records(path: Path) -> Any:
    """The unpickled release file: tensors real, every object an inert record."""
    names = [m.filename for m in check_zip_members(path)]
    pickle_name = data_pickle_name(names)
    with zipfile.ZipFile(path) as archive:
        unpickler = _SegmentationFixtureUnpickler(archive.read(pickle_name), archive, pickle_name[:-len("data.pkl")],
                                                  tensor_budget(path.stat().st_size))
        return unpickler.load()


def fixture_state(path: Path) -> dict[str, torch.Tensor]:
    """The pickled model's flat state dict (as ``nn.Module.state_dict()`` would give it), float32."""
    state = flat_state(fixture_records(path)["model"])
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
