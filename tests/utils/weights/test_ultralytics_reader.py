"""Ultralytics release files (YOLOv8, YOLO11, YOLO26): read without running pickled code, outputs matched to the
ones ultralytics computed, refusals in one line, and fuzzed records and pickles that load harmlessly or are refused."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.head_end_to_end import EndToEndDetect
from tests.utils.weights import test_fuzz
from tests.utils.weights.pickles import build, dct, glob, newobj, text
from utils.weights.checkpoint import FORMAT, CheckpointError, load_checkpoint, model_from_checkpoint, save_checkpoint
from utils.weights.release_reader import Record, is_release_file, pickle_globals, read_records
from utils.weights.ultralytics_reader import ULTRALYTICS_SOURCE, convert_records

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ultralytics"
FILES = ["yolov8n", "yolo11n", "yolo26n"]
PARAMETERS = {"yolov8n": 3_157_200, "yolo11n": 2_624_080, "yolo26n": 2_572_280}
RELATIVE = 1e-4  # of each output's scale (its largest magnitude in the reference): boxes and scores apart
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def raws() -> dict[str, Any]:
    """Each fixture's records, read once (tests mutate deep copies)."""
    return {name: read_records(FIXTURES / f"{name}.pt") for name in FILES}


@pytest.fixture(scope="module", params=FILES)
def release(request: pytest.FixtureRequest) -> tuple[str, dict, torch.nn.Module]:
    """(name, checkpoint from load_checkpoint, model in eval mode), loaded once per file."""
    ckpt = load_checkpoint(FIXTURES / f"{request.param}.pt")  # no trusted=True: the restricted reader is used
    return request.param, ckpt, model_from_checkpoint(ckpt).eval()


