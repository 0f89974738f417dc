"""Every export of a trained segmenter validates within 0.005 mask mAP@.5 of the .pt (issue 33).

yolov5n-seg is trained from scratch in this process until its masks score clearly above 0: 100 epochs on the 8
images it is then validated on (64 px, no augmentation, one optimizer step an epoch). Its TorchScript, ONNX and
OpenVINO exports, dynamic and static, then run through test.py like the .pt:

- a dynamic export is validated as the .pt is (rectangular batches, padded by half a stride), so test.py's box and
  mask figures must equal the .pt's within 0.005;
- a static export runs square at its one size; the .pt is measured on the same square inputs with the same
  thresholds by the export checks' own pass (utils.deploy.verify.evaluate_on_data), and test.py's figures of the
  export must equal those within 0.005;
- benchmarks/bench_export.py gives the .pt's and each export's mask mAP@.5 beside the box figures, read from the
  split's outlines, with each export's difference from the .pt.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import export
import test as test_script
from tests.helpers import ROOT, one_thread_and_logger_kept
from utils.deploy import formats
from utils.evaluation.evaluate import EvalResult

pytestmark = pytest.mark.usefixtures("one_thread_and_clean_logger")

FORMATS = ["torchscript", "onnx", "openvino"]
MAX_DIFF = 0.005  # the bound on an export's mAP@.5 against the .pt's
MIN_MASK_MAP50 = 0.3  # the trained .pt's mask mAP@.5 (0.69-0.93 over seeds 0-2): the comparison means something


def overfit_data(folder: Path) -> Path:
    """The synthetic set with outlines, 8 images of 64 px and 1-2 objects, trained and validated on alike; and a
    hyp file without augmentation (the model must learn these very images in a few seconds)."""
    from utils.data.synthetic import SYNTHETIC_NAMES

    folder.mkdir(parents=True, exist_ok=True)
    spec = {"task": "segment", "n_train": 1, "n_val": 8, "img_size": [64, 64], "max_objects": 2}
    (folder / "seg.yaml").write_text(yaml.safe_dump({"synthetic": spec, "path": str(folder / "set"),
                                                     "train": "images/val", "val": "images/val",
                                                     "nc": len(SYNTHETIC_NAMES), "names": list(SYNTHETIC_NAMES)}))
    hyp = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.synthetic.yaml").read_text())
    hyp.update(lr0=0.01, warmup_epochs=0, hsv_h=0, hsv_s=0, hsv_v=0, translate=0, scale=0, fliplr=0, mosaic=0)
    (folder / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    return folder / "seg.yaml"


@pytest.fixture(scope="module")
def trained_segmenter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(weights, data YAML): yolov5n-seg trained 100 epochs; batch 64 holds the 8 images, so no accumulation."""
    import train

    tmp_path = tmp_path_factory.mktemp("trained-seg")
    data = overfit_data(tmp_path / "data")
    with one_thread_and_logger_kept():
        result = train.run(data=str(data), cfg="yolov5n-seg.yaml", hyp=str(data.parent / "hyp.yaml"), weights="",
                           img_size=64, batch_size=64, epochs=100, workers=0, device="cpu", amp="off", seed=0,
                           project=str(tmp_path / "runs"), name="seg", noautoanchor=True, noplots=True,
                           noval=True, nosave=True)
    weights = tmp_path / "exports" / "seg.pt"
    weights.parent.mkdir()
    shutil.copyfile(result.save_dir / "weights" / "last.pt", weights)
    return weights, data


def figures(result: EvalResult) -> dict[str, float]:
    """Box and mask mAP@.5 and mAP@.5:.95 of one validation."""
    assert result.mask is not None
    mask = result.mask.mean_results()
    return {"box mAP@.5": result.map50, "box mAP@.5:.95": result.map, "mask mAP@.5": float(mask[2]),
            "mask mAP@.5:.95": float(mask[3])}


