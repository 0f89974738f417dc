"""A fine-tune from ultralytics' release file yolo26n.pt (tests/fixtures/ultralytics, read by the restricted reader,
never unpickled) through train.py (--weights, --freeze 10), test.py, detect.py and every export format, float and
INT8 ONNX, each verified by export.py: YOLO26's end-to-end head (final rows, no NMS) through the whole chain, NCNN
included (its graph ends at the raw one-to-one rows, decoded and selected at load time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import detect
import export
import test as test_script
import train
from utils.deploy.formats import FLOAT_TOLERANCE, MAX_INT8_MAP_DROP, export_format_names
from utils.deploy.runtime import InferenceModel
from utils.deploy.verify import output_errors
from utils.tasks.contract import OutputContract
from utils.weights.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "tests" / "fixtures" / "ultralytics" / "yolo26n.pt"
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def finetuned(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> train.TrainResult:
    """yolo26n.pt fine-tuned 1 epoch on the tiny 3-class set, its backbone (layers 0-9) frozen."""
    from utils.log import LOGGER

    project = tmp_path_factory.mktemp("finetune")
    handlers, level = list(LOGGER.handlers), LOGGER.level
    result = train.main(train.parse_opt([
        "--weights", str(RELEASE), "--data", str(tiny_dataset), "--img", "64", "--batch-size", "8", "--epochs", "1",
        "--device", "cpu", "--workers", "0", "--project", str(project), "--name", "exp", "--freeze", "10",
        "--noplots", "--loggers", "csv"]))
    LOGGER.handlers[:], LOGGER.level = handlers, level
    return result


def export_one(weights: Path, *flags: str) -> export.ExportResult:
    (result,) = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", *flags]))
    return result


def test_the_finetune_starts_from_the_release_weights_and_keeps_the_frozen_backbone(finetuned) -> None:
    release = load_checkpoint(RELEASE)["model"]
    ckpt = load_checkpoint(finetuned.save_dir / "weights" / "last.pt")
    assert (ckpt["family"], ckpt["task"], ckpt["names"]) == ("yolo26", "detect", ["circle", "square", "triangle"])
    trained = ckpt["train_state"]["states"]["model"]
    weights = [k for k in trained if k.endswith(".weight") and k in release]
    frozen = [k for k in weights if int(k.split(".")[1]) < 10]
    assert frozen and all(torch.equal(trained[k].float(), release[k].float()) for k in frozen)
    head = [k for k in trained if k.startswith("model.23.") and k.endswith(".weight")]  # 80 classes -> 3: new rows
    assert any(k not in release or trained[k].shape != release[k].shape for k in head)
    assert finetuned.hyp["optimizer"] == "AdamW" and finetuned.hyp["lr0"] == 0.001429  # what the run used


def test_test_py_and_detect_py_run_the_finetuned_end_to_end_model(finetuned, tiny_dataset) -> None:
    weights = finetuned.save_dir / "weights" / "last.pt"
    result = test_script.run(weights=weights, data=tiny_dataset, img=64, batch_size=8, device="cpu", workers=0,
                             project=finetuned.save_dir, name="val")
    assert result.seen == 12 and result.map == pytest.approx(finetuned.metrics["mAP_0.5:0.95"], abs=1e-6)
    images = tiny_dataset.parent / "synthetic" / "images" / "val"
    found = detect.run(weights=weights, source=images, img=64, conf_thres=0.0, max_det=20, device="cpu",
                       project=finetuned.save_dir, name="detect")
    assert len(found.detections) == 12 and all(d.shape == (20, 6) for _, d in found.detections)  # final rows: k = 20
    with pytest.raises(detect.DetectError, match="--augment merges three passes before NMS"):
        detect.run(weights=weights, source=images, img=64, augment=True, device="cpu", nosave=True)


@pytest.mark.parametrize("name", [n for n in export_format_names() if n != "ncnn"])  # ncnn: the test below
def test_every_format_exports_and_verifies(name: str, finetuned) -> None:
    """One format per test (a failure names it), each from the same fine-tuned last.pt, verified by export.py:
    float formats against PyTorch, Core ML read back (no runtime on Linux)."""
    result = export_one(finetuned.save_dir / "weights" / "last.pt", "--include", name)
    assert result.error is None and result.file.exists() and result.verification is not None


def test_int8_onnx_is_calibrated_and_verified_by_map(finetuned, tiny_dataset) -> None:
    """INT8 ONNX within the stated mAP drop (INT8 TFLite of the new families: tests/utils/deploy/
    test_tf_graph_families.py)."""
    result = export_one(finetuned.save_dir / "weights" / "last.pt", "--include", "onnx", "--int8", "--data",
                        str(tiny_dataset), "--calib-images", "8", "--verify-images", "8")
    check = result.verification
    assert result.error is None and result.file.name == "last-int8.onnx"
    assert check.map_reference - check.map_export <= MAX_INT8_MAP_DROP


def test_ncnn_of_the_end_to_end_head_gives_the_pt_rows_in_detect_py(finetuned, tiny_dataset) -> None:
    """pnnx cannot convert YOLO26's top-k: the NCNN graph ends at the one-to-one rows and the runtime selects."""
    weights = finetuned.save_dir / "weights" / "last.pt"
    result = export_one(weights, "--include", "ncnn")
    folder = result.file
    assert result.error is None
    assert folder == weights.with_name("last_ncnn_model") and result.verification is not None  # within tolerance
    images = torch.rand(2, 3, 64, 64)
    reference, output = InferenceModel(weights)(images), InferenceModel(folder)(images)
    assert output.shape == reference.shape == (2, 8 * 8 + 4 * 4 + 2 * 2, 6)  # every cell of 64 px, best first
    box_px, score = output_errors(reference, output, OutputContract("xyxy_score_cls", 3))
    assert box_px / 64 <= FLOAT_TOLERANCE.box and score <= FLOAT_TOLERANCE.score
    found = detect.run(weights=folder, source=tiny_dataset.parent / "synthetic" / "images" / "val", img=64,
                       conf_thres=0.0, max_det=20, device="cpu", nosave=True)
    assert len(found.detections) == 12 and all(d.shape == (20, 6) for _, d in found.detections)