def ultralytics_output(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Our model's output in the form of the fixture's, (b, n, 4 + nc): the eval output of an anchor-free head; for
    YOLO26's end-to-end head the one-to-many branches' decode, which is what the 8.4 fixture holds (its README)."""
    if not isinstance(model.head, EndToEndDetect):
        return model(images)
    captured = {}
    hook = model.head.register_forward_pre_hook(lambda module, inputs: captured.setdefault("xs", inputs[0]))
    model(images)
    hook.remove()
    return model.head.decode_one2many(captured["xs"])


def assert_matches_reference(model: torch.nn.Module, name: str) -> tuple[float, float]:
    data = np.load(FIXTURES / f"{name}.npz")
    expected = torch.from_numpy(data["output"]).transpose(1, 2)  # ultralytics' (b, 4 + nc, n) -> our (b, n, 4 + nc)
    with torch.no_grad():
        output = ultralytics_output(model, torch.from_numpy(data["input"]))
    assert output.shape == expected.shape == (2, 756, 84)
    errors = []
    for part in (slice(0, 4), slice(4, None)):  # boxes in pixels, scores after sigmoid: each against its scale
        scale = expected[..., part].abs().max()
        errors.append(((output[..., part] - expected[..., part]).abs().max() / scale).item())
        assert errors[-1] < RELATIVE, (name, part, errors[-1])
    return errors[0], errors[1]


def test_outputs_match_ultralytics_unfused_and_fused(release: tuple[str, dict, torch.nn.Module]) -> None:
    name, _, model = release
    unfused = assert_matches_reference(model, name)
    fused_model = copy.deepcopy(model).fuse()
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused_model.modules())
    fused = assert_matches_reference(fused_model, name)
    print(f"{name}: relative error boxes/scores unfused {unfused[0]:.2g}/{unfused[1]:.2g}, "
          f"fused {fused[0]:.2g}/{fused[1]:.2g}")


def test_checkpoint_is_in_our_format(release: tuple[str, dict, torch.nn.Module], tmp_path: Path) -> None:
    name, ckpt, model = release
    assert ckpt["format"] == FORMAT and ckpt["source"] == ULTRALYTICS_SOURCE and ckpt["epoch"] == -1
    assert ckpt["release"]["model_class"] == "ultralytics.nn.tasks.DetectionModel"
    assert ckpt["release"]["version"] == "8.4.190" and ckpt["release"]["args"]["box"] == 7.5
    assert ckpt["names"] == [f"class{i}" for i in range(80)] and ckpt["nc"] == 80
    assert ckpt["model_yaml"]["scale"] == "n" and ckpt["model_yaml"]["yaml_file"] == f"{name}.yaml"
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]
    assert model.head.family == name[:-1] and model.stride.tolist() == [8.0, 16.0, 32.0]
    assert all(v.dtype == torch.float32 for v in ckpt["model"].values() if v.is_floating_point())
    path = save_checkpoint(ckpt, tmp_path / "converted.pt")  # written by us it loads weights-only, the same model
    again = torch.load(path, weights_only=True)
    assert again["source"] == ULTRALYTICS_SOURCE
    assert all(torch.equal(again["model"][k], v) for k, v in ckpt["model"].items())


def test_every_tensor_of_the_file_is_used(raws: dict[str, Any]) -> None:
    raw = raws["yolo26n"]
    ckpt = convert_records(raw)
    tensors = _flat(raw["model"])
    assert set(ckpt["model"]) == set(tensors) | {"model.23.stride"}
    assert any(k.startswith("model.23.one2one_cv3.") for k in tensors)
    for key, value in tensors.items():
        assert torch.equal(ckpt["model"][key], value.float()), key


def test_scan_finds_ultralytics_globals() -> None:
    path = FIXTURES / "yolo11n.pt"
    assert {"ultralytics.nn.tasks.DetectionModel", "ultralytics.nn.modules.block.C3k2",
            "ultralytics.nn.modules.head.Detect"} <= set(pickle_globals(path))
    assert is_release_file(path)


@pytest.mark.parametrize("name", ["yolov8n-seg", "yolo11n-seg"])
def test_segmentation_files_load_and_match_outputs_and_prototypes(name: str, tmp_path: Path) -> None:
    """yolov8n-seg and yolo11n-seg: read by the restricted reader into our Segment models; rows (boxes, scores, 32
    coefficients) and prototypes equal ultralytics' within 1e-4 of each part's scale, fused or not; the checkpoint
    records the task and rebuilds after a save."""
    ckpt = load_checkpoint(FIXTURES / f"{name}.pt")
    assert (ckpt["family"], ckpt["task"]) == (name[:-5], "segment")
    assert ckpt["release"]["model_class"] == "ultralytics.nn.tasks.SegmentationModel"
    assert ckpt["model_yaml"]["yaml_file"] == f"{name}.yaml" and ckpt["model_yaml"]["scale"] == "n"
    model = model_from_checkpoint(ckpt).eval()
    data = np.load(FIXTURES / f"{name}.npz")
    assert sum(p.numel() for p in model.parameters()) == int(data["params"])
    expected = torch.from_numpy(data["output"]).transpose(1, 2)  # (b, 4 + nc + nm, n) -> (b, n, 4 + nc + nm)
    expected_protos = torch.from_numpy(data["protos"])
    for candidate in (model, copy.deepcopy(model).fuse()):
        with torch.no_grad():
            rows, protos = candidate(torch.from_numpy(data["input"]))
        assert rows.shape == expected.shape == (2, 756, 116) and protos.shape == expected_protos.shape
        for part in (slice(0, 4), slice(4, 84), slice(84, None)):  # boxes, scores, coefficients
            scale = expected[..., part].abs().max()
            assert (rows[..., part] - expected[..., part]).abs().max() / scale < RELATIVE, (name, part)
        assert (protos - expected_protos).abs().max() / expected_protos.abs().max() < RELATIVE
    again = load_checkpoint(save_checkpoint(ckpt, tmp_path / f"{name}.pt"))
    assert again["task"] == "segment" and model_from_checkpoint(again).head.nm == 32


TASK_FILES = {"yolov8n-cls": "classify", "yolo11n-cls": "classify", "yolov8n-obb": "obb", "yolo11n-obb": "obb",
              "yolo26n-obb": "obb"}
TASK_MODELS = {"classify": "ultralytics.nn.tasks.ClassificationModel", "obb": "ultralytics.nn.tasks.OBBModel"}


def task_output(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Our output in the fixture's form: probabilities (b, nc); OBB rows (b, 4 + nc + 1, n) (YOLO26's: its
    one-to-many branches' decode, which is what the 8.4 fixture holds, as for detection)."""
    if not isinstance(model.head, EndToEndDetect):
        out = model(images)
        return out if out.dim() == 2 else out.transpose(1, 2)
    captured = {}
    hook = model.head.register_forward_pre_hook(lambda module, inputs: captured.setdefault("xs", inputs[0]))
    model(images)
    hook.remove()
    return model.head.decode_one2many(captured["xs"]).transpose(1, 2)


@pytest.mark.parametrize("name", list(TASK_FILES))
def test_classification_and_obb_files_load_and_match_outputs(name: str, tmp_path: Path) -> None:
    """yolov8n-cls, yolo11n-cls (softmax of 1000 classes at 224 px) and yolov8n-obb, yolo11n-obb, yolo26n-obb (xywh,
    15 class scores, the angle in radians): read by the restricted reader into our Classify and OBB models, outputs
    equal to ultralytics' within 1e-4 of each part's scale, fused or not; the checkpoint records the task and
    rebuilds after a save."""
    task = TASK_FILES[name]
    ckpt = load_checkpoint(FIXTURES / f"{name}.pt")
    assert (ckpt["family"], ckpt["task"]) == (name[:-5] if task == "obb" or "v8" in name else "yolo11", task)
    assert ckpt["release"]["model_class"] == TASK_MODELS[task] and ckpt["model_yaml"]["yaml_file"] == f"{name}.yaml"
    model = model_from_checkpoint(ckpt).eval()
    data = np.load(FIXTURES / f"{name}.npz")
    assert sum(p.numel() for p in model.parameters()) == int(data["params"])
    expected = torch.from_numpy(data["output"])
    parts = [slice(None)] if task == "classify" else [slice(0, 4), slice(4, 19), slice(19, None)]
    for candidate in (model, copy.deepcopy(model).fuse()):
        with torch.no_grad():
            output = task_output(candidate, torch.from_numpy(data["input"]))
        assert output.shape == expected.shape == ((2, 1000) if task == "classify" else (2, 20, 756))
        for part in parts:  # probabilities; or boxes, scores, angles: each against its scale
            scale = expected[:, part].abs().max()
            assert (output[:, part] - expected[:, part]).abs().max() / scale < RELATIVE, (name, part)
    if task == "classify":  # a real distribution, not a saturated one (a wrong tensor would show)
        assert expected.max() < 0.5 and torch.allclose(expected.sum(1), torch.ones(2), atol=1e-4)
    else:
        assert expected[:, -1].std() > 0.01  # the angles vary across cells
    again = load_checkpoint(save_checkpoint(ckpt, tmp_path / f"{name}.pt"))
    assert again["task"] == task and model_from_checkpoint(again).head.nc == (1000 if task == "classify" else 15)


# ------------------------------------------------------------------------------------------ refusals
def copy_records(obj: Any) -> Any:
    """A deep copy of read records (a Record's state is copied, its class kept; tensors are shared, never changed)."""
    if isinstance(obj, Record):
        clone = type(obj).__new__(type(obj), *obj.new_args)
        clone.__setstate__(copy_records(obj.__dict__["state"]))
        return clone
    if isinstance(obj, dict):
        return type(obj)((k, copy_records(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(copy_records(v) for v in obj)
    return obj


def _module(raw: dict, dotted: str) -> Record:
    record = raw["model"]
    for part in dotted.split("."):
        record = record.attrs["_modules"][part]
    return record


def _flat(record: Record, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for group in ("_parameters", "_buffers"):
        out.update({prefix + k: v for k, v in record.attrs.get(group, {}).items() if v is not None})
    for name, child in record.attrs.get("_modules", {}).items():
        out.update(_flat(child, f"{prefix}{name}."))
    return out


def _world_model(raw: dict) -> None:
    kind = type("WorldModel", (Record,), {"global_name": "ultralytics.nn.tasks.WorldModel"})
    other = Record.__new__(kind)
    other.__setstate__(raw["model"].attrs)
    raw["model"] = other


def _attribute(dotted: str, name: str, value: Any) -> Callable[[dict], None]:
    def edit(raw: dict) -> None:
        _module(raw, dotted).attrs[name] = value
    return edit


def _drop_tensor(raw: dict) -> None:
    del _module(raw, "model.23.one2one_cv2.0.2").attrs["_parameters"]["bias"]


def _yaml(key: str, value: Any) -> Callable[[dict], None]:
    def edit(raw: dict) -> None:
        raw["model"].attrs["yaml"][key] = value
    return edit


REFUSALS = {
    "other model class": (_world_model, "holds a ultralytics.nn.tasks.WorldModel; only ultralytics models"),
    "missing tensor": (_drop_tensor, "tensor model.23.one2one_cv2.0.2.bias (4,) is missing from the file"),
    "linear SPPF input": (_attribute("model.9", "add", False), "model.model.9.add is False in the file but True"),
    "attention heads": (_attribute("model.10.m.0.attn", "num_heads", 4), "attn.num_heads is 4 in the file but 2"),
    "no one-to-one": (_yaml("end2end", False), "tensor model.23.one2one_cv2.0.0.conv.weight (16, 64, 3, 3) has no "
                                                "place in the model its yaml builds"),
    "other scale": (_yaml("scale", "s"), "is (16, 3, 3, 3) in the file but (32, 3, 3, 3) in the model its yaml"),
    "bad reg_max": (_yaml("reg_max", 1000), "cannot be built here"),
    "stride": (_attribute("model.23", "stride", torch.tensor([8.0, 16.0, 64.0])), "strides [8.0, 16.0, 64.0] in the "
                                                                                  "file but [8.0, 16.0, 32.0]"),
    "head class": (lambda raw: setattr(type(_module(raw, "model.23")), "global_name", "ultralytics.x.Other"),
                   "the last layer is a ultralytics.x.Other"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_file_that_does_not_map_is_refused_naming_the_first_mismatch(raws: dict[str, Any], case: str) -> None:
    raw = read_records(FIXTURES / "yolo26n.pt") if case == "head class" else copy_records(raws["yolo26n"])
    mutate, expected = REFUSALS[case]
    mutate(raw)
    with pytest.raises(CheckpointError) as info:
        convert_records(raw, "yolo26n.pt")
    message = str(info.value)
    assert "\n" not in message and message.startswith("yolo26n.pt: ") and expected in message, message


# ------------------------------------------------------------------------------------------ fuzzing
def _mutations(rng: random.Random, raw: dict) -> None:
    """One to three random changes: settings, tensors, children, YAML values and rows of the model's records."""
    records = [r for _, r in _walk(raw["model"])]
    junk = [None, -1, 0, 3, 2.5, 10 ** 9, "nc", "None", True, [], [1, 2], {"a": 1}, "Detect", float("nan")]
    for _ in range(rng.randint(1, 3)):
        record, kind = rng.choice(records), rng.random()
        attrs = record.attrs
        if kind < 0.3 and attrs.get("_parameters"):
            key = rng.choice(list(attrs["_parameters"]))
            attrs["_parameters"][key] = rng.choice([None, torch.zeros(rng.randint(0, 3)), "x", 1.0])
        elif kind < 0.5:
            plain = [k for k, v in attrs.items() if not k.startswith("_") and not isinstance(v, (dict, Record))]
            if plain:
                attrs[rng.choice(plain)] = rng.choice(junk)
        elif kind < 0.6 and attrs.get("_modules"):
            del attrs["_modules"][rng.choice(list(attrs["_modules"]))]
        else:
            cfg = raw["model"].attrs["yaml"]
            if rng.random() < 0.5:
                cfg[rng.choice(["nc", "scale", "reg_max", "end2end", "channels", "scales", "depth_multiple"])] = \
                    rng.choice(junk + ["q", "x"])
            else:
                rows = cfg[rng.choice(["backbone", "head"])]
                row = rows[rng.randrange(len(rows))]
                row[rng.randrange(4)] = rng.choice(junk + [[-1, 6], [[1, 2], 3], "C3k2", "SPPF", [2048, True, 9]])


def _walk(record: Record, prefix: str = "model") -> list[tuple[str, Record]]:
    found = [(prefix, record)]
    for name, child in (record.attrs.get("_modules") or {}).items():
        if isinstance(child, Record):
            found.extend(_walk(child, f"{prefix}.{name}"))
    return found


def test_fuzzed_records_load_or_are_refused_in_one_line(raws: dict[str, Any]) -> None:
    """Random damage to a real file's records (as a stranger could write them): every case either converts into a
    model that runs or is refused with one CheckpointError line; nothing else escapes."""
    rng = random.Random(20261202)
    loaded = refused = 0
    for case in range(24):
        raw = copy_records(raws[FILES[case % 3]])
        _mutations(rng, raw)
        try:
            ckpt = convert_records(raw, f"case{case}.pt")
        except CheckpointError as e:
            assert "\n" not in str(e) and str(e).startswith(f"case{case}.pt: "), str(e)
            refused += 1
            continue
        model = model_from_checkpoint(ckpt).eval()
        with torch.no_grad():
            model(torch.zeros(1, 3, 64, 64))
        loaded += 1
    print(f"fuzzed records: {loaded} loaded, {refused} refused")
    assert refused > 12 and loaded > 0, (loaded, refused)  # most damage is caught; harmless changes still load


class UltralyticsFuzzer(test_fuzz.Fuzzer):
    """test_fuzz's pickle fuzzer with ultralytics' class names among the globals and its model class on top."""

    def __init__(self, rng: random.Random, allowed: list[str]) -> None:
        super().__init__(rng, allowed)
        self.names += ["ultralytics.nn.tasks.DetectionModel", "ultralytics.nn.modules.head.Detect",
                       "ultralytics.nn.modules.block.C3k2", "ultralytics.utils.loss.E2ELoss", "ultralytics.os.system"]

    def file(self, path: Path) -> Path:
        top = {"payload": self.value(3), "w": test_fuzz.tensor("0", 4, (4,), (1,))}
        model = build(newobj(glob("ultralytics.nn.tasks", "DetectionModel")),
                      dct(yaml=self.value(2), _modules=self.value(2), stride=self.value(1)))
        top[self.rng.choice(["model", "ema"])] = model
        top["version"] = text("8.4.190")
        return test_fuzz.torch_zip(path, test_fuzz.program(dct(top)), {"0": test_fuzz.floats(1.0, -2.0, 3.0, -4.0)})


def test_fuzzed_ultralytics_pickles_load_harmlessly_or_are_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    objects = test_fuzz.allowed_objects()
    before = test_fuzz.snapshot(objects)
    fuzzer = UltralyticsFuzzer(random.Random(test_fuzz.SEED + 32), test_fuzz.allowed_names())
    for case in range(150):
        path = fuzzer.file(tmp_path / f"case{case}.pt")
        test_fuzz.load_or_refuse(path)
        path.unlink()
    assert test_fuzz.snapshot(objects) == before
    assert list(tmp_path.iterdir()) == []
