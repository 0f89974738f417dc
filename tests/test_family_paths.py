"""Everything around the model works for the anchor-free families (YOLOv8, YOLO11) and YOLO26's end-to-end head:
--evolve, --freeze, resume mid-epoch at another world size, 2-rank gloo DDP, test.py against COCOeval, detect.py,
TTA where it applies. Tiny models: the family YAMLs at 1/16 width, 64 px, 1 epoch."""

from __future__ import annotations

from pathlib import Path

import cv2
import pytest
import torch
import yaml

import train

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("yolov8", "yolo11", "yolo26")

pytestmark = pytest.mark.usefixtures("one_thread_and_clean_logger")


@pytest.fixture(scope="session")
def family_cfgs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's YAML at scale n with 1/16 width and 3 classes, as a --cfg file."""
    folder = tmp_path_factory.mktemp("family_cfgs")
    files = {}
    for family in FAMILIES:
        cfg = yaml.safe_load((ROOT / "models" / f"{family}.yaml").read_text())
        cfg.update(nc=3, scale="n", scales={"n": [0.33, 0.0625, 1024]})
        files[family] = folder / f"{family}-tiny.yaml"
        files[family].write_text(yaml.safe_dump(cfg))
    return files


def args(cfg: Path, data: Path, project: Path, *extra: str) -> list[str]:
    return ["--cfg", str(cfg), "--data", str(data), "--img", "64", "--batch-size", "8", "--epochs", "1", "--device",
            "cpu", "--workers", "0", "--project", str(project), "--noplots", "--loggers", "csv", *extra]


def test_evolve_mutates_and_records_the_values_an_auto_optimizer_run_trains_with(family_cfgs, tiny_dataset,
                                                                                 tmp_path) -> None:
    """--optimizer auto replaces the hyp file's lr0 (0.01) and momentum by its rule's (AdamW, 0.001429 for 3
    classes): generation 0 records those, later generations mutate them and train with what they record, and the
    returned TrainResult.hyp is what the fittest generation trained with, not the file's values."""
    result = train.main(train.parse_opt(args(family_cfgs["yolo11"], tiny_dataset, tmp_path, "--evolve", "2")))
    evolve_dir = tmp_path / "exp-evolve"
    with open(evolve_dir / "evolve.csv") as f:
        header, *rows = [line.strip().split(",") for line in f]
    recorded = [dict(zip(header, map(float, row))) for row in rows]
    used = [yaml.safe_load((evolve_dir / f"gen{g}" / "hyp.yaml").read_text()) for g in range(2)]
    assert used[0]["lr0"] == recorded[0]["lr0"] == 0.001429 and used[0]["momentum"] == 0.9
    assert all(u["optimizer"] == "AdamW" for u in used)
    for u, r in zip(used, recorded):  # what each generation trained with is what evolve.csv says
        assert all(u[k] == pytest.approx(r[k], rel=1e-4) for k in ("lr0", "momentum", "box", "cls", "dfl"))
    assert any(used[1][k] != used[0][k] for k in ("lr0", "momentum", "box", "cls", "dfl", "hsv_h", "scale"))
    assert result.hyp in used and result.hyp["lr0"] != 0.01
    assert yaml.safe_load((evolve_dir / "hyp_evolve.yaml").read_text())["optimizer"] == "AdamW"


@pytest.mark.slow
@pytest.mark.ddp
def test_yolo26_stopped_mid_epoch_resumes_in_two_gloo_processes(family_cfgs, tiny_dataset, tmp_path) -> None:
    """YOLO26 (its loss told the epoch, two branch sets) stopped by SIGTERM after batch 1 of epoch 0 in one process,
    resumed by torchrun in 2 gloo processes at batch 2 of the same epoch, to the end: both epochs in results.csv,
    every step counted once, the checkpoint still a YOLO26 one."""
    from tests.helpers import ROOT as REPO
    from tests.helpers import csv_epochs, finish, start, torchrun_cmd, train_args
    from tests.plugins.faults import FailAt
    from utils.cli import run_main
    from utils.weights.checkpoint import load_checkpoint

    project, run_dir = tmp_path / "runs", tmp_path / "runs" / "exp"
    argv = train_args(tiny_dataset, family_cfgs["yolo26"], project, "--name", "exp", "--noval", epochs=2)
    code = run_main(lambda opt: train.main(opt, [FailAt(rank=0, epoch=0, batch=1, action="term")]),
                    train.parse_opt(argv[1:]), "train")
    assert code == 143
    position = load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]["position"]
    assert (position["epoch"], position["samples_seen"]) == (0, 16)  # batches 0 and 1 of 8 images
    code, out = finish(start(torchrun_cmd(2, str(REPO / "train.py"), "--resume", str(run_dir))))
    assert code == 0, out[-3000:]
    assert "processes 1 -> 2, batch per process 8 -> 4" in out and "Resuming from epoch 0 of 2, batch 2" in out
    assert csv_epochs(run_dir) == ["0", "1"]
    ckpt = load_checkpoint(run_dir / "weights" / "last.pt")
    assert ckpt["family"] == "yolo26" and ckpt["train_state"]["states"]["updater"]["iteration"] == 6


