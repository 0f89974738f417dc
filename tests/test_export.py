"""export.py: files next to the weights, metadata, and parity with PyTorch (static and dynamic shapes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import export
import test as test_script
from utils.cli import run_main
from utils.deploy import formats
from utils.deploy.formats import MAX_INT8_MAP_DROP, ExportOptions, Tolerance
from utils.deploy.onnx import onnx_export_kwargs
from utils.deploy.runtime import InferenceModel
from utils.deploy.verify import output_errors
from utils.errors import UserError
from utils.weights.checkpoint import load_model

NAMES = ["circle", "square", "triangle"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def weights(tiny_weights: Path) -> Path:
    return tiny_weights


def real_images(shape: tuple[int, int], batch: int) -> torch.Tensor:
    """Letterboxed scenes (not noise) as a float batch in [0, 1], every image different."""
    from utils.data.sources import network_input
    from utils.data.synthetic import draw_sample, make_spec

    rng = np.random.default_rng(1)
    spec = make_spec(img_size=(90, 120))
    rows = [torch.from_numpy(network_input(draw_sample(rng, spec)[0], shape, 32, auto=False)[0])
            for _ in range(batch)]
    return torch.stack(rows).float() / 255


def pytorch_output(weights: Path, images: torch.Tensor) -> torch.Tensor:
    model, _ = load_model(weights)
    with torch.no_grad():
        return model(images)


def test_static_export_parity_and_metadata(weights: Path) -> None:
    results = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64"]))
    assert [r.format for r in results] == ["torchscript", "onnx"]
    assert [r.file for r in results] == [weights.with_suffix(".torchscript"), weights.with_suffix(".onnx")]
    assert all(r.error is None and r.verification.box_error < 1e-4 and r.size_mb > 0 for r in results)
    meta = {p.key: json.loads(p.value) for p in onnx.load(str(weights.with_suffix(".onnx"))).metadata_props}
    assert meta["stride"] == 32 and meta["names"] == NAMES and meta["img_size"] == [64, 64]
    images = real_images((64, 64), 1)
    reference = pytorch_output(weights, images)
    with pytest.raises(UserError, match="TorchScript file, and loading one runs the code"):  # --trust-weights
        InferenceModel(weights.with_suffix(".torchscript"))
    with pytest.raises(UserError, match="exported on cpu and runs only there"):
        InferenceModel(weights.with_suffix(".torchscript"), "cuda", trusted=True)
    for result in results:  # an independent check, outside export.py's own verification
        backend = InferenceModel(result.file, trusted=True)
        assert (backend.stride, backend.names, backend.img_size, backend.dynamic) == (32, NAMES, (64, 64), False)
        output = backend(images)
        assert output.shape == reference.shape == (1, 3 * (8 * 8 + 4 * 4 + 2 * 2), 8)
        assert (output - reference).abs().max() < 1e-3
    assert reference[..., :4].abs().max() > 1  # boxes in pixels: the comparison is not of near-zero values


def test_dynamic_export_runs_at_other_sizes(weights: Path, tmp_path: Path) -> None:
    local = tmp_path / "dyn.pt"
    local.write_bytes(weights.read_bytes())
    results = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--dynamic"]))
    assert all(r.error is None for r in results)
    onnx_input = onnx.load(str(local.with_suffix(".onnx"))).graph.input[0]
    assert [d.dim_param or d.dim_value for d in onnx_input.type.tensor_type.shape.dim][1] == 3
    assert all(d.dim_param for i, d in enumerate(onnx_input.type.tensor_type.shape.dim) if i != 1)
    for suffix in (".torchscript", ".onnx"):
        backend = InferenceModel(local.with_suffix(suffix), trusted=True)
        assert backend.dynamic and backend.img_size is None and backend.batch_size is None
        for batch, shape in ((1, (64, 64)), (3, (96, 128))):
            images = real_images(shape, batch)
            reference = pytorch_output(local, images)
            output = backend(images)
            assert output.shape == reference.shape
            assert (output - reference).abs().max() < 1e-3, (suffix, batch, shape)


def test_static_batch_export_runs_any_batch(weights: Path, tmp_path: Path) -> None:
    local = tmp_path / "b2.pt"
    local.write_bytes(weights.read_bytes())
    export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--batch-size", "2",
                                  "--include", "onnx"]))
    backend = InferenceModel(local.with_suffix(".onnx"))
    assert backend.batch_size == 2 and not backend.dynamic
    images = real_images((64, 64), 3)  # one full chunk of 2 and one padded chunk
    assert (backend(images) - pytorch_output(local, images)).abs().max() < 1e-3


def test_failed_export_is_named_and_others_still_run(weights: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    local = tmp_path / "fail.pt"
    local.write_bytes(weights.read_bytes())

    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(formats.get_format("onnx"), "export", broken)
    code = run_main(export.main, export.parse_opt(["--weights", str(local), "--img-size", "64"]), "export")
    captured = capsys.readouterr()
    assert code == 2
    assert local.with_suffix(".torchscript").is_file() and not local.with_suffix(".onnx").exists()
    assert "onnx export failed (RuntimeError: exporter exploded)" in captured.err
    assert "torchscript" not in captured.err.split("error:")[1]


def test_verification_can_fail(weights: Path, tmp_path: Path, monkeypatch) -> None:
    local = tmp_path / "strict.pt"
    local.write_bytes(weights.read_bytes())
    strict = Tolerance(box=-1.0, score=-1.0)  # nothing passes: proves the comparison gates the result
    monkeypatch.setattr(formats.get_format("torchscript"), "tolerance", lambda options: strict)
    with pytest.raises(export.ExportError, match="torchscript export failed .*differs from PyTorch"):
        export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "torchscript"]))


def test_bad_options(weights: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--include tflite does not support --dynamic"):
        export.main(export.parse_opt(["--weights", str(weights), "--include", "tflite", "--dynamic"]))
    with pytest.raises(UserError, match="not found"):
        export.main(export.parse_opt(["--weights", str(tmp_path / "missing.pt")]))
    with pytest.raises(UserError, match="--img-size"):
        export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "64", "64"]))


def test_output_errors_measure_boxes_and_scores_apart() -> None:
    a = torch.zeros(1, 4, 8)
    b = a.clone()
    b[0, 2, 5], b[0, 1, 2] = 0.25, 3.0
    assert output_errors(a, b) == (3.0, 0.25)
    with pytest.raises(RuntimeError, match="shape"):
        output_errors(a, torch.zeros(1, 5, 8))


# ------------------------------------------------------------------------------------ YOLOv5 v7.0 flags
def _error_line(argv: list[str], capsys) -> str:
    code = run_main(export.main, export.parse_opt([str(a) for a in argv]), "export")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("export: error: ") and err.count("\n") == 1, err
    return err


def test_openvino_export_gives_the_pt_boxes(tiny_exports: dict[str, Path]) -> None:
    pytest.importorskip("openvino")
    import yaml

    folder = tiny_exports["openvino"]
    assert folder.name == "dynamic_openvino_model"  # next to dynamic.pt, named as YOLOv5 names it
    assert sorted(p.name for p in folder.iterdir()) == ["dynamic.bin", "dynamic.xml", "dynamic.yaml"]
    meta = yaml.safe_load((folder / "dynamic.yaml").read_text())
    assert meta["stride"] == 32 and meta["names"] == NAMES and meta["strides"] == [8.0, 16.0, 32.0]
    backend = InferenceModel(folder)
    assert backend.kind == "openvino" and backend.dynamic and backend.names == NAMES
    for batch, shape in ((1, (64, 64)), (2, (96, 128))):
        images = real_images(shape, batch)
        reference = pytorch_output(tiny_exports["pt"], images)
        assert (backend(images) - reference).abs().max() < 1e-3
    assert InferenceModel(folder / "dynamic.xml").names == NAMES  # the .xml itself works too


def test_opset_is_applied(weights: Path, tmp_path: Path) -> None:
    local = tmp_path / "op.pt"
    local.write_bytes(weights.read_bytes())
    export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "onnx", "--opset", "13"]))
    assert [o.version for o in onnx.load(str(local.with_suffix(".onnx"))).opset_import if o.domain in ("", "ai.onnx")] \
        == [13]
    assert export.export_options(export.parse_opt([])).opset == 17
    assert export.export_options(export.parse_opt(["--dynamo"])).opset == 18  # the opset its exporter writes
    assert export.export_options(export.parse_opt(["--dynamo", "--opset", "19"])).opset == 19


def test_dynamo_writes_both_head_kinds_and_a_dynamic_file_that_runs_any_batch_and_size(tmp_path: Path) -> None:
    """--dynamo (torch.export's ONNX exporter, opset 18) on YOLOv5 and on an anchor-free model (its strides read
    as the numbers the model's dry run found, not as a buffer's data, which torch.export cannot branch on), with
    --dynamic (exported from a batch of 2: torch.export fixes a dimension it sees at size 1): the file runs at
    batch 1 and 3 and at another size as the .pt does; YOLO26's and every task's files are verified at export."""
    from models.yolo import Model
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    for cfg in ("yolov5n.yaml", "yolo11n.yaml", "yolo26n.yaml", "yolo11n-seg.yaml", "yolo11n-pose.yaml",
                "yolo11n-obb.yaml", "yolo11n-cls.yaml"):
        torch.manual_seed(0)
        model = Model(cfg, nc=len(NAMES))
        model.names = list(NAMES)
        weights = save_checkpoint(new_checkpoint(model), tmp_path / f"{cfg[:-5]}.pt")
        (result,) = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include",
                                                  "onnx", "--dynamo", "--dynamic"]))
        assert result.error is None and result.verification.box_error < 1e-4, cfg
        assert [o.version for o in onnx.load(str(result.file)).opset_import if o.domain in ("", "ai.onnx")] == [18]
        assert sorted(p.name for p in tmp_path.glob(f"{cfg[:-5]}.*")) == [f"{cfg[:-5]}.onnx", f"{cfg[:-5]}.pt"]
        described = result.verification.describe()  # a classifier's rows hold no boxes: no box error is described
        assert described.startswith("max error scores" if "cls" in cfg else "max error boxes"), described
        backend = InferenceModel(result.file)
        assert backend.dynamic, cfg
        if cfg not in ("yolov5n.yaml", "yolo11n.yaml"):
            continue
        for batch, shape in ((1, (64, 64)), (3, (96, 128))):
            images = real_images(shape, batch)
            output, reference = backend(images), pytorch_output(weights, images)
            assert output.shape == reference.shape and (output - reference).abs().max() < 1e-3, (cfg, batch, shape)
    pytest.importorskip("openvino")
    (result,) = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include",
                                              "openvino", "--dynamo"]))  # the ONNX file it converts is gone after
    assert result.error is None and sorted(p.name for p in result.file.iterdir()) == \
        ["yolo11n-cls.bin", "yolo11n-cls.xml", "yolo11n-cls.yaml"]


def test_simplify_shrinks_the_graph_and_keeps_the_output(weights: Path, tiny_exports: dict[str, Path],
                                                         tmp_path: Path) -> None:
    pytest.importorskip("onnxslim")
    local = tmp_path / "slim.pt"
    local.write_bytes(weights.read_bytes())
    results = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "onnx",
                                            "--simplify"]))
    assert results[0].error is None and results[0].verification.score_error < 1e-3  # verified against PyTorch
    simplified, plain = (onnx.load(str(p)) for p in (local.with_suffix(".onnx"), tiny_exports["static_onnx"]))
    assert len(simplified.graph.node) < len(plain.graph.node)
    assert {p.key for p in simplified.metadata_props} >= {"stride", "names", "img_size"}


def test_simplify_without_a_simplifier_says_what_to_install(weights: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(export, "installed_simplifier", lambda: None)
    err = _error_line(["--weights", weights, "--include", "onnx", "--simplify"], capsys)
    assert "--simplify needs onnxslim or onnxsim, which are not installed: pip install onnxslim" in err


def test_torch_without_dynamo_keyword_gets_none(weights: Path, monkeypatch, capsys) -> None:

    torch_2_4 = ("model", "args", "f", "export_params", "verbose", "training", "input_names", "output_names",
                 "operator_export_type", "opset_version", "do_constant_folding", "dynamic_axes",
                 "keep_initializers_as_inputs", "custom_opsets", "export_modules_as_functions", "autograd_inlining")
    opt = ExportOptions(opset=12, verbose=False, dynamic=True, dynamo=False)
    kwargs = onnx_export_kwargs(opt, torch_2_4)
    assert "dynamo" not in kwargs and set(kwargs) <= set(torch_2_4) and kwargs["opset_version"] == 12
    import utils.deploy.onnx

    monkeypatch.setattr(utils.deploy.onnx, "onnx_export_parameters", lambda: torch_2_4)
    assert "--dynamo needs torch 2.5 or newer" in _error_line(["--weights", weights, "--dynamo"], capsys)


@pytest.mark.parametrize("flags, expected", [
    (["--half"], "--half exports FP16 on CUDA only (this export runs on cpu); add --device 0"),
    (["--include", "torchscript", "--simplify"], "--simplify applies to ONNX graphs"),
    (["--int8"], "--int8 calibrates on images and checks mAP on labels of a data set: add --data"),
    (["--include", "torchscript", "--int8", "--data", "d.yaml"], "--include torchscript does not support --int8"),
    (["--keras"], "--keras: applies to YOLOv5's TensorFlow/CoreML exports"),
    (["--workspace", "4"], "--workspace: applies to TensorRT engines"),
    (["--optimize"], "--optimize: TorchScript for PyTorch Mobile is not written here"),
    (["--include", "mnn"], "--include mnn: unknown format (choose from torchscript, onnx, openvino"),
    pytest.param(["--include", "engine"], "--include engine builds a TensorRT engine, which needs a CUDA GPU: this",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without CUDA")),
    (["--include", "tfjs"], "--include tfjs is not written here: tensorflowjs 4.22 installs tensorflow 2.19"),
])
def test_flags_that_cannot_work_are_refused_with_one_line(flags: list[str], expected: str, weights: Path,
                                                          capsys) -> None:
    assert expected in _error_line(["--weights", weights, "--img-size", "64", *flags], capsys)


def test_several_weights_are_each_exported(weights: Path, tmp_path: Path, monkeypatch) -> None:
    exported = []

    def fake_export(path: Path, fmts: list, device: torch.device, opt) -> list[export.ExportResult]:
        exported.append((path, fmts))
        return [export.ExportResult(fmts[0].name, path, export.Verification(0.0, 0.0))]

    monkeypatch.setattr(export, "export_weights", fake_export)  # the loop only: exporting itself is tested above
    files = [tmp_path / "a.pt", tmp_path / "b.pt"]
    export.main(export.parse_opt(["--weights", *map(str, files), "--include", "onnx"]))
    names = [(path, [fmt.name for fmt in fmts]) for path, fmts in exported]
    assert names == [(files[0], ["onnx"]), (files[1], ["onnx"])]  # as YOLOv5's export.py loops over them


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_half_export_on_cuda(weights: Path, tmp_path: Path) -> None:
    local = tmp_path / "half.pt"
    local.write_bytes(weights.read_bytes())
    results = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--half", "--device", "0",
                                            "--include", "torchscript"]))
    assert results[0].error is None  # verified against the FP16 PyTorch model
    backend = InferenceModel(local.with_suffix(".torchscript"), "cuda:0", trusted=True)
    assert backend.dtype == torch.float16 and backend(real_images((64, 64), 1).cuda()).dtype == torch.float16


V7_EXPORT_FLAGS = ["--data", "d.yaml", "--weights", "a.pt", "b.pt", "--imgsz", "320", "--batch-size", "2",
                   "--device", "cpu", "--half", "--inplace", "--keras", "--optimize", "--int8", "--dynamic",
                   "--simplify", "--opset", "12", "--verbose", "--workspace", "4", "--nms", "--agnostic-nms",
                   "--topk-per-class", "100", "--topk-all", "100", "--iou-thres", "0.45", "--conf-thres", "0.25",
                   "--include", "torchscript", "onnx", "openvino"]


def test_every_yolov5_v7_flag_parses() -> None:
    opt = export.parse_opt(V7_EXPORT_FLAGS)  # no argparse error for any of them; main() judges each
    assert (opt.weights, opt.half, opt.simplify, opt.opset, opt.verbose) == (["a.pt", "b.pt"], True, True, 12, True)


@pytest.mark.slow
def test_ncnn_export_gives_the_pt_boxes_in_every_runner(weights: Path, tmp_path: Path) -> None:
    pytest.importorskip("pnnx")
    pytest.importorskip("ncnn")
    import hubconf

    local = tmp_path / "n.pt"
    local.write_bytes(weights.read_bytes())
    result = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "ncnn"]))[0]
    assert result.file == tmp_path / "n_ncnn_model"
    assert sorted(p.name for p in result.file.iterdir()) == ["metadata.yaml", "model.ncnn.bin", "model.ncnn.param"]
    inference = InferenceModel(result.file)
    assert (inference.kind, inference.names, inference.img_size, inference.batch_size) == ("ncnn", NAMES, (64, 64), 1)
    images = real_images((64, 64), 3)  # three calls, one image each
    assert (inference(images) - pytorch_output(local, images)).abs().max() < 64 * 1e-4
    detector = hubconf.custom(result.file)
    assert detector.names == NAMES and detector(images[:1]).shape == pytorch_output(local, images[:1]).shape


@pytest.mark.slow
def test_coreml_package_is_written_and_read_back_but_not_run_here(weights: Path, tmp_path: Path) -> None:
    if formats.missing_packages(formats.get_format("coreml").export_packages):  # not imported here: see require()
        pytest.skip("coremltools is not installed")
    local = tmp_path / "c.pt"
    local.write_bytes(weights.read_bytes())
    result = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "coreml"]))[0]
    assert result.file == tmp_path / "c.mlpackage" and result.file.is_dir()
    found = formats.get_format("coreml").read_back(result.file)
    assert found["inputs"] == {"images": [1, 3, 64, 64]} and found["outputs"] == ["output0"]
    assert found["meta"]["names"] == NAMES and found["meta"]["stride"] == 32
    assert "read back" in result.verification.describe()
    with pytest.raises(UserError, match="coreml models have no runtime on this operating system"):
        InferenceModel(result.file)


@pytest.mark.slow
def test_coreml_segmenter_package_carries_the_prototypes_as_a_second_output(tiny_seg_weights: Path,
                                                                             tmp_path: Path) -> None:
    if formats.missing_packages(formats.get_format("coreml").export_packages):  # not imported here: see require()
        pytest.skip("coremltools is not installed")
    local = tmp_path / "s.pt"
    local.write_bytes(tiny_seg_weights.read_bytes())
    result = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "coreml"]))[0]
    found = formats.get_format("coreml").read_back(result.file)
    assert found["inputs"] == {"images": [1, 3, 64, 64]} and found["outputs"] == ["output0", "output1"]
    assert found["meta"]["head"]["task"] == "segment" and found["meta"]["head"]["nm"] == 32
    assert found["meta"]["head"]["proto_stride"] == 4.0


@pytest.mark.slow
def test_bench_export_prints_one_row_per_format(weights: Path, tiny_dataset: Path, capsys) -> None:
    from benchmarks import bench_export as bench

    rows = bench.main(bench.parse_opt(["--weights", str(weights), "--data", str(tiny_dataset), "--img-size", "64",
                                       "--formats", "onnx", "--runs", "2", "--warmup", "0", "--val-images", "4"]))
    assert [r.name for r in rows] == ["pytorch (.pt)", "onnx"]
    assert all(r.size_mb > 0 and r.ms_one > 0 and r.ms_all > 0 and r.map is not None for r in rows)
    assert rows[1].export_s > 0 and rows[0].export_s == 0
    table = capsys.readouterr().out.split("format ")[-1]
    assert "1.00x" in table and "onnx" in table


def test_bench_export_times_every_format_in_turns(tiny_exports: dict[str, Path], monkeypatch) -> None:
    from benchmarks import bench_export as bench

    calls: list[str] = []

    class Recorded(InferenceModel):  # the real model, each call's file noted
        def __call__(self, images: torch.Tensor) -> torch.Tensor:
            calls.append(self.weights.suffix)
            return super().__call__(images)

    monkeypatch.setattr(bench, "InferenceModel", Recorded)
    opt = bench.parse_opt(["--weights", "w.pt", "--data", "d.yaml", "--runs", "10", "--warmup", "1", "--clock", "cpu"])
    files = {"pt": tiny_exports["pt"], "onnx": tiny_exports["static_onnx"]}
    medians = bench.latencies(files, torch.rand(1, 3, 64, 64), 1, opt)
    assert set(medians) == {"pt", "onnx"} and min(medians.values()) > 0
    # one warm-up each, then 5 rounds of 2 calls of each: a change of load falls on both alike
    assert calls == [".pt", ".onnx"] + [".pt", ".pt", ".onnx", ".onnx"] * 5


# ------------------------------------------------------------------------------------------ segmenters
def tiny_anchor_free_segmenter(folder: Path, family: str = "yolo11") -> Path:
    """yolo11n-seg (or ``family``'s, yolo26: the end-to-end Segment26 head) at 1/8 width, 3 classes, seed-0 random
    weights."""
    from models.yolo import Model
    from utils.safe_yaml import load_yaml
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    cfg = {**load_yaml(Path(export.__file__).parent / "models" / f"{family}-seg.yaml"), "scale": "n", "nc": 3}
    cfg["scales"]["n"] = [0.5, 0.125, 1024]
    torch.manual_seed(0)
    model = Model(cfg)
    with torch.no_grad():  # YOLO26's class branches start at one score everywhere: ties would make any row "right"
        for parameter in model.head.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.names = list(NAMES)
    folder.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(new_checkpoint(model), folder / f"seg{family[4:]}.pt")


def assert_runs_like_the_pt(exported: Path, weights: Path, images: torch.Tensor, atol: float = 1e-4) -> None:
    """The runtime returns (rows, prototypes) equal to the .pt's, and the post-processed masks are the same."""
    from utils.tasks.contract import postprocess
    from utils.tasks.segment.masks import process_masks

    model = InferenceModel(exported)
    assert model.several_outputs and model.contract.extra == 32 and model.contract.task == "segment"
    (rows, protos), (ref_rows, ref_protos) = model(images), pytorch_output(weights, images)
    assert protos.shape == ref_protos.shape == (len(images), 32, images.shape[2] // 4, images.shape[3] // 4)
    assert (protos - ref_protos).abs().max() < atol * (1 + ref_protos.abs().max())
    for image_rows, image_protos, ref, ref_image_protos in zip(rows, protos, ref_rows, ref_protos):
        det = postprocess(image_rows[None], model.contract, 0.001, max_det=5)[0]
        expected = postprocess(ref[None], model.contract, 0.001, max_det=5)[0]
        assert torch.allclose(det, expected, atol=1e-3)
        masks = process_masks(image_protos, det[:, 6:], det[:, :4], images.shape[2:])
        expected_masks = process_masks(ref_image_protos, expected[:, 6:], expected[:, :4], images.shape[2:])
        assert (masks != expected_masks).float().mean() < 1e-3


def seg_data_yaml(folder: Path) -> Path:
    """A data YAML of the synthetic set with outlines: 8 validation images of 64-80 px (generated on first use)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    spec = {"task": "segment", "n_train": 1, "n_val": 8, "img_size": [64, 80]}
    (folder / "seg.yaml").write_text(yaml.safe_dump({"synthetic": spec, "path": str(folder / "set"),
                                                     "train": "images/train", "val": "images/val", "nc": 3,
                                                     "names": NAMES}))
    return folder / "seg.yaml"


def test_segmenter_exports_carry_the_prototypes_and_run_in_detect(tiny_seg_weights: Path, tmp_path: Path) -> None:
    """TorchScript, ONNX and OpenVINO of the tiny yolov5n-seg: verified (coefficients and prototypes too), the
    prototypes a second output; detect.py gives the .pt's outlines from each, and test.py the .pt's masks (RLE in
    its predictions JSON) from the ONNX file."""
    import detect

    local = tmp_path / "seg.pt"
    local.write_bytes(tiny_seg_weights.read_bytes())
    results = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "torchscript",
                                            "onnx", "openvino", "--dynamic"]))
    assert all(r.error is None and r.verification.extra_error < 1e-3 for r in results), results
    assert "masks" in results[0].verification.describe()
    proto = onnx.load(str(local.with_suffix(".onnx")))
    assert [o.name for o in proto.graph.output] == ["output0", "output1"]
    images = real_images((64, 96), 2)
    for result in results:
        if result.format != "torchscript":  # a dynamic TorchScript file is checked by its own size above
            assert_runs_like_the_pt(result.file, local, images)
    source = tmp_path / "scene.png"
    cv2 = pytest.importorskip("cv2")
    cv2.imwrite(str(source), (real_images((64, 64), 1)[0].permute(1, 2, 0).numpy()[..., ::-1] * 255).astype(np.uint8))
    outlines = {}
    for weights in (local, local.with_suffix(".onnx"), tmp_path / "seg_openvino_model"):
        found = detect.run(weights=weights, source=source, img_size=64, conf_thres=0.001, max_det=5, nosave=True,
                           project=tmp_path / "runs", trust_weights=True)
        outlines[weights.name] = found.outlines[0]
    assert len(outlines["seg.pt"]) == 5
    for name, found in outlines.items():
        assert len(found) == 5 and all(np.array_equal(a, b) for a, b in zip(found, outlines["seg.pt"])), name
    predictions = {}
    data = seg_data_yaml(tmp_path / "data")
    for weights in (local, local.with_suffix(".onnx")):  # test.py through the runtime: the same masks in its JSON
        result = test_script.run(weights=weights, data=data, img_size=64, batch_size=8, workers=0, max_det=20,
                                 save_json=True, project=tmp_path / "val", name=weights.suffix[1:])
        assert result.mask is not None and result.seen == 8
        predictions[weights.suffix] = sorted(json.loads(result.json_path.read_text()),
                                             key=lambda p: (p["image_id"], -p["score"]))
    assert len(predictions[".pt"]) == len(predictions[".onnx"]) == 8 * 20
    same = [a["segmentation"] == b["segmentation"] and a["category_id"] == b["category_id"]
            for a, b in zip(predictions[".pt"], predictions[".onnx"])]
    assert np.mean(same) > 0.9  # rows of near-equal scores may swap places


def test_int8_segmenter_is_verified_on_its_outlined_labels(tiny_seg_weights: Path, tmp_path: Path) -> None:
    """--int8 measures a segmenter's box mAP on a split whose labels are outlines (read as the task reads them),
    then test.py runs the INT8 file with box and mask rows."""
    local = tmp_path / "s.pt"
    local.write_bytes(tiny_seg_weights.read_bytes())
    data = seg_data_yaml(tmp_path / "data")
    (result,) = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "onnx",
                                              "--int8", "--data", str(data), "--calib-images", "4",
                                              "--verify-images", "8"]))
    assert result.error is None and result.file == tmp_path / "s-int8.onnx"
    verification = result.verification
    assert verification.map_reference is not None and verification.map_export is not None
    assert abs(verification.map_reference - verification.map_export) <= MAX_INT8_MAP_DROP
    found = test_script.run(weights=result.file, data=data, img=64, project=tmp_path / "runs")
    assert found.mask is not None


def test_anchor_free_segmenter_exports_to_onnx(tmp_path: Path) -> None:
    weights = tiny_anchor_free_segmenter(tmp_path)
    result = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "onnx"]))[0]
    assert result.error is None and result.verification.extra_error < 1e-3
    assert_runs_like_the_pt(result.file, weights, real_images((64, 64), 1))


def test_yolo26_segmenter_exports_carry_the_prototypes_at_other_sizes(tmp_path: Path) -> None:
    """YOLO26-seg (one-to-one rows with their coefficients, Proto26's prototypes): TorchScript, ONNX and OpenVINO
    (dynamic) verified at export, and the ONNX and OpenVINO files give the .pt's rows and masks at another size."""
    weights = tiny_anchor_free_segmenter(tmp_path, "yolo26")
    formats = ["torchscript", "onnx", "openvino"]
    results = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", *formats,
                                            "--dynamic"]))
    assert [r.format for r in results] == formats
    assert all(r.error is None and r.verification.extra_error < 1e-3 for r in results), results
    assert "masks" in results[0].verification.describe()
    for result in results[1:]:
        assert_runs_like_the_pt(result.file, weights, real_images((64, 96), 2))


