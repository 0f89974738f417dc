"""SavedModel and TFLite: our own TensorFlow translation gives the .pt's boxes, the files carry their metadata, and
detect.py, test.py and hubconf run them without --data; bad files and untranslated layers are one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import export
from tests.helpers import load_script
from utils.cli import run_main
from utils.deploy.formats import FLOAT_TOLERANCE, HALF_TOLERANCE, FormatError, missing_packages
from utils.deploy.runtime import InferenceModel
from utils.deploy.verify import output_errors
from utils.errors import UserError
from utils.weights.checkpoint import load_model

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),  # not importorskip: tensorflow must load after triton
              pytest.mark.skipif(missing_packages((("tensorflow", "tensorflow-cpu"), ("ai_edge_litert", "x"))) != [],
                                 reason="pip install -r requirements-export.txt")]
NAMES = ["circle", "square", "triangle"]
IMAGES = Path(__file__).resolve().parents[3] / "data" / "images"


@pytest.fixture(scope="module")
def tf_exports(tiny_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> list[export.ExportResult]:
    """The tiny model as best_saved_model/ and best.tflite, written and verified by export.py in one run."""
    weights = tmp_path_factory.mktemp("tf") / "best.pt"
    shutil.copyfile(tiny_weights, weights)
    return export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "saved_model",
                                         "tflite"]))


def scenes(batch: int) -> torch.Tensor:
    from utils.data.sources import network_input
    from utils.data.synthetic import draw_sample, make_spec

    rng = np.random.default_rng(5)
    rows = [torch.from_numpy(network_input(draw_sample(rng, make_spec(img_size=(48, 64)))[0], (64, 64), 32,
                                             auto=False)[0]) for _ in range(batch)]
    return torch.stack(rows).float() / 255


def pytorch_output(weights: Path, images: torch.Tensor) -> torch.Tensor:
    model, _ = load_model(weights)
    with torch.no_grad():
        return model(images)


@pytest.mark.slow
def test_float_files_give_the_pt_boxes_and_carry_their_metadata(tf_exports) -> None:
    from utils.deploy.tflite import read_metadata

    saved, lite = tf_exports
    weights = lite.file.with_name("best.pt")
    assert (saved.file, lite.file) == (weights.with_name("best_saved_model"), weights.with_suffix(".tflite"))
    assert all(r.error is None and r.verification.box_error <= FLOAT_TOLERANCE.box for r in tf_exports)
    meta = json.loads((saved.file / "assets" / "metadata.json").read_text())  # a saved asset of the SavedModel
    embedded = read_metadata(lite.file.read_bytes())  # the flatbuffer's own metadata table
    for found in (meta, embedded):
        assert (found["stride"], found["names"], found["img_size"], found["strides"]) == (32, NAMES, [64, 64],
                                                                                          [8.0, 16.0, 32.0])
    images = scenes(3)  # a batch-1 export: three calls
    reference = pytorch_output(weights, images)
    for result in tf_exports:
        model = InferenceModel(result.file, trusted=True)  # a SavedModel's graph may hold file I/O: trusted only
        assert (model.kind, model.names, model.stride, model.img_size, model.batch_size) == (
            result.format, NAMES, 32, (64, 64), 1)
        box_px, score = output_errors(reference, model(images))
        assert box_px / 64 <= FLOAT_TOLERANCE.box and score <= FLOAT_TOLERANCE.score, result.format
    assert reference[..., :4].abs().max() > 8  # boxes in pixels: not a comparison of near-zero values


def test_a_saved_model_given_by_a_relative_path_reads(tf_exports, monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorFlow gives the metadata asset's path as the folder was named (from the working directory), not from
    the folder: a relative path, as users type it, reads as an absolute one does."""
    saved = tf_exports[0].file
    monkeypatch.chdir(saved.parent.parent)
    model = InferenceModel(Path(saved.parent.name) / saved.name, trusted=True)
    assert (model.names, model.stride, model.img_size) == (NAMES, 32, (64, 64))


