"""test.py: flags, a whole run (table, run folder, outputs), and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import test as test_script
from models.yolo import Model
from utils.checkpoint import new_checkpoint, save_checkpoint
from utils.cli import run_main
from utils.synthetic import SYNTHETIC_NAMES, ensure_synthetic

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
        (640, 32, 0.001, 0.6, 300, "val")
    assert opt.data.endswith("data/synthetic.yaml") and opt.project.endswith("runs/test") and opt.name == "exp"
    opt = test_script.parse_opt(["--img", "320", "--task", "speed", "--save-json", "--agnostic-nms",
                                 "--trust-weights", "--single-cls", "--verbose", "--save-txt", "--save-conf"])
    assert opt.img_size == 320 and opt.task == "speed" and opt.save_json and opt.agnostic_nms and opt.trust_weights
    with pytest.raises(SystemExit):
        test_script.parse_opt(["--task", "study"])


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


def test_bad_data_give_one_line_errors(checkpoint, tiny_dataset, tmp_path, capsys):
    line = _error_line(_args(checkpoint, tiny_dataset, tmp_path, "--task", "test"), capsys)
    assert "no 'test' split" in line
    unlabeled = ensure_synthetic(tmp_path / "unlabeled", n_train=2, n_val=4, img_size=(64, 64), seed=1)
    for label in (unlabeled / "labels").rglob("*.txt"):
        label.unlink()
    data = tmp_path / "unlabeled.yaml"
    data.write_text(yaml.safe_dump({"path": str(unlabeled), "train": "images/train", "val": "images/val",
                                    "nc": len(SYNTHETIC_NAMES), "names": SYNTHETIC_NAMES}))
    assert "no labels" in _error_line(_args(checkpoint, data, tmp_path), capsys)


def test_class_count_mismatch_is_refused(tiny_cfg_file, tiny_dataset, tmp_path, capsys):
    two_classes = save_checkpoint(new_checkpoint(Model(str(tiny_cfg_file), nc=2)), tmp_path / "nc2.pt")
    line = _error_line(_args(two_classes, tiny_dataset, tmp_path), capsys)
    assert "predicts 2 classes" in line and "has 3" in line


def test_script_exit_code_and_single_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "test.py"), "--weights", str(tmp_path / "none.pt"),
                           "--device", "cpu", "--project", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"test: error: weights file {tmp_path / 'none.pt'} not found"]
