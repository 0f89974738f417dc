"""test.py: flags, a whole run (table, run folder, outputs), and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml

from models.yolo import Model
from tests.helpers import load_script
from utils.cli import run_main
from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic
from utils.weights.checkpoint import new_checkpoint, save_checkpoint

test_script = load_script("test")

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_cfg_file) -> Path:
    """A checkpoint of the tiny model (random weights: it detects noise, which is enough to exercise the path)."""
    torch.manual_seed(0)
    return save_checkpoint(new_checkpoint(Model(str(tiny_cfg_file))), tmp_path_factory.mktemp("ckpt") / "tiny.pt")


def _args(checkpoint: Path, data: Path, project: Path, *extra: str) -> list[str]:
    return ["--weights", str(checkpoint), "--data", str(data), "--img", "64", "--batch-size", "4", "--device", "cpu",
            "--workers", "0", "--project", str(project), *extra]


def test_parse_opt_defaults_and_flags():
    opt = test_script.parse_opt([])
    assert (opt.img_size, opt.batch_size, opt.conf_thres, opt.iou_thres, opt.max_det, opt.task) == \
        (None, 32, 0.001, 0.6, 300, "val")  # None: the size the weights were trained at
    assert opt.data.endswith("data/synthetic.yaml") and opt.project.endswith("runs/test") and opt.name == "exp"
    opt = test_script.parse_opt(["--img", "320", "--task", "speed", "--save-json", "--agnostic-nms",
                                 "--trust-weights", "--single-cls", "--verbose", "--save-txt", "--save-conf"])
    assert opt.img_size == 320 and opt.task == "speed" and opt.save_json and opt.agnostic_nms and opt.trust_weights
    assert test_script.parse_opt(["--task", "study"]).study_sizes == [256, 1536, 128]  # the reference's sizes
    with pytest.raises(SystemExit):
        test_script.parse_opt(["--task", "benchmark"])


def test_run_writes_table_outputs_and_increments_folder(checkpoint, tiny_dataset, tmp_path, capsys):
    opt = test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--save-json", "--save-txt", "--verbose"))
    result = test_script.main(opt)
    out = capsys.readouterr().out
    assert out.count("test: weights=") == 1  # options printed once
    assert "Class     Images     Labels          P          R     mAP@.5 mAP@.5:.95" in out
    assert "all         12" in out and "Speed: " in out and "per image at shape (4, 3, " in out
    run_dir = tmp_path / "exp"
    rows = json.loads((run_dir / "predictions.json").read_text())
    assert result.seen == 12 and result.n_labels > 0 and len(rows) > 0
    assert {"image_id", "category_id", "bbox", "score"} == set(rows[0])
    assert len(list((run_dir / "labels").glob("*.txt"))) > 0
    for name in ("PR_curve.png", "F1_curve.png", "confusion_matrix.png", "val_batch0_labels.jpg"):
        assert (run_dir / name).stat().st_size > 0


def test_speed_task_and_image_size_rounded_up_with_warning(checkpoint, tiny_dataset, tmp_path, capsys):
    args = _args(checkpoint, tiny_dataset, tmp_path, "--task", "speed", "--conf-thres", "0.01")
    args[args.index("--img") + 1] = "50"
    (tmp_path / "exp").mkdir()
    result = test_script.main(test_script.parse_opt(args))
    captured = capsys.readouterr()
    assert "not a multiple of stride 32; using [64, 64]" in captured.out + captured.err
    assert result.seen == 12 and "Speed: " in captured.out
    assert (tmp_path / "exp2").is_dir() and not (tmp_path / "exp2" / "PR_curve.png").exists()  # speed: no plots


def _error_line(opt_args: list[str], capsys) -> str:
    code = run_main(test_script.main, test_script.parse_opt(opt_args), "test")
    err = capsys.readouterr().err.strip().splitlines()  # the data scan's progress bar may come before
    assert code == 2, err
    assert err[-1].startswith("test: error: ") and sum("error" in line for line in err) == 1
    return err[-1]


def test_bad_weights_give_one_line_errors(checkpoint, tiny_dataset, tmp_path, capsys):
    missing = tmp_path / "missing.pt"
    assert "not found" in _error_line(_args(missing, tiny_dataset, tmp_path), capsys)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x00not a checkpoint" * 10)
    assert "damaged" in _error_line(_args(corrupt, tiny_dataset, tmp_path), capsys)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(1)}}, foreign)
    assert "not a checkpoint of this project" in _error_line(_args(foreign, tiny_dataset, tmp_path), capsys)


def _unlabeled(tmp_path, n_val: int):
    """A data YAML whose images have no label files."""
    unlabeled = ensure_synthetic(tmp_path / "unlabeled", n_train=1, n_val=n_val, img_size=(64, 64), seed=1)
    for label in (unlabeled / "labels").rglob("*.txt"):
        label.unlink()
    data = tmp_path / "unlabeled.yaml"
    data.write_text(yaml.safe_dump({"path": str(unlabeled), "train": "images/train", "val": "images/val",
                                    "nc": len(SYNTHETIC_NAMES), "names": SYNTHETIC_NAMES}))
    return data


def test_bad_data_give_one_line_errors(checkpoint, tiny_dataset, tmp_path, capsys):
    line = _error_line(_args(checkpoint, tiny_dataset, tmp_path, "--task", "test"), capsys)
    assert "no 'test' split" in line
    assert "no labels" in _error_line(_args(checkpoint, _unlabeled(tmp_path, 4), tmp_path), capsys)


def test_class_count_mismatch_is_refused(tiny_cfg_file, tiny_dataset, tmp_path, capsys):
    two_classes = save_checkpoint(new_checkpoint(Model(str(tiny_cfg_file), nc=2)), tmp_path / "nc2.pt")
    line = _error_line(_args(two_classes, tiny_dataset, tmp_path), capsys)
    assert "predicts 2 classes" in line and "has 3" in line


def test_script_exit_code_and_single_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "test.py"), "--weights", str(tmp_path / "none.pt"),
                           "--device", "cpu", "--project", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"test: error: --weights {tmp_path / 'none.pt'} not found"]


# ------------------------------------------------------------------------------------ YOLOv5 v7.0 flags
@pytest.fixture
def no_curve_plots(monkeypatch):
    """Skip the PR/F1/P/R curves and the confusion matrix (2-3 s of matplotlib a run) where a test checks none."""
    import utils.plots.figures

    monkeypatch.setattr(utils.plots.figures, "plot_metric_curves", lambda *args, **kwargs: [])
    monkeypatch.setattr(utils.plots.figures, "plot_confusion_matrix", lambda *args, **kwargs: None)


def _files(run_dir: Path) -> set[str]:
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}


def test_speed_task_only_times(checkpoint, tiny_dataset, tmp_path, capsys):
    result = test_script.main(test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--task", "speed",
                                                          "--save-json", "--save-txt", "--verbose")))
    out = capsys.readouterr().out
    assert result.seen == 12 and all(ms > 0 for ms in result.speed[1:2])
    assert result.metrics is None and result.results() == (0.0, 0.0, 0.0, 0.0)  # nothing was matched
    assert "mAP@.5:.95" not in out and "(12 images, timing only)" in out
    assert _files(tmp_path / "exp") == {".yolo-run"}  # the run folder's marker; no plots, no JSON, no label files
    data = _unlabeled(tmp_path, 3)
    assert test_script.main(test_script.parse_opt(_args(checkpoint, data, tmp_path, "--task", "speed"))).seen == 3


def test_train_task_validates_the_training_split(checkpoint, tiny_dataset, tmp_path, no_curve_plots):
    result = test_script.main(test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--task", "train")))
    assert result.seen == 24  # the 24 training images, not the 12 of val


def test_study_task_writes_a_table_and_a_plot(checkpoint, tiny_dataset, tmp_path, no_curve_plots):
    results = test_script.main(test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--task", "study",
                                                           "--study-sizes", "64", "96", "32")))
    run_dir = tmp_path / "exp"
    assert _files(run_dir) == {".yolo-run", "study_tiny_tiny.txt", "study.png"}  # study_<data>_<weights>.txt
    rows = np.loadtxt(run_dir / "study_tiny_tiny.txt", ndmin=2)
    assert rows.shape == (2, 8) and rows[:, 0].tolist() == [64, 96]
    plain = test_script.main(test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path)))  # img 64
    np.testing.assert_allclose(rows[0, 1:5], plain.results(), atol=1e-4)  # the study's 64 px row is a val run
    assert results[1].map != results[0].map  # 96 px is another run
    with pytest.raises(test_script.TestError, match="--study-sizes 96 64 32"):
        test_script.main(test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--task", "study",
                                                     "--study-sizes", "96", "64", "32")))


def _label_rows(folder: Path) -> dict[str, np.ndarray]:
    """Each label file's rows (an empty file: no rows)."""
    return {p.stem: np.array([[float(v) for v in line.split()] for line in p.read_text().splitlines()])
            for p in sorted(folder.glob("*.txt"))}


