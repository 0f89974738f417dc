"""Exports of a trained model (not only an untrained one): float formats within their stated tolerance of the .pt
on real letterboxed scenes, --int8 ONNX and OpenVINO within the stated mAP drop, each run in test.py and hubconf."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import export
from utils.deploy.formats import FLOAT_TOLERANCE, MAX_INT8_MAP_DROP, get_format
from utils.deploy.runtime import InferenceModel
from utils.deploy.verify import output_errors

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tiny_cfg_file: Path, tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tiny model trained 2 epochs on the tiny synthetic set (weights and scores moved by training)."""
    import train
    from utils.log import LOGGER

    project = tmp_path_factory.mktemp("trained")
    handlers, level = list(LOGGER.handlers), LOGGER.level
    opt = train.parse_opt(["--cfg", str(tiny_cfg_file), "--data", str(tiny_dataset), "--img", "64", "--batch-size",
                           "8", "--epochs", "2", "--device", "cpu", "--workers", "0", "--project", str(project),
                           "--name", "exp", "--noval", "--noplots", "--noautoanchor"])
    train.main(opt)
    LOGGER.handlers[:], LOGGER.level = handlers, level
    yield project / "exp" / "weights" / "last.pt"


@pytest.fixture(scope="module")
def float_onnx(trained: Path) -> export.ExportResult:
    """The trained model as a float ONNX file (verified by export.py)."""
    return export.main(export.parse_opt(["--weights", str(trained), "--img-size", "64", "--include", "onnx"]))[0]


@pytest.fixture(scope="module")
def int8_exports(trained: Path, tiny_dataset: Path) -> list[export.ExportResult]:
    """The trained model as INT8 ONNX and OpenVINO, calibrated and verified on the tiny set."""
    return export.main(export.parse_opt(["--weights", str(trained), "--img-size", "64", "--include", "onnx",
                                         "openvino", "--int8", "--data", str(tiny_dataset), "--calib-images", "16",
                                         "--verify-images", "12"]))


def scenes(shape: tuple[int, int], batch: int) -> torch.Tensor:
    from utils.data.sources import network_input
    from utils.data.synthetic import draw_sample, make_spec

    rng = np.random.default_rng(3)
    rows = [torch.from_numpy(network_input(draw_sample(rng, make_spec(img_size=(64, 96)))[0], shape, 32,
                                             auto=False)[0]) for _ in range(batch)]
    return torch.stack(rows).float() / 255


def test_float_onnx_of_a_trained_model_is_within_the_stated_tolerance(float_onnx, trained: Path) -> None:
    result = float_onnx
    assert result.error is None and result.file == trained.with_suffix(".onnx")
    images = scenes((64, 64), 4)
    reference, output = InferenceModel(trained)(images), InferenceModel(result.file)(images)
    box_px, score = output_errors(reference, output)
    assert box_px / 64 <= FLOAT_TOLERANCE.box and score <= FLOAT_TOLERANCE.score
    assert reference[..., :4].abs().max() > 32  # boxes in pixels: why their limit scales with the image size


