"""Oriented boxes through the same train.py, Trainer, DDP, resume, test.py, detect.py and export.py as detection:
yolo11n-obb on the synthetic oriented-box set (tiny: 64 px, 16-128 images, 1-2 epochs).

- one process, in this process: yolo11n-obb trains (box, cls, dfl and angle losses; the boxes' P, R and mAP of
  the polygon IoU in results.csv), an interrupted run resumed mid-epoch equals the uninterrupted one bit for bit,
  and test.py on its weights reports the mAP results.csv holds;
- an oracle (yolo11n-obb whose last layers make every P4 cell predict an 8 x 16 box turned a quarter, class 0, on
  images labelled with exactly those boxes): test.py gives mAP 1, detect.py draws the oriented outlines and writes
  the labels' own corners back, its TorchScript, ONNX and OpenVINO exports are verified at export and the ONNX
  file validates in test.py within 0.005 of the .pt; its INT8 ONNX and OpenVINO exports keep its mAP;
- two gloo ranks under torchrun: the sharded validation gives the mAP test.py gives in one process.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml

from tests.helpers import ROOT, finish, results_rows, start, torchrun_cmd, weights_diff
from tests.plugins.faults import FailAt
from utils.deploy.formats import missing_packages
from utils.errors import UserError
from utils.weights.checkpoint import load_checkpoint

NAMES = ["square", "rectangle", "strip"]
BOX_COLUMNS = ["metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95"]
GRID = (8.0, 24.0, 40.0, 56.0)  # the P4 cell centres of a 64 px image


def obb_data(folder: Path, n_train: int) -> Path:
    path = folder / "obb.yaml"
    path.write_text(yaml.safe_dump({"synthetic": {"task": "obb", "n_train": n_train, "n_val": 8, "img_size": [64, 80]},
                                    "path": str(folder / "set"), "train": "images/train", "val": "images/val",
                                    "nc": 3, "names": NAMES}))
    return path


def obb_args(data: Path, project: Path, name: str, *extra: str, batch: int = 8, epochs: int = 2) -> list[str]:
    return [str(ROOT / "train.py"), "--data", str(data), "--cfg", "yolo11n-obb.yaml", "--weights", "",
            "--img-size", "64", "--batch-size", str(batch), "--epochs", str(epochs), "--workers", "0", "--device",
            "cpu", "--seed", "0", "--amp", "off", "--project", str(project), "--name", name, "--noplots", *extra]


def test_an_obb_model_trains_resumes_exactly_and_tests(tmp_path: Path, in_process: Callable[..., int]) -> None:
    import test as test_script

    data, project = obb_data(tmp_path, 16), tmp_path / "runs"
    args = lambda name: obb_args(data, project, name, "--save-interval-steps", "1")  # noqa: E731
    assert in_process(args("whole")) == 0
    row = results_rows(project / "whole")[-1]
    assert list(row)[1:5] == ["train/box_loss", "train/cls_loss", "train/dfl_loss", "train/angle_loss"]
    assert all(c in row for c in BOX_COLUMNS) and 0 < float(row["train/angle_loss"]) < 5
    weights = project / "whole" / "weights" / "last.pt"
    assert (load_checkpoint(weights)["family"], load_checkpoint(weights)["task"]) == ("yolo11", "obb")
    with pytest.raises(RuntimeError, match="test fault injected at epoch 1 batch 1"):
        in_process(args("cut"), FailAt(rank=0, epoch=1, batch=1))  # last.pt: after batch 0 of epoch 1
    cut_last = project / "cut" / "weights" / "last.pt"
    assert load_checkpoint(cut_last)["train_state"]["position"]["samples_seen"] == 8
    assert in_process([str(ROOT / "train.py"), "--resume", str(cut_last)]) == 0
    assert weights_diff(weights, cut_last) == 0.0
    result = test_script.run(weights=str(weights), data=str(data), img_size=64, batch_size=8, workers=0,
                             device="cpu", project=str(tmp_path / "test"), name="exp")
    assert result.seen == 8
    assert result.results() == pytest.approx([float(row[c]) for c in BOX_COLUMNS], abs=1e-6)
    with pytest.raises(UserError, match="is an oriented-box detector, whose oriented boxes it does not merge"):
        test_script.run(weights=str(weights), data=str(data), augment=True)


def grid_labels() -> np.ndarray:
    """(16, 5) xywhr of the oracle's boxes in a 64 px image: 8 x 16 at every P4 cell centre."""
    return np.array([[x, y, 8.0, 16.0, 0.0] for y in GRID for x in GRID])