def test_save_hybrid_writes_labels_and_predictions(checkpoint, tiny_dataset, tmp_path, capsys, no_curve_plots):
    test_script.main(test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--save-hybrid",
                                                 "--save-conf")))
    assert "--save-hybrid adds the labels to the predictions" in capsys.readouterr().out
    hybrid = _label_rows(tmp_path / "exp" / "labels")
    test_script.main(test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--save-txt", "--save-conf")))
    predicted = _label_rows(tmp_path / "exp2" / "labels")
    root = Path(yaml.safe_load(tiny_dataset.read_text())["path"])
    assert len(hybrid) == 12 and all((rows[:, 5] < 1).all() for rows in predicted.values() if len(rows))
    kept = 0
    for stem, rows in hybrid.items():
        truth = np.loadtxt(root / "labels" / "val" / f"{stem}.txt", ndmin=2)
        labels_found = rows[rows[:, 5] == 1.0, :5]  # every label comes through NMS, with confidence 1
        # (within 1 %: scale_boxes maps x back with the height's letterbox ratio, as YOLOv5's does, and the two
        # ratios differ by the rounding of the resized width; validation's own labels take the same way back)
        np.testing.assert_allclose(labels_found[np.lexsort(labels_found.T[::-1])], truth[np.lexsort(truth.T[::-1])],
                                   atol=1e-2)
        for row in rows[rows[:, 5] < 1.0]:  # the other rows are the model's own predictions (none overlap a label)
            assert np.abs(predicted[stem] - row).max(1).min() < 1e-5
            kept += 1
    assert kept > 0


@pytest.fixture(scope="module")
def white_boxes(tmp_path_factory) -> Path:
    """4 black images (128 x 160) with one white 77 px rectangle each, off-centre, labelled as class 0."""
    root = tmp_path_factory.mktemp("white_boxes")
    for folder in ("images", "labels"):
        (root / folder).mkdir()
    for i, (x1, y1) in enumerate([(70, 10), (8, 40), (75, 45), (20, 20)]):
        x2, y2 = x1 + 77, y1 + 77  # 77 px: the 0.83 pass of --augment sees it at the size its level prefers
        image = np.zeros((128, 160, 3), np.uint8)
        image[y1:y2, x1:x2] = 255
        cv2.imwrite(str(root / "images" / f"{i}.png"), image)
        (root / "labels" / f"{i}.txt").write_text(f"0 {(x1 + x2) / 320} {(y1 + y2) / 256} {77 / 160} {77 / 128}\n")
    data = root / "boxes.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images", "val": "images", "nc": 3,
                                    "names": list(SYNTHETIC_NAMES)}))
    return data