@pytest.mark.slow
def test_detect_test_and_hubconf_run_the_files_without_data(tf_exports, tiny_dataset: Path, tmp_path: Path,
                                                            capsys) -> None:
    import hubconf

    detect, test_script = load_script("detect"), load_script("test")
    saved, lite = tf_exports
    weights = lite.file.with_name("best.pt")
    for result in tf_exports:
        detect.main(detect.parse_opt(["--weights", str(result.file), "--source", str(IMAGES), "--trust-weights",
                                      "--img-size", "64", "--conf-thres", "0.001", "--project", str(tmp_path)]))
        out = capsys.readouterr().out
        assert "64x64" in out and any(name in out for name in ("circle", "square", "triangle")), result.format
    maps = {}
    for file in (weights, saved.file, lite.file):
        opt = test_script.parse_opt(["--weights", str(file), "--data", str(tiny_dataset), "--img", "64",
                                     "--batch-size", "2", "--workers", "0", "--project", str(tmp_path),
                                     "--trust-weights"])
        maps[file.name] = test_script.main(opt).map
    assert abs(maps["best_saved_model"] - maps["best.pt"]) < 1e-3 and abs(maps["best.tflite"] - maps["best.pt"]) < 1e-3
    detector = hubconf.custom(lite.file)
    assert detector.names == NAMES and detector.stride == 32


def test_bad_files_are_one_line_errors(tmp_path: Path, capsys) -> None:
    garbled = tmp_path / "garbled.tflite"
    garbled.write_bytes(b"TFL3" + bytes(range(256)) * 4)
    empty_folder = tmp_path / "x_saved_model"
    empty_folder.mkdir()
    for file, expected, trusted in ((garbled, "is not a readable TFLite model", False),
                                    (empty_folder, "is not a readable SavedModel of this project", True)):
        with pytest.raises(FormatError, match=expected):
            InferenceModel(file, trusted=trusted)
    with pytest.raises(UserError, match="TensorFlow SavedModel, and running one runs its graph"):
        InferenceModel(empty_folder)  # its ops may write files: --trust-weights only
    detect = load_script("detect")
    code = run_main(detect.main, detect.parse_opt(["--weights", str(garbled), "--source", str(IMAGES)]), "detect")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("detect: error: ") and err.count("\n") == 1, err


def test_a_layer_without_translation_is_refused_naming_it(tiny_weights: Path, tmp_path: Path, capsys) -> None:
    from utils.deploy.tf_graph import import_tensorflow, translate_model

    model, _ = load_model(tiny_weights, fuse=True)
    gelu = nn.GELU()
    gelu.f, gelu.i = -1, 1
    model.model[1] = gelu
    with pytest.raises(FormatError, match="no translation for layer GELU"):
        translate_model(import_tensorflow(), model)
    model.model[0].act = nn.ReLU()
    with pytest.raises(FormatError, match="no translation for activation ReLU"):
        translate_model(import_tensorflow(), model)
    with pytest.raises(UserError, match="--include saved_model does not support --int8"):
        export.main(export.parse_opt(["--weights", str(tiny_weights), "--include", "saved_model", "--int8",
                                      "--data", "d.yaml"]))
    with pytest.raises(UserError, match="--half exports FP16 on CUDA only"):  # TFLite's --half alone needs none
        export.main(export.parse_opt(["--weights", str(tiny_weights), "--include", "tflite", "onnx", "--half"]))


@pytest.mark.slow
def test_half_tflite_has_float16_weights_within_the_half_tolerance(tiny_weights: Path, tmp_path: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    weights = tmp_path / "h.pt"
    shutil.copyfile(tiny_weights, weights)
    result = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "tflite",
                                           "--half"]))[0]
    assert result.file == tmp_path / "h-fp16.tflite" and result.verification.box_error <= HALF_TOLERANCE.box
    types = {d["dtype"] for d in Interpreter(str(result.file)).get_tensor_details()}
    assert np.float16 in types  # the weights are stored as float16
    model = InferenceModel(result.file)
    assert model.names == NAMES and model.dtype == torch.float32  # float32 in, float32 out
    images = scenes(1)
    box_px, score = output_errors(pytorch_output(weights, images), model(images))
    assert box_px / 64 <= HALF_TOLERANCE.box and score <= HALF_TOLERANCE.score