@pytest.mark.slow
def test_int8_onnx_and_openvino_within_the_map_drop(int8_exports, trained: Path) -> None:
    onnx_result, openvino_result = int8_exports
    assert onnx_result.file == trained.with_name("last-int8.onnx")
    assert openvino_result.file == trained.with_name("last-int8_openvino_model")
    for result in (onnx_result, openvino_result):
        check = result.verification
        assert result.error is None and check.map_reference - check.map_export <= MAX_INT8_MAP_DROP
    import onnx

    ops = {node.op_type for node in onnx.load(str(onnx_result.file)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops  # really quantized
    precisions = openvino_conv_precisions(next(openvino_result.file.glob("*.xml")))
    assert precisions is None or (precisions and set(precisions) <= {"i8", "u8"})
    inference = InferenceModel(onnx_result.file)
    assert inference.names == InferenceModel(trained).names and inference.img_size == (64, 64)


def openvino_conv_precisions(xml: Path) -> list[str] | None:
    """The precisions OpenVINO's CPU plugin runs the IR's convolutions in, compiled as InferenceModel compiles it
    (the f32 hint leaves INT8 layers INT8); None where the CPU plugin reports no INT8 support. Which 8-bit kind it
    picks (u8 or i8) is the plugin's choice for this CPU, so callers assert only that it is 8-bit."""
    import openvino

    core = openvino.Core()
    if "INT8" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return None
    compiled = core.compile_model(core.read_model(str(xml)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    infos = [op.get_rt_info() for op in compiled.get_runtime_model().get_ops()]
    return [i["runtimePrecision"].astype(str) for i in infos if i["layerType"].astype(str) == "Convolution"]


def fake_quantized(node) -> bool:
    """Whether a node's output is 8-bit data in the IR: a FakeQuantize, or a Concat/MaxPool of such outputs."""
    if node.get_type_name() == "FakeQuantize":
        return True
    if node.get_type_name() in ("Concat", "MaxPool"):
        return all(fake_quantized(i.get_source_output().get_node()) for i in node.inputs())
    return False


def int8_weights(node) -> bool:
    """Whether a convolution's weights are stored as int8 constants, dequantized in float (Constant i8 -> Convert
    -> [Subtract] -> Multiply)."""
    while node.get_type_name() in ("Multiply", "Subtract", "Convert"):
        node = node.input(0).get_source_output().get_node()
    return node.get_type_name() == "Constant" and node.get_output_element_type(0).get_type_name() == "i8"


def zero_point(fake_quantize) -> float:
    """The grid index (0..levels-1) of the value 0 of a FakeQuantize's input range: 0 for an unsigned range, 128
    of 256 levels for a symmetric signed one; anything else is an asymmetric zero point."""
    low, high = (float(np.asarray(fake_quantize.input(i).get_source_output().get_node().get_data()).ravel()[0])
                 for i in (1, 2))
    return -low / (high - low) * (fake_quantize.get_attributes()["levels"] - 1)


@pytest.mark.slow
def test_int8_openvino_is_symmetric_int8_with_the_head_decoding_left_float(int8_exports) -> None:
    """What the IR file holds, whatever the CPU: int8 weights, 8-bit symmetric activations into every convolution,
    and no 8-bit step in the head's decoding. What the runtime does with it depends on the CPU (an AVX-512 BF16
    EPYC runs every layer in u8): asserted only as far as the plugin's reported INT8 support implies it."""
    openvino = pytest.importorskip("openvino")
    xml = next(int8_exports[1].file.glob("*.xml"))
    model = openvino.Core().read_model(str(xml))
    ops = model.get_ordered_ops()
    convs = [op for op in ops if op.get_type_name() == "Convolution"]
    head = convs[-1].get_friendly_name().split("/")[1]  # '/model.N/m.2/Conv...': the Detect head's module
    assert convs and all(int8_weights(c.input(1).get_source_output().get_node()) for c in convs)
    assert all(fake_quantized(c.input(0).get_source_output().get_node()) for c in convs)
    fake_quantizes = [op for op in ops if op.get_type_name() == "FakeQuantize"]
    assert {fq.get_attributes()["levels"] for fq in fake_quantizes} == {256}
    points = [zero_point(fq) for fq in fake_quantizes]
    assert all(min(abs(p), abs(p - 128)) < 1e-3 for p in points)  # symmetric (or unsigned): no other zero point
    assert any(abs(p - 128) < 1e-3 for p in points) and abs(zero_point(fake_quantizes[0])) < 1e-3  # image: u8
    quantized = [target.get_node() for fq in fake_quantizes for target in fq.output(0).get_target_inputs()]
    into_head = [n.get_friendly_name() for n in quantized
                 if n.get_friendly_name().startswith(f"/{head}/") and n.get_type_name() != "Convolution"]
    assert not into_head  # the box decoding (sigmoid, grid, anchors, strides) gets no 8-bit step
    decode = [op for op in ops if op.get_friendly_name().startswith(f"/{head}/") and
              op.get_type_name() in ("Sigmoid", "Power", "Multiply", "Add", "Subtract")]
    assert decode and all(op.get_output_element_type(0).get_type_name() == "f32" for op in decode)
    precisions = openvino_conv_precisions(xml)
    assert precisions is None or (len(precisions) == len(convs) and set(precisions) <= {"i8", "u8"})


@pytest.mark.slow
def test_int8_verification_can_fail(trained: Path, tiny_dataset: Path, tmp_path: Path, monkeypatch) -> None:
    local = tmp_path / "strict.pt"
    shutil.copyfile(trained, local)
    monkeypatch.setattr("utils.deploy.verify.MAX_INT8_MAP_DROP", -1.0)  # no drop is small enough
    with pytest.raises(export.ExportError, match="onnx export failed .*INT8 mAP@.5:.95"):
        export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "onnx", "--int8",
                                      "--data", str(tiny_dataset), "--calib-images", "8", "--verify-images", "4"]))


def test_a_float_export_runs_in_test_py_and_hubconf(float_onnx, trained: Path, tiny_dataset: Path,
                                                   tmp_path: Path) -> None:
    import hubconf

    maps = evaluate_files([trained, float_onnx.file], tiny_dataset, tmp_path)
    assert abs(maps["last.onnx"] - maps["last.pt"]) < 1e-3
    image = (scenes((64, 64), 1)[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8)
    pt, onnx_model = hubconf.custom(trained), hubconf.custom(float_onnx.file)
    assert onnx_model.names == pt.names and onnx_model.stride == 32
    pt.conf = 0.001
    best = float(pt(image, size=64).scores().max())
    # an early model's low scores come in groups 1e-8 apart, where rounding decides which box NMS keeps: compare
    # the boxes within a factor of two of the best score (distinct scores: the same NMS outcome)
    pt.conf = onnx_model.conf = best / 2
    boxes_pt, boxes_onnx = pt(image, size=64).boxes(), onnx_model(image, size=64).boxes()
    assert len(boxes_pt) > 0 and boxes_pt.shape == boxes_onnx.shape
    distances = torch.cdist(boxes_onnx, boxes_pt)  # NMS may order near-equal scores differently
    assert max(distances.min(1).values.max(), distances.min(0).values.max()) < 64 * FLOAT_TOLERANCE.box * 10


@pytest.mark.slow
def test_int8_exports_run_in_test_py(int8_exports, trained: Path, tiny_dataset: Path, tmp_path: Path) -> None:
    maps = evaluate_files([trained, *(r.file for r in int8_exports)], tiny_dataset, tmp_path)
    assert all(maps["last.pt"] - maps[r.file.name] <= MAX_INT8_MAP_DROP for r in int8_exports)
    assert get_format("onnx").matches(int8_exports[0].file) and get_format("openvino").matches(int8_exports[1].file)


def evaluate_files(files: list[Path], data: Path, project: Path) -> dict[str, float]:
    """mAP@.5:.95 of each file by test.py."""
    from tests.helpers import load_script

    test_script = load_script("test")
    maps = {}
    for file in files:
        opt = test_script.parse_opt(["--weights", str(file), "--data", str(data), "--img", "64", "--batch-size", "1",
                                     "--workers", "0", "--project", str(project)])
        maps[file.name] = test_script.main(opt).map
    return maps


@pytest.mark.slow
def test_int8_tflite_is_integer_within_the_map_drop_and_runs_in_test_py(trained: Path, tiny_dataset: Path,
                                                                         tmp_path: Path) -> None:
    from utils.deploy.formats import missing_packages

    if missing_packages((("tensorflow", "tensorflow-cpu"), ("ai_edge_litert", "ai-edge-litert"))):
        pytest.skip("pip install -r requirements-export.txt")
    result = export.main(export.parse_opt(["--weights", str(trained), "--img-size", "64", "--include", "tflite",
                                           "--int8", "--data", str(tiny_dataset), "--calib-images", "16",
                                           "--verify-images", "12"]))[0]
    check = result.verification
    assert result.file == trained.with_name("last-int8.tflite")
    assert check.map_reference - check.map_export <= MAX_INT8_MAP_DROP
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(str(result.file))
    ends = {d["index"] for d in interpreter.get_input_details() + interpreter.get_output_details()}
    floats = {d["index"] for d in interpreter.get_tensor_details() if d["dtype"] == np.float32}
    assert floats == ends and len(ends) == 4  # full integer: float only at the input and the head's 3 maps
    assert interpreter.get_input_details()[0]["dtype"] == np.float32  # callers feed the float file's input
    inference = InferenceModel(result.file)
    assert inference.names == InferenceModel(trained).names and inference.img_size == (64, 64)
    images = scenes((64, 64), 2)
    box_px, score = output_errors(InferenceModel(trained)(images), inference(images))
    assert box_px < 64 * 0.1 and score < 0.05  # measured 2.9 px and 0.002: follows the float model closely
    assert torch.allclose(inference(images[:1]), decoded_by_head(result.file, images[:1]), atol=1e-4)
    maps = evaluate_files([result.file], tiny_dataset, tmp_path)
    assert abs(maps["last-int8.tflite"] - check.map_export) < 0.02  # test.py's own mAP on all 12 images


def decoded_by_head(file: Path, images: torch.Tensor) -> torch.Tensor:
    """The INT8 TFLite file's three raw maps for one image, decoded by the Detect head's plain decode()."""
    from ai_edge_litert.interpreter import Interpreter

    from utils.deploy.head_maps import head_from_metadata
    from utils.deploy.tf_graph import nhwc_array
    from utils.deploy.tflite import read_metadata

    interpreter = Interpreter(str(file))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], nhwc_array(images))
    interpreter.invoke()
    head = head_from_metadata(read_metadata(file.read_bytes()))
    maps = [torch.from_numpy(interpreter.get_tensor(d["index"]).copy()) for d in interpreter.get_output_details()]
    maps.sort(key=lambda x: -x.numel())  # P3 first
    return head.decode([x.view(1, x.shape[1], x.shape[2], head.na, head.no).permute(0, 3, 1, 2, 4) for x in maps])