def test_augment_boxes_score_as_the_plain_ones(checkpoint, white_boxes, tmp_path, monkeypatch, no_curve_plots):
    from tests.helpers import bright_box_predict

    built = Model.forward  # the builder's train-mode stride probe still runs the real layers
    monkeypatch.setattr(Model, "forward",  # a detector that finds the boxes
                        lambda self, x: built(self, x) if self.training else bright_box_predict(x))
    args = _args(checkpoint, white_boxes, tmp_path, "--img", "160", "--save-txt", "--save-conf")
    plain = test_script.main(test_script.parse_opt(args))
    augmented = test_script.main(test_script.parse_opt([*args, "--augment"]))
    assert plain.map50 == augmented.map50 == 1.0  # in the original image's frame: every box matches its label
    assert plain.map > 0.9 and augmented.map > 0.85
    assert _label_rows(tmp_path / "exp" / "labels").keys() == _label_rows(tmp_path / "exp2" / "labels").keys()
    assert any(not np.array_equal(a, b) for a, b in zip(_label_rows(tmp_path / "exp" / "labels").values(),
                                                        _label_rows(tmp_path / "exp2" / "labels").values()))


def test_release_name_weights_validate(release_server, tiny_dataset, tmp_path, no_curve_plots):
    from utils.deploy.runtime import InferenceModel

    names = InferenceModel(ROOT / "tests" / "fixtures" / "yolov5n-v7.0.pt").names
    data = tiny_dataset.with_name(f"coco-like-{tmp_path.name}.yaml")  # beside the data: a YAML's path stays near it
    data.write_text(yaml.safe_dump({**yaml.safe_load(tiny_dataset.read_text()), "nc": 80, "names": names}))
    result = test_script.main(test_script.parse_opt(_args("yolov5s.pt", data, tmp_path, "--conf-thres", "0.01")))
    assert (release_server / "yolov5s.pt").is_file() and result.seen == 12


