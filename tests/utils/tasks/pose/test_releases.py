"""ultralytics' pose release files (yolov8n-pose, yolo11n-pose, yolo26n-pose) and yolo26n-seg: read without running
pickled code into our Pose and Segment26 heads, every tensor by name, outputs equal to those ultralytics computed
(tests/fixtures/ultralytics/README.md) within 1e-4 of each part's scale, fused or not; refusals in one line."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.utils.weights.test_ultralytics_reader import _mutations, copy_records
from utils.tasks.pose.head import AnchorFreePoseHead, EndToEndPoseHead
from utils.tasks.segment.head_end_to_end import EndToEndSegmentHead
from utils.weights.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint, save_checkpoint
from utils.weights.release_reader import Record, read_records
from utils.weights.ultralytics_reader import ULTRALYTICS_SOURCE, convert_records

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ultralytics"
RELATIVE = 1e-4  # of each output part's scale (its largest magnitude in the reference)
POSE = {"yolov8n-pose": (AnchorFreePoseHead, "yolov8"), "yolo11n-pose": (AnchorFreePoseHead, "yolo11"),
        "yolo26n-pose": (EndToEndPoseHead, "yolo26")}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def reference_rows(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Our rows in the form the fixtures hold, (b, n, 4 + nc + extra) over every cell, and a segmenter's prototypes:
    the eval output of an anchor-free head; for YOLO26's end-to-end heads the one-to-many decode (xywh), which is
    what ultralytics 8.4.190 returned in eval mode (tests/fixtures/ultralytics/README.md)."""
    captured = {}
    hook = model.head.register_forward_pre_hook(lambda module, inputs: captured.setdefault("xs", inputs[0]))
    with torch.no_grad():
        out = model(images)
    hook.remove()
    protos = out[1] if isinstance(out, tuple) else None
    if hasattr(model.head, "decode_one2many"):
        with torch.no_grad():
            return model.head.decode_one2many(captured["xs"]), protos
    return out, protos


def assert_matches(model: torch.nn.Module, data: dict, parts: tuple[slice, ...]) -> None:
    expected = torch.from_numpy(data["output"]).transpose(1, 2)  # (b, columns, n) -> (b, n, columns)
    rows, protos = reference_rows(model, torch.from_numpy(data["input"]))
    assert rows.shape == expected.shape
    for part in parts:
        scale = expected[..., part].abs().max()
        assert (rows[..., part] - expected[..., part]).abs().max() / scale < RELATIVE, part
    if "protos" in data:
        reference = torch.from_numpy(data["protos"])
        assert protos.shape == reference.shape
        assert (protos - reference).abs().max() / reference.abs().max() < RELATIVE


@pytest.mark.parametrize("name", list(POSE))
def test_pose_files_load_and_match_their_outputs(name: str, tmp_path: Path) -> None:
    """Boxes, the class score, and 17 keypoints (x, y in pixels, visibility after sigmoid) each within 1e-4 of the
    reference's scale, unfused and fused; the checkpoint records the task and rebuilds after a save."""
    ckpt = load_checkpoint(FIXTURES / f"{name}.pt")  # no trusted=True: the restricted reader is used
    head_class, family = POSE[name]
    assert (ckpt["family"], ckpt["task"], ckpt["source"]) == (family, "pose", ULTRALYTICS_SOURCE)
    assert ckpt["release"]["model_class"] == "ultralytics.nn.tasks.PoseModel" and ckpt["names"] == ["person"]
    assert ckpt["model_yaml"]["kpt_shape"] == [17, 3] and ckpt["model_yaml"]["yaml_file"] == f"{name}.yaml"
    model = model_from_checkpoint(ckpt).eval()
    data = dict(np.load(FIXTURES / f"{name}.npz"))
    assert isinstance(model.head, head_class) and model.head.kpt_shape == [17, 3]
    assert sum(p.numel() for p in model.parameters()) == int(data["params"])
    xy = [slice(5 + i, 5 + i + 2) for i in range(0, 51, 3)]
    visibility = slice(7, None, 3)
    parts = (slice(0, 4), slice(4, 5), *xy, visibility)
    assert_matches(model, data, parts)
    assert_matches(copy.deepcopy(model).fuse(), data, parts)
    again = load_checkpoint(save_checkpoint(ckpt, tmp_path / f"{name}.pt"))  # ours: weights_only
    assert again["task"] == "pose" and model_from_checkpoint(again).head.nk == 51


