"""Official YOLOv5 release files: read without running pickled code, exact outputs, refusals that name the global."""

from __future__ import annotations

import copy
import pickle
import types
import zipfile
from collections import OrderedDict
from pathlib import Path, PosixPath
from typing import Any

import numpy as np
import pytest
import torch

from models.common import SPP, SPPF, Focus
from utils.deploy.runtime import InferenceModel
from utils.weights.checkpoint import (
    FORMAT,
    CheckpointError,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from utils.weights.release_reader import (
    RELEASE_SOURCE,
    Record,
    convert_records,
    is_release_file,
    load_release_checkpoint,
    pickle_globals,
    read_records,
    release_names,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RELEASES = ["yolov5n-v7.0", "yolov5n-v6", "yolov5s-v5.0"]
MODEL_CLASS = {"yolov5n-v7.0": "models.yolo.DetectionModel", "yolov5n-v6": "models.yolo.Model",
               "yolov5s-v5.0": "models.yolo.Model"}
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # 2 shared cores: one thread is faster and steadier
TOLERANCE = 1e-4  # max abs difference from the reference output (boxes in pixels, scores in [0, 1])
BOX_RTOL = 1e-6  # boxes: plus this fraction of their size (float32 rounding differs between machines)


def reference(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = np.load(FIXTURES / f"{name}.npz")
    return torch.from_numpy(data["input"]), torch.from_numpy(data["output"])


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> tuple[str, dict, torch.nn.Module]:
    """(fixture name, checkpoint from load_checkpoint, model in eval mode), loaded once per file."""
    ckpt = load_checkpoint(FIXTURES / f"{request.param}.pt")  # no trusted=True: the safe reader is used
    return request.param, ckpt, model_from_checkpoint(ckpt).eval()


def max_error(model: Any, name: str) -> float:
    """The largest abs difference from the reference output; fails unless every value is within tolerance.

    Scores (in [0, 1]) must be within 1e-4. Box values (up to ~1500 px) may also differ by 1e-6 of their size: a
    few float32 steps, as another CPU or BLAS sums in another order (seen: 1.2e-4 on a 393 px width elsewhere).
    A misplaced or missing tensor moves outputs by far more.
    """
    images, expected = reference(name)
    with torch.no_grad():
        output = model(images)
    output = output[0] if isinstance(output, (list, tuple)) else output
    assert output.shape == expected.shape
    diff = (output - expected).abs()
    assert diff[..., 4:].max() < TOLERANCE, diff[..., 4:].max()
    assert (diff[..., :4] <= TOLERANCE + BOX_RTOL * expected[..., :4].abs()).all(), diff[..., :4].max()
    return diff.max().item()


# ------------------------------------------------------------------------------------------ exact outputs
def test_release_output_matches_reference_unfused_and_fused(release: tuple[str, dict, torch.nn.Module]) -> None:
    name, ckpt, model = release
    unfused = max_error(model, name)
    fused_model = copy.deepcopy(model).fuse()
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused_model.modules())
    fused = max_error(fused_model, name)
    print(f"{name}: max abs error unfused {unfused:.3g}, fused {fused:.3g}")


def test_release_through_detect_backend(release: tuple[str, dict, torch.nn.Module]) -> None:
    name = release[0]
    backend = InferenceModel(FIXTURES / f"{name}.pt")  # load_model -> load_checkpoint -> the safe reader
    assert backend.stride == 32 and len(backend.names) == 80
    error = max_error(backend, name)
    print(f"{name}: max abs error through InferenceModel {error:.3g}")


def test_release_checkpoint_is_in_our_format(release: tuple[str, dict, torch.nn.Module], tmp_path: Path) -> None:
    name, ckpt, model = release
    assert ckpt["format"] == FORMAT and ckpt["source"] == RELEASE_SOURCE and ckpt["epoch"] == -1
    assert ckpt["release"]["model_class"] == MODEL_CLASS[name]
    assert ckpt["names"] == [f"class{i}" for i in range(80)] and ckpt["nc"] == 80
    assert all(v.dtype == torch.float32 for v in ckpt["model"].values() if v.is_floating_point())
    # the head: anchors back in input pixels, the strides of the file
    detect = model.detect
    assert detect.stride.tolist() == [8.0, 16.0, 32.0]
    yaml_anchors = torch.tensor(ckpt["model_yaml"]["anchors"], dtype=torch.float32).view(3, 3, 2)
    torch.testing.assert_close(detect.anchors, yaml_anchors)
    assert detect.anchors[0].tolist() == [[10, 13], [16, 30], [33, 23]]
    assert detect.anchors[2].tolist() == [[116, 90], [156, 198], [373, 326]]
    # the stem and pyramid pooling of each release generation
    stem, pool = model.model[0], model.model[8 if name.endswith("v5.0") else 9]
    assert isinstance(stem, Focus) == name.endswith("v5.0")
    assert isinstance(pool, SPP if name.endswith("v5.0") else SPPF)
    # written by us, it loads weights-only and gives the same model
    path = save_checkpoint(ckpt, tmp_path / "converted.pt")
    again = torch.load(path, weights_only=True)
    assert again["source"] == RELEASE_SOURCE
    for key, value in ckpt["model"].items():
        assert torch.equal(again["model"][key], value), key


def test_every_tensor_of_the_file_is_used() -> None:
    raw = read_records(FIXTURES / "yolov5n-v7.0.pt")
    ckpt = convert_records(raw)
    tensors = _flat(raw["model"])
    assert set(ckpt["model"]) == set(tensors) | {"model.24.stride"}
    for key, value in tensors.items():
        expected = value.float() * (torch.tensor([8.0, 16.0, 32.0]).view(3, 1, 1) if key.endswith("anchors") else 1)
        assert torch.equal(ckpt["model"][key].float(), expected), key


def test_v5_anchor_grid_buffer_is_used_for_the_pixel_anchors() -> None:
    """v5.0 release files also hold ``anchor_grid`` (nl, 1, na, 1, 1, 2) in pixels, fp16: it decodes the boxes."""
    raw = read_records(FIXTURES / "yolov5n-v7.0.pt")
    detect = _module(raw, "model.24")
    pixels = detect.attrs["_buffers"]["anchors"].float() * torch.tensor([8.0, 16.0, 32.0]).view(3, 1, 1)
    pixels[2, 2] += 0.25  # within fp16 rounding of 373 x 326: accepted, and taken from anchor_grid
    detect.attrs["_buffers"]["anchor_grid"] = pixels.half().view(3, 1, 3, 1, 1, 2)
    ckpt = convert_records(raw)
    assert "model.24.anchor_grid" not in ckpt["model"]
    assert ckpt["model"]["model.24.anchors"][2, 2].tolist() == [373.25, 326.25]
    assert ckpt["model_yaml"]["anchors"][2] == [116, 90, 156, 198, 373.25, 326.25]


def test_trusted_flag_also_reads_release_files_safely() -> None:
    ckpt = load_checkpoint(FIXTURES / "yolov5n-v6.pt", trusted=True)
    assert ckpt["source"] == RELEASE_SOURCE


def test_pickle_scan_finds_release_globals(tiny_weights: Path) -> None:
    found = pickle_globals(FIXTURES / "yolov5s-v5.0.pt")
    assert {"models.yolo.Model", "models.common.Focus", "models.common.SPP", "builtins.set",
            "torch._utils._rebuild_tensor_v2"} <= set(found)
    assert is_release_file(FIXTURES / "yolov5n-v7.0.pt")
    assert not is_release_file(tiny_weights)


def test_plain_values_of_older_files_are_rebuilt_safely(tmp_path: Path) -> None:
    """v5.0 files keep best_fitness as a numpy array; options may hold paths, numpy scalars and bytes."""
    values = {"best_fitness": np.array([0.37, 0.5]), "fitness": np.float64(0.25), "save_dir": PosixPath("runs/x"),
              "raw": b"\x00\xff", "shape": torch.Size([2, 3]), "w": torch.ones(2, dtype=torch.float16)}
    raw = read_records(craft(tmp_path / "plain.pt", values))
    assert np.array_equal(raw["best_fitness"], [0.37, 0.5]) and raw["fitness"] == 0.25
    assert raw["save_dir"] == "runs/x" and raw["raw"] == b"\x00\xff" and raw["shape"] == (2, 3)
    assert raw["w"].dtype == torch.float16 and raw["w"].tolist() == [1.0, 1.0]


def test_scan_reads_protocol_4_pickles(tmp_path: Path) -> None:
    path = tmp_path / "p4.pt"
    torch.save({"a": OrderedDict(), "m": Obj(Global("models.yolo", "Model"), {})}, path, pickle_protocol=4,
               pickle_module=types.SimpleNamespace(Pickler=CraftPickler, __name__="craft"))
    assert {"collections.OrderedDict", "models.yolo.Model"} <= set(pickle_globals(path))  # STACK_GLOBAL and GLOBAL
    assert is_release_file(path)


def test_names_as_list_or_dict() -> None:
    record = Record.__new__(type("Model", (Record,), {"global_name": "models.yolo.Model"}))
    record.__setstate__({"names": {0: "person", 1: "bicycle"}})
    assert release_names(record, 2) == ["person", "bicycle"]
    record.__setstate__({"names": ["a", "b", "c"]})
    assert release_names(record, 2) == ["0", "1"]  # the wrong length: numbered instead


# ------------------------------------------------------------------------------------------ refusals
class Global:
    """A global written into a crafted pickle by name; the test process never resolves it."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class Call:
    """REDUCE: ``func(*args)`` when unpickled."""

    def __init__(self, func: Global, *args: Any) -> None:
        self.func, self.args = func, args


class Obj:
    """NEWOBJ + BUILD: an instance of ``cls`` with ``state``, as torch.save writes a pickled module."""

    def __init__(self, cls: Global, state: dict) -> None:
        self.cls, self.state = cls, state


class CraftPickler(pickle._Pickler):
    """The pure-Python pickler, taught to write Global/Call/Obj as raw opcodes (tensors still go through torch)."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _global(self, obj: Global) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())

    def _call(self, obj: Call) -> None:
        self.save(obj.func)
        self.save(tuple(obj.args))
        self.write(pickle.REDUCE)

    def _obj(self, obj: Obj) -> None:
        self.save(obj.cls)
        self.save(())
        self.write(pickle.NEWOBJ)
        self.save(obj.state)
        self.write(pickle.BUILD)

    dispatch[Global], dispatch[Call], dispatch[Obj] = _global, _call, _obj


def craft(path: Path, obj: Any) -> Path:
    """A torch zip file whose data.pkl is ``obj`` with its Global/Call/Obj parts written as raw pickle opcodes."""
    torch.save(obj, path, pickle_module=types.SimpleNamespace(Pickler=CraftPickler, __name__="craft"))
    return path


def release_like(payload: Any) -> dict:
    """A release-shaped top level whose model record hides ``payload`` among its submodules."""
    model = Obj(Global("models.yolo", "Model"), {
        "_parameters": OrderedDict(), "_buffers": OrderedDict(), "yaml": {"nc": 80, "backbone": [], "head": []},
        "_modules": OrderedDict(model=Obj(Global("torch.nn.modules.container", "Sequential"), {
            "_modules": OrderedDict(bad=payload), "_parameters": OrderedDict(), "_buffers": OrderedDict()}))})
    return {"epoch": -1, "best_fitness": None, "model": model, "ema": None, "weight": torch.zeros(2)}


def code_payloads(marker: Path) -> dict[str, Call]:
    """Calls that, if ever run, create ``marker``."""
    return {
        "os.system": Call(Global("os", "system"), f"touch {marker}"),
        "builtins.eval": Call(Global("builtins", "eval"), f"open({str(marker)!r}, 'w')"),
        "subprocess.call": Call(Global("subprocess", "call"), ["touch", str(marker)]),
        "models.common.Conv": Call(Global("models.common", "Conv"), 3, 16),  # a record class called, not built
    }


def test_getattr_names_a_model_class_attribute_and_never_looks_it_up(tmp_path: Path) -> None:
    """YOLOv5's segmentation files pickle ``getattr(models.yolo.Detect, 'forward')``: it reads as the dotted name;
    getattr on anything but a model class of the file is refused."""
    attribute = Call(Global("builtins", "getattr"), Global("models.yolo", "Detect"), "forward")
    assert read_records(craft(tmp_path / "ok.pt", {"detect": attribute}))["detect"] == "models.yolo.Detect.forward"
    for target in ("text", Global("torch._utils", "_rebuild_tensor_v2")):  # allowed objects, not model classes
        path = craft(tmp_path / "evil.pt", {"x": Call(Global("builtins", "getattr"), target, "join")})
        with pytest.raises(CheckpointError, match="refused.*getattr"):
            read_records(path)


@pytest.mark.parametrize("target", ["os.system", "builtins.eval", "subprocess.call"])
def test_top_level_code_call_refused(tmp_path: Path, target: str) -> None:
    marker = tmp_path / "code-ran"
    path = craft(tmp_path / "evil.pt", {"model": code_payloads(marker)[target], "w": torch.ones(1)})
    for load in (load_checkpoint, read_records, load_release_checkpoint):
        with pytest.raises(CheckpointError) as info:
            load(path)
        message = str(info.value)
        assert "\n" not in message and str(path) in message and target.split(".")[-1] in message, message
        assert "refused" in message
    assert not marker.exists()


@pytest.mark.parametrize("target", ["os.system", "builtins.eval", "subprocess.call", "models.common.Conv"])
def test_code_call_nested_in_release_model_refused(tmp_path: Path, target: str) -> None:
    marker = tmp_path / "code-ran"
    path = craft(tmp_path / "yolov5s.pt", release_like(code_payloads(marker)[target]))
    assert is_release_file(path)  # so load_checkpoint routes it to the restricted reader
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and target in message and "refused" in message, message
    assert not marker.exists()


def test_crafted_pickle_really_runs_code_when_fully_unpickled(tmp_path: Path) -> None:
    """The control: the same crafted data.pkl does create the marker under a plain unpickle."""
    marker = tmp_path / "code-ran"
    path = craft(tmp_path / "evil.pt", {"model": code_payloads(marker)["os.system"]})
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
    pickle.loads(data)  # what torch.load(weights_only=False) would do
    assert marker.exists()


# ------------------------------------------------------------------------------------------ files that do not map
def _flat(record: Record, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for group in ("_parameters", "_buffers"):
        out.update({prefix + k: v for k, v in record.attrs.get(group, {}).items() if v is not None})
    for name, child in record.attrs.get("_modules", {}).items():
        out.update(_flat(child, f"{prefix}{name}."))
    return out


def _module(raw: dict, dotted: str) -> Record:
    record = raw["model"]
    for part in dotted.split("."):
        record = record.attrs["_modules"][part]
    return record


def _drop_bn_weight(raw: dict) -> None:
    del _module(raw, "model.0.bn").attrs["_parameters"]["weight"]


def _reshape_conv(raw: dict) -> None:
    _module(raw, "model.2.cv1.conv").attrs["_parameters"]["weight"] = torch.zeros(1, 1, 1, 1, dtype=torch.float16)


def _extra_buffer(raw: dict) -> None:
    _module(raw, "model.4.cv2.bn").attrs["_buffers"]["surprise"] = torch.zeros(3)


def _change_stride(raw: dict) -> None:
    _module(raw, "model.1.conv").attrs["stride"] = (1, 1)


def _inconsistent_anchor_grid(raw: dict) -> None:
    _module(raw, "model.24").attrs["_buffers"]["anchor_grid"] = torch.ones(3, 1, 3, 1, 1, 2, dtype=torch.float16)


def _classification_model(raw: dict) -> None:
    raw["model"] = Record.__new__(type("ClassificationModel", (Record,),
                                       {"global_name": "models.yolo.ClassificationModel"}))


@pytest.mark.parametrize("mutate, expected", [
    (_drop_bn_weight, "tensor model.0.bn.weight (16,) is missing from the file"),
    (_reshape_conv, "tensor model.2.cv1.conv.weight is (1, 1, 1, 1) in the file but (16, 32, 1, 1)"),
    (_extra_buffer, "tensor model.4.cv2.bn.surprise (3,) has no place in the model"),
    (_change_stride, "model.model.1.conv.stride is (1, 1) in the file but (2, 2)"),
    (_inconsistent_anchor_grid, "model.24.anchor_grid disagrees with model.24.anchors x stride"),
    (_classification_model, "holds a models.yolo.ClassificationModel; only YOLOv5 models"),
])
def test_file_that_does_not_map_is_refused_naming_the_first_mismatch(mutate: Any, expected: str) -> None:
    raw = read_records(FIXTURES / "yolov5n-v7.0.pt")
    mutate(raw)
    with pytest.raises(CheckpointError) as info:
        convert_records(raw, "yolov5n.pt")
    message = str(info.value)
    assert "\n" not in message and message.startswith("yolov5n.pt: ") and expected in message, message