@pytest.mark.slow
@pytest.mark.skipif(formats.missing_packages((("tensorflow", "x"), ("ai_edge_litert", "x"), ("pnnx", "x"),
                                              ("ncnn", "x"))) != [], reason="pip install -r requirements-export.txt")
def test_segmenter_tflite_and_ncnn_run_like_the_pt(tiny_seg_weights: Path, tmp_path: Path) -> None:
    """The tiny yolov5n-seg to TFLite (our TensorFlow translation, prototypes NHWC in the file) and NCNN (its raw
    maps decoded here by the Segment head rebuilt from the metadata, the prototypes its last output)."""
    local = tmp_path / "seg.pt"
    local.write_bytes(tiny_seg_weights.read_bytes())
    results = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "tflite",
                                            "ncnn"]))
    assert all(r.error is None and r.verification.extra_error < 1e-3 for r in results), results
    images = real_images((64, 64), 2)  # the NCNN runner takes one image a call; TFLite its fixed batch of 1
    for result in results:
        assert_runs_like_the_pt(result.file, local, images)


@pytest.mark.slow
@pytest.mark.skipif(formats.missing_packages((("tensorflow", "x"), ("ai_edge_litert", "x"), ("pnnx", "x"),
                                              ("ncnn", "x"))) != [], reason="pip install -r requirements-export.txt")
def test_yolo26_segmenter_tflite_runs_like_the_pt_and_ncnn_is_refused_in_one_line(tmp_path: Path) -> None:
    """YOLO26-seg to TFLite (the TensorFlow translation of Segment26 and Proto26: final rows with their
    coefficients, prototypes NHWC); NCNN, whose files hold raw maps decoded on the host, refuses its mask columns."""
    weights = tiny_anchor_free_segmenter(tmp_path, "yolo26")
    (result,) = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "tflite"]))
    assert result.error is None and result.verification.extra_error < 1e-3, result
    assert_runs_like_the_pt(result.file, weights, real_images((64, 64), 2))
    with pytest.raises(export.ExportError, match="32 extra columns \\(segment\\) are not decoded here") as info:
        export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "ncnn"]))
    assert "\n" not in str(info.value)