def validate(weights: Path, data: Path, project: Path) -> dict[str, float]:
    """test.py on ``weights`` (its Python entry), as a user runs it on an exported file."""
    result = test_script.run(weights=str(weights), data=str(data), img_size=64, batch_size=8, workers=0,
                             device="cpu", project=str(project), name=weights.name, trust_weights=True)
    assert result.seen == 8
    return figures(result)


def assert_within(found: dict[str, float], reference: dict[str, float], label: str) -> None:
    far = {k: (found[k], reference[k]) for k in reference if abs(found[k] - reference[k]) > MAX_DIFF}
    assert not far, f"{label}: (export, .pt) differ by more than {MAX_DIFF}: {far}"


def export_all(weights: Path, formats: list[str], *flags: str) -> list[Path]:
    results = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", *formats,
                                            *flags]))
    assert [r.format for r in results] == formats and all(r.error is None for r in results), results
    return [r.file for r in results]


def static_reference(weights: Path, data: Path, folder: str) -> tuple[Path, dict[str, float]]:
    """A copy of ``weights`` in ``folder`` beside them (static exports go there), and the .pt's figures on square
    64 px inputs with test.py's thresholds: what a static export must equal."""
    from utils.deploy.formats import ExportOptions
    from utils.deploy.runtime import InferenceModel
    from utils.deploy.verify import evaluate_on_data

    copy = weights.parent / folder / weights.name
    copy.parent.mkdir()
    shutil.copyfile(weights, copy)
    model = InferenceModel(copy, trusted=True)  # its own file
    square = figures(evaluate_on_data(model.as_module(), str(data), ExportOptions(img_size=(64, 64)), model.stride,
                                      model.task))
    assert square["mask mAP@.5"] > MIN_MASK_MAP50, square
    return copy, square


def test_every_export_of_a_trained_segmenter_validates_within_0005_of_the_pt(trained_segmenter: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    weights, data = trained_segmenter
    project = tmp_path / "test"
    reference = validate(weights, data, project)
    assert reference["mask mAP@.5"] > MIN_MASK_MAP50 and reference["box mAP@.5"] > MIN_MASK_MAP50, reference
    for file in export_all(weights, FORMATS, "--dynamic"):
        assert_within(validate(file, data, project), reference, f"dynamic {file.name}")
    static, square = static_reference(weights, data, "static")
    for file in export_all(static, FORMATS):
        assert_within(validate(file, data, project), square, f"static {file.name}")


@pytest.mark.slow
@pytest.mark.skipif(formats.missing_packages((("tensorflow", "x"), ("ai_edge_litert", "x"), ("pnnx", "x"),
                                              ("ncnn", "x"))) != [], reason="pip install -r requirements-export.txt")
def test_the_trained_segmenters_tflite_and_ncnn_files_validate_within_0005_of_the_pt(
        trained_segmenter: tuple[Path, Path], tmp_path: Path) -> None:
    """TFLite (our TensorFlow translation) and NCNN: static files, compared with the .pt on square inputs."""
    weights, data = trained_segmenter
    static, square = static_reference(weights, data, "tflite-ncnn")
    for file in export_all(static, ["tflite", "ncnn"]):
        assert_within(validate(file, data, tmp_path / "test"), square, file.name)


def test_bench_export_gives_a_segmenters_mask_map_beside_the_pts(trained_segmenter: tuple[Path, Path],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_export as bench

    weights, data = trained_segmenter
    rows = bench.main(bench.parse_opt(["--weights", str(weights), "--data", str(data), "--img-size", "64",
                                       "--formats", "onnx", "--runs", "2", "--warmup", "0"]))
    assert [r.name for r in rows] == ["pytorch (.pt)", "onnx"]
    pt, onnx = rows
    assert pt.mask_map50 > MIN_MASK_MAP50 and abs(onnx.mask_map50 - pt.mask_map50) <= MAX_DIFF, rows
    assert abs(onnx.map50 - pt.map50) <= MAX_DIFF
    table = capsys.readouterr().out.split("format ")[-1]
    assert "mask mAP@.5" in table and f"{pt.mask_map50:.4f}  +0.0000" in table