@pytest.mark.parametrize("family", FAMILIES)
def test_trackers_image_logging_draws_each_familys_boxes(family: str, family_cfgs, tmp_path) -> None:
    """The trackers' validation images: each head's output through the one post-processing call, boxes drawn."""
    from types import SimpleNamespace

    from models.yolo import Model
    from utils.loggers.tracking import draw_predictions

    torch.manual_seed(0)
    model = Model(family_cfgs[family]).eval()
    head = model.head
    for branch in [*head.cv3, *getattr(head, "one2one_cv3", [])]:
        torch.nn.init.constant_(branch[-1].bias, 6.0)  # every class scored ~1: boxes certain to be drawn
    image = torch.full((3, 64, 64), 114, dtype=torch.uint8)
    view = SimpleNamespace(ema_model=model, names=["a", "b", "c"],
                           val_loader=SimpleNamespace(dataset=[(image, None, f"images/val/{i}.jpg", None)
                                                               for i in range(2)]))
    written = draw_predictions(view, tmp_path / "drawn")
    assert [p.name for p in written] == ["0.jpg", "1.jpg"]
    drawn = cv2.imread(str(written[0]))
    assert drawn.shape == (64, 64, 3) and (abs(drawn.astype(int) - 114).max(-1) > 40).sum() > 50  # box lines
    assert model.training is False


def test_tta_runs_for_an_anchor_free_family_in_test_and_detect(family_cfgs, tiny_dataset, tmp_path) -> None:
    """--augment applies to one-row-per-cell heads (YOLOv8/YOLO11): three passes merged before NMS, in test.py and
    detect.py; the end-to-end head refuses it in one line (tests/test_release_finetune.py)."""
    import detect
    import test as test_script
    from models.yolo import Model
    from utils.evaluation.tta import augmented_forward, layout_of
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = Model(family_cfgs["yolo11"]).eval()
    model.names = ["circle", "square", "triangle"]
    weights = save_checkpoint(new_checkpoint(model), tmp_path / "yolo11-tiny.pt")
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        plain, merged = model(images), augmented_forward(model, images, layout_of(model))
    assert merged.shape[0] == 1 and merged.shape[2] == plain.shape[2] and merged.shape[1] > plain.shape[1]
    result = test_script.run(weights=weights, data=tiny_dataset, img=64, device="cpu", workers=0, augment=True,
                             project=tmp_path, name="val")
    assert result.seen == 12
    found = detect.run(weights=weights, source=tiny_dataset.parent / "synthetic" / "images" / "val", img=64,
                       augment=True, conf_thres=0.0, max_det=5, device="cpu", nosave=True)
    assert len(found.detections) == 12 and all(d.shape == (5, 6) for _, d in found.detections)


@pytest.mark.slow
def test_every_non_tensorflow_format_of_an_anchor_free_family_exports_verified(family_cfgs, tmp_path) -> None:
    """TorchScript, ONNX, OpenVINO, NCNN (decoded graph) and Core ML (attention included) of a tiny YOLO11 (YOLOv8's
    head and blocks are a subset of its), each verified by export.py; SavedModel and TFLite of all three families:
    tests/utils/deploy/test_tf_graph_families.py; YOLO26 in every format: tests/test_release_finetune.py."""
    family = "yolo11"
    import export
    from models.yolo import Model
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = Model(family_cfgs[family]).eval()
    weights = save_checkpoint(new_checkpoint(model), tmp_path / f"{family}.pt")
    names = ["torchscript", "onnx", "openvino", "ncnn", "coreml"]
    results = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", *names]))
    assert [r.format for r in results] == names
    assert all(r.error is None and r.file.exists() and r.verification is not None for r in results)
