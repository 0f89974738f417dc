"""Pose (keypoints) and YOLO26-seg through the same train.py, Trainer, DDP, resume and test.py as detection, on the
built-in synthetic pose set's figures (tiny: 64 px, 16-128 images, 1-2 epochs).

- one process, in this process: yolo11n-pose trains (box, pose, kobj, cls, dfl losses; box and keypoint metrics in
  results.csv), an interrupted run resumed mid-epoch equals the uninterrupted one bit for bit, and test.py on its
  weights reports the box then the keypoint figures of its last epoch, writes keypoints in its predictions JSON and
  runs --augment (the mirrored pass's keypoints swapped back by the data's flip_idx);
- YOLO26: yolo26n-pose (its flow's rle term) and yolo26n-seg (the semantic term) each train a step;
- two gloo ranks under torchrun: yolo11n-pose killed on rank 1 mid-epoch, restarted by torchrun from the step's
  last.pt, ends with the weights of an uninterrupted 2-rank run, and its sharded validation gives the keypoint
  figures test.py gives in one process;
- without --data a pose model trains on data/synthetic-pose.yaml, and a data set's kpt_shape and flip_idx decide
  the head it is built with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import ROOT, csv_epochs, results_rows, weights_diff
from tests.plugins.faults import FailAt
from tests.test_train_segment import restarted_two_ranks_exactly, seg_args, seg_data
from utils.weights.checkpoint import load_checkpoint

POSE_COLUMNS = ["metrics/pose_precision", "metrics/pose_recall", "metrics/pose_mAP_0.5", "metrics/pose_mAP_0.5:0.95"]
FLIP = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]


def pose_data(folder: Path, n_train: int, **extra: object) -> Path:
    """A data YAML of the synthetic pose set (64-80 px images, 8 val images, COCO's 17 keypoints)."""
    path = folder / "pose.yaml"
    path.write_text(yaml.safe_dump({"synthetic": {"task": "pose", "n_train": n_train, "n_val": 8,
                                                  "img_size": [64, 80]},
                                    "path": str(folder / "set"), "train": "images/train", "val": "images/val",
                                    "nc": 1, "names": ["figure"], "kpt_shape": [17, 3], "flip_idx": FLIP, **extra}))
    return path


def test_yolo11n_pose_trains_resumes_exactly_and_tests_with_keypoints(tmp_path: Path,
                                                                      in_process: Callable[..., int]) -> None:
    import test as test_script

    data, project = pose_data(tmp_path, 16), tmp_path / "runs"
    args = lambda name: seg_args(data, "yolo11n-pose.yaml", project, name, "--save-interval-steps", "1")  # noqa: E731
    assert in_process(args("whole")) == 0
    row = results_rows(project / "whole")[-1]
    assert list(row)[1:6] == ["train/box_loss", "train/pose_loss", "train/kobj_loss", "train/cls_loss",
                              "train/dfl_loss"]
    assert all(c in row for c in POSE_COLUMNS) and 0 < float(row["train/pose_loss"]) < 20
    ckpt = load_checkpoint(project / "whole" / "weights" / "last.pt")
    assert (ckpt["family"], ckpt["task"]) == ("yolo11", "pose") and ckpt["model_yaml"]["flip_idx"] == FLIP
    with pytest.raises(RuntimeError, match="test fault injected at epoch 1 batch 1"):
        in_process(args("cut"), FailAt(rank=0, epoch=1, batch=1))  # last.pt: after batch 0 of epoch 1
    cut_last = project / "cut" / "weights" / "last.pt"
    assert load_checkpoint(cut_last)["train_state"]["position"]["samples_seen"] == 8
    assert in_process([str(ROOT / "train.py"), "--resume", str(cut_last)]) == 0
    assert csv_epochs(project / "cut") == ["0", "1"]
    assert weights_diff(project / "whole" / "weights" / "last.pt", cut_last) == 0.0
    weights = project / "whole" / "weights" / "last.pt"
    result = test_script.run(weights=str(weights), data=str(data), img_size=64, batch_size=8, workers=0,
                             device="cpu", save_json=True, project=str(tmp_path / "test"), name="exp")
    assert result.pose is not None and result.seen == 8
    assert list(result.named_results())[4:] == [c.removeprefix("metrics/") for c in POSE_COLUMNS]
    assert abs(float(result.pose.mean_results()[3]) - float(row["metrics/pose_mAP_0.5:0.95"])) < 1e-6
    predictions = json.loads((tmp_path / "test" / "exp" / "predictions.json").read_text())
    assert predictions and all(len(p["keypoints"]) == 3 * 17 for p in predictions)
    augmented = test_script.run(weights=str(weights), data=str(data), img_size=64, batch_size=8, workers=0,
                                device="cpu", augment=True, project=str(tmp_path / "test"), name="tta")
    assert augmented.pose is not None and augmented.seen == 8


@pytest.mark.parametrize(("cfg", "task", "losses"), [
    ("yolo26n-pose.yaml", "pose", ["train/box_loss", "train/pose_loss", "train/kobj_loss", "train/cls_loss",
                                   "train/l1_loss", "train/rle_loss"]),
    ("yolo26n-seg.yaml", "segment", ["train/box_loss", "train/seg_loss", "train/cls_loss", "train/l1_loss",
                                     "train/semseg_loss"])])
def test_yolo26_pose_and_seg_train_with_their_own_terms(tmp_path: Path, in_process: Callable[..., int], cfg: str,
                                                        task: str, losses: list[str]) -> None:
    data = pose_data(tmp_path, 8) if task == "pose" else seg_data(tmp_path, 8)
    project = tmp_path / "runs"
    assert in_process(seg_args(data, cfg, project, "run", epochs=1)) == 0
    row = results_rows(project / "run")[-1]
    assert list(row)[1:1 + len(losses)] == losses
    assert all(0 <= float(row[name]) < 50 for name in losses), row
    assert load_checkpoint(project / "run" / "weights" / "last.pt")["task"] == task


@pytest.mark.ddp
@pytest.mark.slow
def test_pose_two_ranks_restart_mid_epoch_exactly_and_validate_as_one_process(tmp_path: Path) -> None:
    import test as test_script

    data, project = pose_data(tmp_path, 128), tmp_path / "runs"
    row = results_rows(restarted_two_ranks_exactly(data, "yolo11n-pose.yaml", project))[-1]
    one = test_script.run(weights=str(project / "whole" / "weights" / "last.pt"), data=str(data), img_size=64,
                          batch_size=64, workers=0, device="cpu", project=str(tmp_path / "test"), name="exp")
    ours = [float(row[c]) for c in (*POSE_COLUMNS, "metrics/mAP_0.5:0.95")]
    theirs = [*map(float, one.pose.mean_results()), one.map]
    assert max(abs(a - b) for a, b in zip(ours, theirs)) < 1e-6, (ours, theirs)


def test_a_pose_model_without_data_takes_the_synthetic_pose_set_and_the_datas_keypoints(tmp_path: Path) -> None:
    import train
    from utils.training.builder import build_model, prepare_run
    from utils.training.config import RunConfig
    from utils.training.families import get_family

    defaults = RunConfig.from_options(train.parse_opt([]))
    config = lambda *a: RunConfig.from_options(train.parse_opt(["--project", str(tmp_path), *a]))  # noqa: E731
    chosen = prepare_run(config("--cfg", "yolo11n-pose.yaml"), defaults)[0]
    assert Path(chosen.data).name == "synthetic-pose.yaml" and Path(chosen.hyp).name == "hyp.anchor-free.yaml"
    shipped = yaml.safe_load((ROOT / "data" / "synthetic-pose.yaml").read_text())
    assert shipped["kpt_shape"] == [17, 3] and shipped["flip_idx"] == FLIP and shipped["synthetic"]["task"] == "pose"
    assert get_family("yolo26").loss_for("pose").__name__ == "build"
    options = {"kpt_shape": [5, 2], "flip_idx": [0, 2, 1, 4, 3], "kpt_sigmas": [0.1] * 5}
    cpu = torch.device("cpu")
    model, _ = build_model(config("--cfg", "yolo11n-pose.yaml"), 2, ["a", "b"], cpu, options)
    assert (model.head.kpt_shape, model.head.flip_idx, model.head.nc) == ([5, 2], [0, 2, 1, 4, 3], 2)
    assert model.head.contract.extra == 15 and "kpt_sigmas" not in model.yaml  # sigmas are the data's, not the model's
    plain, _ = build_model(config("--cfg", "yolo11n.yaml"), 2, ["a", "b"], cpu, options)  # a detector: unchanged
    assert "kpt_shape" not in plain.yaml


def test_evolve_mutates_the_pose_gains_within_their_bounds(tmp_path: Path) -> None:
    """--evolve on a pose model mutates its task's gains (pose, kobj, rle: utils/tasks/registry.py) beside the
    family's, each within its bounds; the fitness it ranks by weighs the keypoint columns."""
    import train
    from utils.hyp import load_hyp
    from utils.tasks.registry import get_task
    from utils.training.config import RunConfig
    from utils.training.evolve import evolve

    config = RunConfig.from_options(train.parse_opt(["--cfg", "yolo11n-pose.yaml", "--project", str(tmp_path),
                                                     "--evolve", "8", "--seed", "1"]))
    base = load_hyp(ROOT / "data" / "hyps" / "hyp.anchor-free.yaml")
    seen = []

    def fake_train(hyp: dict, run: RunConfig, device: torch.device) -> tuple[dict, dict]:
        seen.append(dict(hyp))
        score = 1.0 / (1.0 + abs(float(hyp["pose"]) - 20.0))  # prefers a larger keypoint gain
        return {"mAP_0.5": 0.5, "mAP_0.5:0.95": 0.5, **{f"pose_{n}": score for n in
                                                         ("precision", "recall", "mAP_0.5", "mAP_0.5:0.95")}}, hyp

    best = evolve(base, config, torch.device("cpu"), fake_train)
    bounds = get_task("pose").evolve_bounds
    assert {"pose", "kobj", "rle"} <= set(bounds)
    assert any(h["pose"] != base["pose"] for h in seen) and any(h["kobj"] != base["kobj"] for h in seen)
    for hyp in seen:
        for key in ("pose", "kobj", "rle"):
            assert bounds[key][1] <= hyp[key] <= bounds[key][2], (key, hyp[key])
    assert abs(best["pose"] - 20.0) == min(abs(h["pose"] - 20.0) for h in seen)  # ranked by the keypoint columns