def grid_data(folder: Path) -> Path:
    """Four 64 x 64 images whose labels are exactly the oracle's boxes (class 0)."""
    from utils.data.dota import obb_label_text
    from utils.tasks.obb.rotated import xywhr2corners

    corners = xywhr2corners(torch.tensor(grid_labels())).numpy() / 64
    for split in ("train", "val"):
        (folder / "grid" / "images" / split).mkdir(parents=True)
        (folder / "grid" / "labels" / split).mkdir(parents=True)
        for i in range(4):
            noise = np.random.default_rng(i).integers(0, 255, (64, 64, 3), dtype=np.uint8)
            cv2.imwrite(str(folder / "grid" / "images" / split / f"{i}.png"), noise)
            (folder / "grid" / "labels" / split / f"{i}.txt").write_text(obb_label_text([0] * 16, corners))
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump({"path": str(folder / "grid"), "train": "images/train", "val": "images/val",
                                    "nc": 3, "names": NAMES}))
    return path


def oracle_weights(folder: Path, jitter: float = 0.0) -> Path:
    """yolo11n-obb whose P4 cells all predict class 0 (logit 10; the other levels and classes -20) and an 8 x 16
    box (sides of 1/4 and 1/2 a cell from the centre along the box's axes, turned a quarter: 16 wide, 8 high in its
    own frame), whatever the image: the last convolutions' weights 0 (``jitter``: uniform in +-jitter, for INT8
    quantization, which cannot scale an all-zero weight), their biases set."""
    from models.yolo import Model
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = Model("yolo11n-obb.yaml", nc=3)
    model.names = list(NAMES)
    head = model.head
    with torch.no_grad():
        for level in range(3):
            for branch in (head.cv2, head.cv3, head.cv4):
                branch[level][-1].weight.uniform_(-jitter, jitter)
            head.cv3[level][-1].bias.fill_(-20.0)
        head.cv3[1][-1].bias[0] = 10.0
        bins = torch.full((4, head.reg_max), -30.0)
        bins[:, 0] = 0.0
        bins[[0, 2], 1] = 0.0  # left and right: half of bins 0 and 1, 0.5 of a cell (16 px wide in all)
        bins[[1, 3], 1] = -math.log(3)  # top and bottom: 0.25 of a cell (8 px high)
        head.cv2[1][-1].bias.copy_(bins.flatten())
        head.cv4[1][-1].bias.fill_(math.log(3))  # (sigmoid - 1/4) * pi = pi / 2
    return save_checkpoint(new_checkpoint(model), folder / "oracle.pt")


def test_an_oracle_validates_detects_and_exports_its_oriented_boxes(tmp_path: Path) -> None:
    import detect
    import export
    import test as test_script
    from utils.tasks.obb.labels import read_obb_label_file
    from utils.tasks.obb.sample import rotated_boxes

    data, weights = grid_data(tmp_path), oracle_weights(tmp_path)
    found = detect.run(weights=str(weights), source=str(tmp_path / "grid" / "images" / "val"), img_size=64,
                       save_txt=True, line_thickness=1, hide_labels=True, project=str(tmp_path / "detect"),
                       name="exp", device="cpu")
    assert [len(d) for _, d in found.detections] == [16] * 4 and len(found.quads) == 4
    label, expected = found.save_dir / "labels" / "0.txt", grid_labels()
    written, state, _, _ = read_obb_label_file(label, 3)
    assert state == "found" and (written[:, 0] == 0).all()
    boxes = rotated_boxes(written[:, 1:].reshape(-1, 4, 2).astype(np.float64) * 64, 1, 1).numpy()
    order = np.lexsort((boxes[:, 0], boxes[:, 1]))
    np.testing.assert_allclose(boxes[order, :4], expected[:, :4], atol=1e-3)  # the labels' own rectangles
    drawn = cv2.imread(str(found.save_dir / "0.png")).astype(int)
    original = cv2.imread(str(tmp_path / "grid" / "images" / "val" / "0.png")).astype(int)
    changed = (drawn != original).any(2)
    assert changed[18:30, 20].all() and changed[16, 21:27].all()  # the outline of the box centred at (24, 24)
    assert not changed[20:28, 22:27].any()  # and inside it nothing
    options = {"data": str(data), "img_size": 64, "batch_size": 4, "workers": 0, "device": "cpu"}
    result = test_script.run(weights=str(weights), project=str(tmp_path / "test"), name="pt", **options)
    assert result.seen == 4 and result.n_labels == 64 and 0.3 < result.map50 <= 1.0  # padded cells: false ones
    onnx = export.run(weights=str(weights), include=["onnx"], img_size=[64], dynamic=True, device="cpu")[0]
    exported = test_script.run(weights=str(onnx), project=str(tmp_path / "test"), name="onnx", **options)
    assert max(abs(a - b) for a, b in zip(exported.results(), result.results())) <= 0.005
    written = export.run(weights=str(weights), include=["torchscript", "onnx", "openvino"], img_size=[64],
                         device="cpu")  # each verified against the .pt as it is written
    assert [p.name for p in written] == ["oracle.torchscript", "oracle.onnx", "oracle_openvino_model"]
    static = written[1]
    exact = test_script.run(weights=str(static), project=str(tmp_path / "test"), name="static", **options)
    assert exact.results()[2:] == pytest.approx((1.0, 1.0))  # no padding: every box right, none wrong


