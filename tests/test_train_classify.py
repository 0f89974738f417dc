"""Classification through the same train.py, Trainer, DDP, resume, test.py, detect.py and export.py as detection:
yolo11n-cls on the synthetic class-folder set (tiny: 64 px, 24-32 images, 1-2 epochs).

- one process, in this process: yolo11n-cls trains (one loss column ``train/cls_loss``; top-1 and top-5 accuracy
  in results.csv), an interrupted run resumed mid-epoch equals the uninterrupted one bit for bit, test.py on its
  weights reports the accuracies results.csv holds, detect.py prints, draws and writes each image's top-5, and its
  TorchScript, ONNX and OpenVINO exports are verified at export and the ONNX file validates in test.py within 0.005
  of the .pt;
- two gloo ranks under torchrun: the sharded validation's top-1 and top-5 equal test.py's in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import cv2
import pytest
import torch
import yaml

from tests.helpers import ROOT, finish, results_rows, start, torchrun_cmd, weights_diff
from tests.plugins.faults import FailAt
from utils.data.sources import load_source
from utils.errors import UserError
from utils.weights.checkpoint import load_checkpoint

NAMES = ["circle", "square", "triangle"]
COLUMNS = ["train/cls_loss", "metrics/accuracy_top1", "metrics/accuracy_top5"]


def cls_data(folder: Path, n_train: int, n_val: int = 9) -> Path:
    path = folder / "cls.yaml"
    path.write_text(yaml.safe_dump({"synthetic": {"task": "classify", "n_train": n_train, "n_val": n_val,
                                                  "img_size": [64, 80]},
                                    "path": str(folder / "set"), "train": "train", "val": "val", "nc": 3,
                                    "names": NAMES}))
    return path


def cls_args(data: Path, project: Path, name: str, *extra: str, batch: int = 8, epochs: int = 2) -> list[str]:
    return [str(ROOT / "train.py"), "--data", str(data), "--cfg", "yolo11n-cls.yaml", "--weights", "",
            "--img-size", "64", "--batch-size", str(batch), "--epochs", str(epochs), "--workers", "0", "--device",
            "cpu", "--seed", "0", "--amp", "off", "--project", str(project), "--name", name, "--noplots", *extra]


def test_a_classifier_trains_resumes_validates_detects_and_exports(tmp_path: Path, in_process: Callable[..., int],
                                                                  capsys: pytest.CaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import detect
    import export
    import test as test_script
    from utils.tasks.classify.predict import OUTPUTS

    data, project = cls_data(tmp_path, 24), tmp_path / "runs"
    args = lambda name: cls_args(data, project, name, "--save-interval-steps", "1")  # noqa: E731
    assert in_process(args("whole")) == 0
    row = results_rows(project / "whole")[-1]
    assert list(row)[1:4] == COLUMNS and 0 < float(row["train/cls_loss"]) < 5
    assert float(row["metrics/accuracy_top5"]) == 1.0  # three classes: the label is always among the five best
    weights = project / "whole" / "weights" / "last.pt"
    ckpt = load_checkpoint(weights)
    assert (ckpt["family"], ckpt["task"]) == ("yolo11", "classify")
    with pytest.raises(RuntimeError, match="test fault injected at epoch 1 batch 1"):
        in_process(args("cut"), FailAt(rank=0, epoch=1, batch=1))  # last.pt: after batch 0 of epoch 1
    cut_last = project / "cut" / "weights" / "last.pt"
    assert load_checkpoint(cut_last)["train_state"]["position"]["samples_seen"] == 8
    assert in_process([str(ROOT / "train.py"), "--resume", str(cut_last)]) == 0
    assert weights_diff(weights, cut_last) == 0.0

    options = {"data": str(data), "img_size": 64, "batch_size": 4, "workers": 0, "device": "cpu"}
    result = test_script.run(weights=str(weights), project=str(tmp_path / "test"), name="pt", **options)
    assert result.seen == 9 and result.top1 == pytest.approx(float(row["metrics/accuracy_top1"]), abs=1e-6)
    assert set(result.named_results()) == {"accuracy_top1", "accuracy_top5"}

    val = data.parent / "set" / "val"
    fits = []  # how detect.py's source fits its frames: as the classifier's validation fits images

    def recorded(*args, **kwargs):
        fits.append(kwargs.get("fit"))
        return load_source(*args, **kwargs)

    monkeypatch.setattr(detect, "load_source", recorded)
    found = detect.run(weights=str(weights), source=str(val / "square"), img_size=64, save_txt=True,
                       project=str(tmp_path / "detect"), name="exp", device="cpu")
    assert len(found.detections) == 3 and all(len(d) == 3 and not d[:, :4].any() for _, d in found.detections)
    assert fits == [OUTPUTS.fit_input]  # 64 x 80 images: centre-cropped to 64 x 64, not letterboxed
    for (_, det), top5, label in zip(found.detections, found.top5, sorted((found.save_dir / "labels").iterdir())):
        assert [c for c, _ in top5] == det[:, 5].astype(int).tolist()  # ranked, best first
        lines = label.read_text().splitlines()
        assert lines == [f"{p:.2f} {c}" for c, p in top5] and len(lines) == 3
    drawn = cv2.imread(str(found.save_dir / sorted(p.name for p in (val / "square").iterdir())[0]))
    original = cv2.imread(str(sorted((val / "square").iterdir())[0]))
    assert drawn.shape == original.shape and (drawn[:10, :20] != original[:10, :20]).any()  # the top-5 band

    written = export.run(weights=str(weights), include=["torchscript", "onnx", "openvino"], img_size=[64],
                         device="cpu")  # each verified against the .pt as it is written
    assert [p.name for p in written] == ["last.torchscript", "last.onnx", "last_openvino_model"]
    onnx = written[1]
    exported = test_script.run(weights=str(onnx), project=str(tmp_path / "test"), name="onnx", **options)
    assert abs(exported.top1 - result.top1) <= 0.005 and abs(exported.top5 - result.top5) <= 0.005
    with pytest.raises(UserError, match="last.pt is a classifier, whose class probabilities it does not merge"):
        test_script.run(weights=str(weights), augment=True, **options)
    for flags, message in (({"augment": True}, "it cannot merge"), ({"track": "bytetrack"}, "and no boxes")):
        with pytest.raises(UserError, match=message):
            detect.run(weights=str(weights), source=str(val), device="cpu", **flags)
    capsys.readouterr()
    assert in_process(cls_args(data, project, "quad", "--quad", epochs=1)) == 2
    assert "train: error: --quad tiles four images into one of twice the size; a classifier's images keep theirs" \
        in capsys.readouterr().err


def test_int8_exports_are_checked_by_top1_accuracy_on_a_spread_of_the_class_folders(tmp_path: Path) -> None:
    """--int8 quantizes a classifier (ONNX Runtime, OpenVINO) and checks the top-1 accuracy of the file against the
    float model's on --verify-images images spread over the validation class folders (each of the class its folder
    names): an oracle answering "square" for every image (its linear layer's weights near 0, its bias for square
    10) scores the share of squares among them on both."""
    import export
    from models.yolo import Model
    from utils.data.label_cache import list_image_files
    from utils.deploy.verify import spread
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    data = cls_data(tmp_path, 4)
    torch.manual_seed(0)
    model = Model("yolo11n-cls.yaml", nc=3)
    model.names = list(NAMES)
    with torch.no_grad():
        model.head.linear.weight.uniform_(-1e-3, 1e-3)
        model.head.linear.bias.copy_(torch.tensor([0.0, 10.0, 0.0]))
    weights = save_checkpoint(new_checkpoint(model), tmp_path / "oracle.pt")
    results = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "onnx",
                                            "openvino", "--int8", "--data", str(data), "--calib-images", "4",
                                            "--verify-images", "6"]))
    checked = spread(list_image_files(tmp_path / "set" / "val"), 6)
    squares = sum(Path(f).parent.name == "square" for f in checked) / len(checked)
    assert 0 < squares < 1
    assert [r.file.name for r in results] == ["oracle-int8.onnx", "oracle-int8_openvino_model"]
    for result in results:
        check = result.verification
        assert result.error is None and check.metric == "top-1 accuracy", result.format
        assert check.map_reference == pytest.approx(squares) and check.map_export == pytest.approx(squares)
        assert check.describe().startswith(f"top-1 accuracy {squares:.4f} vs {squares:.4f} float")


@pytest.mark.ddp
@pytest.mark.slow
def test_two_ranks_train_and_validate_as_one_process(tmp_path: Path) -> None:
    """One 2-rank run (a restart mid-epoch under torchrun is the shared trainer's, tested for detection and
    segmentation; a classifier's resume mid-epoch is tested in one process above)."""
    import test as test_script

    data, project = cls_data(tmp_path, 32, n_val=15), tmp_path / "runs"
    code, out = finish(start(torchrun_cmd(2, *cls_args(data, project, "whole", batch=16, epochs=1))))
    assert code == 0, out[-3000:]
    weights = project / "whole" / "weights" / "last.pt"
    row = results_rows(project / "whole")[-1]
    one = test_script.run(weights=str(weights), data=str(data), img_size=64, batch_size=16, workers=0, device="cpu",
                          project=str(tmp_path / "test"), name="exp")
    assert one.seen == 15  # 8 and 7 on the two ranks: an odd split of the shards sums to the one process's
    assert float(row["metrics/accuracy_top1"]) == pytest.approx(one.top1, abs=1e-6)  # results.csv: 6 digits
    assert float(row["metrics/accuracy_top5"]) == pytest.approx(one.top5, abs=1e-6)


def test_a_classifier_without_data_takes_the_synthetic_class_folders(tmp_path: Path) -> None:
    import train
    from utils.training.builder import prepare_run
    from utils.training.config import RunConfig

    defaults = RunConfig.from_options(train.parse_opt([]))
    config = RunConfig.from_options(train.parse_opt(["--project", str(tmp_path), "--cfg", "yolo11n-cls.yaml"]))
    assert Path(prepare_run(config, defaults)[0].data).name == "synthetic-cls.yaml"
    values = yaml.safe_load((ROOT / "data" / "synthetic-cls.yaml").read_text())
    assert values["synthetic"]["task"] == "classify" and values["names"] == NAMES
