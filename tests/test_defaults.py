"""No surprises: detect.py, test.py/val.py and export.py run at the size the weights were trained at (an explicit
--img wins); a split whose images all lack labels stops before training with one line (some missing stays a
counted warning); --fraction trains on a share of the images."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import detect
import export
import train
from tests.helpers import load_script, one_thread_and_logger_kept
from utils.cli import run_main
from utils.data.config import DataError
from utils.deploy.runtime import InferenceModel

test_script = load_script("test")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained_at_96(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of the tiny model whose options say it trained at 96 px."""
    from models.yolo import Model
    from tests.conftest import _tiny_cfg
    from utils.data.synthetic import SYNTHETIC_NAMES
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = Model(_tiny_cfg())
    model.names = list(SYNTHETIC_NAMES)
    return save_checkpoint(new_checkpoint(model, opt={"img_size": 96}), tmp_path_factory.mktemp("w96") / "best.pt")


def test_detect_and_test_run_at_the_trained_size_unless_told(trained_at_96: Path, tiny_dataset: Path,
                                                              tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    images = tmp_path / "images"
    images.mkdir()
    cv2.imwrite(str(images / "a.png"), np.full((48, 64, 3), 90, np.uint8))
    with one_thread_and_logger_kept():
        detect.run(weights=trained_at_96, source=images, project=tmp_path / "detect", nosave=True)
        out = capsys.readouterr().out
        assert "Image size 96: the size best.pt was trained at" in out and "(1, 3, 96, 96)" in out, out
        detect.run(weights=trained_at_96, source=images, project=tmp_path / "detect", nosave=True, img=64)
        out = capsys.readouterr().out
        assert "Image size 96" not in out and "(1, 3, 64, 64)" in out
        test_script.run(weights=trained_at_96, data=tiny_dataset, project=tmp_path / "val", workers=0, batch_size=4)
        assert "Image size 96: the size best.pt was trained at" in capsys.readouterr().out
    assert InferenceModel(trained_at_96).default_size == (96, 96)


def test_export_runs_at_the_trained_size(trained_at_96: Path, tiny_weights: Path, tmp_path: Path) -> None:
    weights = tmp_path / "best.pt"
    shutil.copyfile(trained_at_96, weights)
    (onnx_file,) = export.run(weights=weights, include=["onnx"])
    assert InferenceModel(onnx_file).img_size == (96, 96)
    untold = tmp_path / "untold.pt"  # no recorded size (a release file, trained at 640): 640
    shutil.copyfile(tiny_weights, untold)
    (onnx_file,) = export.run(weights=untold, include=["onnx"])
    assert InferenceModel(onnx_file).img_size == (640, 640)


def copy_set(source_yaml: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the tiny data set (its YAML pointing at the copy) and its train labels folder."""
    import yaml

    data = yaml.safe_load(source_yaml.read_text())
    root = tmp_path / "set"
    shutil.copytree(data["path"], root, ignore=shutil.ignore_patterns("*.cache"))
    path = tmp_path / "set.yaml"
    path.write_text(yaml.safe_dump({**data, "path": str(root)}))
    return path, root / "labels" / "train"


def test_a_training_split_without_any_label_stops_before_training_with_one_line(
        tiny_dataset: Path, tiny_cfg_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data, labels = copy_set(tiny_dataset, tmp_path)
    shutil.rmtree(labels)
    argv = ["--data", str(data), "--cfg", str(tiny_cfg_file), "--img", "64", "--epochs", "1", "--batch", "8",
            "--workers", "0", "--project", str(tmp_path / "runs"), "--noplots", "--noautoanchor", "--device", "cpu"]
    with one_thread_and_logger_kept():
        code = run_main(train.main, train.parse_opt(argv), "train")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err == f"train: error: the train split of {data} has no labels: none of its 24 images has a box (24 " \
                  "without a label file, 0 with an empty one); put YOLO .txt files in labels/ next to images/ " \
                  "(docs/datasets.md)\n"
    assert not list((tmp_path / "runs").glob("*/weights/*.pt"))


def test_some_images_without_labels_stay_a_counted_warning(tiny_dataset: Path, tmp_path: Path) -> None:
    from utils.data.datasets import DatasetOptions, YoloDataset
    from utils.training.builder import refuse_unlabelled

    data, labels = copy_set(tiny_dataset, tmp_path)
    for label in sorted(labels.glob("*.txt"))[:20]:
        label.unlink()
    dataset = YoloDataset(labels.parent.parent / "images" / "train", DatasetOptions(img_size=64, nc=3))
    assert (dataset.scan.found, dataset.scan.missing) == (4, 20)
    refuse_unlabelled(dataset, "train", data)  # 4 labelled images: training goes on
    for label in labels.glob("*.txt"):
        label.write_text("")  # every file empty: no box anywhere
    (labels.parent / "train.cache").unlink(missing_ok=True)
    empty = YoloDataset(labels.parent.parent / "images" / "train", DatasetOptions(img_size=64, nc=3))
    with pytest.raises(DataError, match=r"none of its 24 images has a box \(20 without a label file, 4 with an empty"):
        refuse_unlabelled(empty, "train", data)


def test_fraction_keeps_the_first_share_of_the_images(tiny_dataset: Path) -> None:
    import yaml

    from utils.data.datasets import DatasetOptions, YoloDataset

    root = Path(yaml.safe_load(tiny_dataset.read_text())["path"])
    whole = YoloDataset(root / "images" / "train", DatasetOptions(img_size=64, nc=3))
    half = YoloDataset(root / "images" / "train", DatasetOptions(img_size=64, nc=3, fraction=0.5))
    tiny = YoloDataset(root / "images" / "train", DatasetOptions(img_size=64, nc=3, fraction=0.01))
    assert (len(whole), len(half), len(tiny)) == (24, 12, 1) and half.im_files == whole.im_files[:12]
    with pytest.raises(SystemExit):
        train.parse_opt(["--fraction", "0"])