def test_int8_exports_keep_the_oracles_oriented_boxes(tmp_path: Path) -> None:
    """--int8 (ONNX Runtime and OpenVINO) quantizes the convolutions and keeps the head's decoding in float (the
    distribution-focal sums, the angles, the rows that mix pixels with scores): each file's mAP of the polygon IoU
    on the labels, measured at export, is the .pt's within --int8's limit (it was 0 when the decoding was
    quantized into one uint8 scale), and test.py reads the INT8 ONNX file as an oriented-box model."""
    import export
    import test as test_script
    from utils.deploy.formats import MAX_INT8_MAP_DROP

    data, weights = grid_data(tmp_path), oracle_weights(tmp_path, jitter=1e-3)
    results = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", "onnx",
                                            "openvino", "--int8", "--data", str(data), "--calib-images", "4",
                                            "--verify-images", "4"]))
    assert [r.file.name for r in results] == ["oracle-int8.onnx", "oracle-int8_openvino_model"]
    for result in results:
        check = result.verification
        assert result.error is None and check.map_reference > 0.9, result.format
        assert check.map_reference - check.map_export <= MAX_INT8_MAP_DROP, result.format
    found = test_script.run(weights=str(results[0].file), data=str(data), img_size=64, batch_size=4, workers=0,
                            device="cpu", project=str(tmp_path / "test"), name="int8")
    assert found.seen == 4 and found.n_labels == 64 and found.map > 0.9


@pytest.mark.ddp
@pytest.mark.slow
def test_two_ranks_train_and_validate_as_one_process(tmp_path: Path) -> None:
    """One 2-rank run (a restart mid-epoch under torchrun is the shared trainer's, tested for detection and
    segmentation; an OBB model's resume mid-epoch is tested in one process above)."""
    import test as test_script

    data, project = obb_data(tmp_path, 32), tmp_path / "runs"
    code, out = finish(start(torchrun_cmd(2, *obb_args(data, project, "whole", batch=16, epochs=1))))
    assert code == 0, out[-3000:]
    row = results_rows(project / "whole")[-1]
    one = test_script.run(weights=str(project / "whole" / "weights" / "last.pt"), data=str(data), img_size=64,
                          batch_size=16, workers=0, device="cpu", project=str(tmp_path / "test"), name="exp")
    assert one.seen == 8 and one.results() == pytest.approx([float(row[c]) for c in BOX_COLUMNS], abs=1e-6)


def test_an_obb_model_without_data_takes_the_synthetic_oriented_boxes(tmp_path: Path) -> None:
    import train
    from utils.training.builder import prepare_run
    from utils.training.config import RunConfig

    defaults = RunConfig.from_options(train.parse_opt([]))
    config = RunConfig.from_options(train.parse_opt(["--project", str(tmp_path), "--cfg", "yolo11n-obb.yaml"]))
    assert Path(prepare_run(config, defaults)[0].data).name == "synthetic-obb.yaml"
    values = yaml.safe_load((ROOT / "data" / "synthetic-obb.yaml").read_text())
    assert values["synthetic"]["task"] == "obb" and values["names"] == NAMES


@pytest.mark.skipif(missing_packages((("pnnx", "pnnx"),)) != [], reason="pip install -r requirements-export.txt")
def test_yolo26_obb_to_ncnn_is_refused_in_one_line_before_converting(tmp_path: Path) -> None:
    """NCNN ends an end-to-end head's graph at its raw rows (pnnx cannot convert the top-k); YOLO26-obb's carry an
    angle column that the raw-row decoder does not read, so the export is refused at once, nothing written."""
    import export
    from models.yolo import Model
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    model = Model("yolo26n-obb.yaml", nc=3)
    model.names = list(NAMES)
    weights = save_checkpoint(new_checkpoint(model), tmp_path / "e2e.pt")
    with pytest.raises(UserError, match=r"raw maps of a xyxy_score_cls head with 1 extra columns \(obb\) are not "
                                        r"decoded here"):
        export.run(weights=str(weights), include=["ncnn"], img_size=[64], device="cpu")
    assert not (tmp_path / "e2e_ncnn_model").exists()