def test_exports_validate_like_the_pt(tiny_exports, tiny_dataset, tmp_path, no_curve_plots):
    results = {kind: test_script.main(test_script.parse_opt(_args(tiny_exports[kind], tiny_dataset, tmp_path)))
               for kind in tiny_exports}  # pt, static_onnx, onnx and (when installed) openvino
    for kind in set(tiny_exports) & {"onnx", "openvino"}:  # dynamic exports: the .pt's rectangular batches
        np.testing.assert_allclose(results[kind].results(), results["pt"].results(), atol=1e-3)
    assert results["static_onnx"].seen == 12  # 64 x 64 batches of 4 through a batch-1 export


@pytest.mark.parametrize("extra, expected", [
    (["--dnn"], "--dnn: OpenCV DNN is not used here"),
    (["--weights", "a.pt", "b.pt"], "--weights a.pt b.pt: model ensembles are not supported"),
])
def test_reference_flags_that_do_not_apply_are_refused(extra, expected, checkpoint, tiny_dataset, tmp_path, capsys):
    assert expected in _error_line(_args(checkpoint, tiny_dataset, tmp_path, *extra), capsys)


def test_val_py_is_test_py_under_the_newer_name(checkpoint, tiny_dataset, tmp_path, capsys):
    import val

    opt = val.parse_opt([])
    assert opt.project.endswith("runs/val") and vars(opt).keys() == vars(test_script.parse_opt([])).keys()
    result = val.main(val.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--task", "speed")))
    assert result.seen == 12 and capsys.readouterr().out.startswith("val: weights=")
    code = run_main(val.main, val.parse_opt(_args(tmp_path / "none.pt", tiny_dataset, tmp_path)), "val")
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"val: error: --weights {tmp_path / 'none.pt'} not found"]
    assert len((ROOT / "val.py").read_text().splitlines()) < 50  # no copy of test.py


V7_VAL_FLAGS = ["--data", "d.yaml", "--weights", "a.pt", "--batch-size", "8", "--imgsz", "320", "--conf-thres", "0.1",
                "--iou-thres", "0.5", "--max-det", "9", "--task", "study", "--device", "cpu", "--workers", "1",
                "--single-cls", "--augment", "--verbose", "--save-txt", "--save-hybrid", "--save-conf", "--save-json",
                "--project", "p", "--name", "n", "--exist-ok", "--half", "--dnn"]


def test_every_yolov5_v7_flag_parses():
    import val

    for parse in (test_script.parse_opt, val.parse_opt):  # no argparse error; run() judges each
        opt = parse(V7_VAL_FLAGS)
        assert (opt.task, opt.augment, opt.save_hybrid, opt.img_size) == ("study", True, True, 320)


def test_half_on_the_cpu_is_refused_as_detect_refuses_it(checkpoint, tiny_dataset, tmp_path, capsys):
    from utils.cli import run_main

    code = run_main(test_script.main, test_script.parse_opt(_args(checkpoint, tiny_dataset, tmp_path, "--half")),
                    "test")
    err = capsys.readouterr().err
    assert code == 2 and err == "test: error: --half needs a CUDA device (this run uses cpu); drop --half or pass " \
        "--device 0\n", err
    assert not (tmp_path / "exp").exists()  # refused before anything was written


def test_augment_is_refused_for_an_end_to_end_models_final_rows() -> None:
    from types import SimpleNamespace

    from utils.tasks.contract import OutputContract

    opt = test_script.parse_opt(["--augment"])
    final = SimpleNamespace(contract=OutputContract("xyxy_score_cls", 80), weights=Path("yolo26n.pt"), dynamic=True,
                            img_size=None)
    with pytest.raises(test_script.TestError, match="returns final rows .xyxy_score_cls, no NMS.: drop --augment"):
        test_script.check_options(opt, final)
    test_script.check_options(opt, SimpleNamespace(**{**vars(final), "contract": OutputContract("xywh_cls", 80)}))