def test_yolo26_seg_file_loads_and_matches_its_outputs_and_prototypes() -> None:
    ckpt = load_checkpoint(FIXTURES / "yolo26n-seg.pt")
    assert (ckpt["family"], ckpt["task"]) == ("yolo26", "segment")
    assert ckpt["release"]["model_class"] == "ultralytics.nn.tasks.SegmentationModel"
    model = model_from_checkpoint(ckpt).eval()
    assert isinstance(model.head, EndToEndSegmentHead)
    data = dict(np.load(FIXTURES / "yolo26n-seg.npz"))
    assert sum(p.numel() for p in model.parameters()) == int(data["params"]) == 3_126_280
    parts = (slice(0, 4), slice(4, 84), slice(84, None))  # boxes, scores, coefficients
    assert_matches(model, data, parts)
    assert_matches(copy.deepcopy(model).fuse(), data, parts)
    with torch.no_grad():  # the final rows: the one-to-one set, selected
        rows, protos = model(torch.from_numpy(data["input"]))
    assert rows.shape == (2, 300, 6 + 32) and protos.shape == (2, 32, 48, 48)


def test_every_tensor_of_a_pose_file_is_used() -> None:
    raw = read_records(FIXTURES / "yolo26n-pose.pt")
    ckpt = convert_records(raw)
    state = ckpt["model"]
    assert {"model.23.flow_model.mask", "model.23.one2one_cv4_sigma.2.bias", "model.23.cv4_kpts.0.weight"} <= set(state)
    assert torch.equal(state["model.23.flow_model.mask"], torch.tensor([[0.0, 1.0], [1.0, 0.0]] * 3))


def _head(raw: dict) -> Record:
    return raw["model"].attrs["_modules"]["model"].attrs["_modules"]["23"]


def _set_head(name: str, value: object):
    def edit(raw: dict) -> None:
        _head(raw).attrs[name] = value
    return edit


def _yaml(key: str, value: object):
    def edit(raw: dict) -> None:
        raw["model"].attrs["yaml"][key] = value
    return edit


REFUSALS = {
    "keypoint count": (_yaml("kpt_shape", [16, 3]), "tensor model.23.cv4.0.0.conv.weight is (85, 64, 3, 3) in the file "
                                                    "but (80, 64, 3, 3)"),
    "keypoint shape setting": (_set_head("kpt_shape", [17, 2]), "kpt_shape is [17, 2] in the file but [17, 3]"),
    "no kpt_shape": (_yaml("kpt_shape", None), "kpt_shape must be [keypoints, 2 or 3]"),
    "not end-to-end": (_yaml("end2end", False), "Pose26 is the end-to-end head of YOLO26"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_pose_file_that_does_not_map_is_refused_in_one_line(case: str) -> None:
    raw = copy_records(read_records(FIXTURES / "yolo26n-pose.pt"))
    mutate, expected = REFUSALS[case]
    mutate(raw)
    with pytest.raises(CheckpointError) as info:
        convert_records(raw, "yolo26n-pose.pt")
    message = str(info.value)
    assert "\n" not in message and message.startswith("yolo26n-pose.pt: ") and expected in message, message


def test_fuzzed_pose_and_segment26_records_load_or_are_refused_in_one_line() -> None:
    """Random damage to the pose and YOLO26-seg files' records (settings, tensors, children, YAML values and rows,
    kpt_shape among them): each case converts into a model that runs or is refused with one CheckpointError line."""
    names = ["yolov8n-pose", "yolo26n-pose", "yolo26n-seg"]
    originals = {name: read_records(FIXTURES / f"{name}.pt") for name in names}
    rng = random.Random(20261207)
    loaded = refused = 0
    for case in range(15):
        raw = copy_records(originals[names[case % 3]])
        if case % 5 == 0:
            raw["model"].attrs["yaml"]["kpt_shape"] = rng.choice([[17, 2], [3000, 3], "x", None, [17, 3, 1]])
        else:
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
    print(f"fuzzed pose/seg26 records: {loaded} loaded, {refused} refused")
    assert refused > 5, (loaded, refused)
