"""Everything around the model works for the anchor-free families (YOLOv8, YOLO11) and YOLO26's end-to-end head:
--evolve, --freeze, resume mid-epoch at another world size, 2-rank gloo DDP, test.py against COCOeval, detect.py,
TTA where it applies. Tiny models: the family YAMLs at 1/16 width, 64 px, 1 epoch."""

from __future__ import annotations

import json
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


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.parametrize("family", ["yolov8", "yolo11"])
def test_an_anchor_free_family_trains_and_validates_in_two_gloo_processes(family: str, family_cfgs, tiny_dataset,
                                                                          tmp_path) -> None:
    """YOLOv8 and YOLO11 (YOLO26: the resume test above) under torchrun, 2 gloo processes, 1 epoch with sharded
    validation: both ranks exit 0, results.csv holds the family's named losses (box, cls, dfl; no obj) and the
    metrics, last.pt rebuilds as the family's model with every step counted once."""
    import csv

    from tests.helpers import run_job, torchrun_cmd, train_args
    from utils.weights.checkpoint import load_checkpoint, model_from_checkpoint

    run_dir = tmp_path / "exp"
    code, out = run_job(torchrun_cmd(2, *train_args(tiny_dataset, family_cfgs[family], tmp_path, "--name", "exp",
                                                    "--ddp-timeout", "120", epochs=1)))
    assert code == 0, out[-3000:]
    assert "batch 4 per rank, 2 ranks" in out and out.count("1 epochs completed in") == 1, out[-3000:]
    with open(run_dir / "results.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert [k for k in row if k.endswith("_loss")] == ["train/box_loss", "train/cls_loss", "train/dfl_loss"], row
    assert all(0 < float(row[f"train/{name}_loss"]) < 100 for name in ("box", "cls", "dfl")), row
    assert {"metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95"} <= set(row)
    ckpt = load_checkpoint(run_dir / "weights" / "last.pt")
    assert (ckpt["family"], ckpt["task"]) == (family, "detect")
    assert ckpt["train_state"]["states"]["updater"]["iteration"] == 3  # 24 images, 8 a step (4 on each rank)
    model = model_from_checkpoint(ckpt)
    assert model.head.family == family and model.head.contract.layout == "xywh_cls"


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


@pytest.fixture(scope="module")
def coco_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data YAML whose val split is a COCO file of 60 synthetic images (its own image and category ids, crowd
    boxes): tests/test_datasets.py's."""
    from tests.test_datasets import _coco_val_set

    return _coco_val_set(tmp_path_factory.mktemp("coco_split") / "synthetic")


def in_layout(rows: torch.Tensor, layout: str) -> torch.Tensor:
    """An oracle's YOLOv5-layout rows (k, 5 + nc) as a head of ``layout`` lays them out: ``xywh_cls`` with the
    objectness folded into the class scores, ``xyxy_score_cls`` as final detections."""
    from utils.boxes import xywh2xyxy

    scores = rows[:, 5:] * rows[:, 4:5]
    if layout == "xywh_cls":
        return torch.cat((rows[:, :4], scores), 1)
    conf, cls = scores.max(1, keepdim=True)
    return torch.cat((xywh2xyxy(rows[:, :4]), conf, cls.float()), 1)


@pytest.mark.parametrize("family", ["yolo11", "yolo26"])
def test_test_py_save_json_of_a_familys_checkpoint_agrees_with_cocoeval(family: str, family_cfgs, coco_split,
                                                                         tmp_path, monkeypatch) -> None:
    """test.py --save-json on a COCO-file split with a YOLO11 (NMS) or YOLO26 (final rows, no NMS) checkpoint: its
    mAP@.5:.95 and mAP@.5 within 0.005 of pycocotools' COCOeval bbox on the JSON it wrote, and equal to what it
    reports. A tiny model trained for seconds detects nothing, so the model's output rows (its head's shape, read
    by its head's contract) are replaced by an oracle's, laid out so: jittered labels, some of the wrong class, and
    spurious boxes, for a mAP well away from 0 and 1."""
    from models.yolo import Model
    from tests.helpers import load_script, oracle_batch
    from tests.test_datasets import _cocoeval
    from utils.data.synthetic import SYNTHETIC_NAMES
    from utils.deploy.runtime import InferenceModel
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    test_script = load_script("test")
    torch.manual_seed(0)
    model = Model(family_cfgs[family])
    model.names = list(SYNTHETIC_NAMES)
    weights = save_checkpoint(new_checkpoint(model), tmp_path / f"{family}.pt")
    oracle: dict[bytes, torch.Tensor] = {}  # an image's bytes (as the loader gives it) -> its oracle rows

    def create_dataloader(*args, **kwargs):
        loader, dataset = real_loader(*args, **kwargs)
        for imgs, targets, paths, *_ in loader:
            for image, rows in zip(imgs, oracle_batch(imgs, targets, paths)):
                oracle[image.contiguous().numpy().tobytes()] = rows[rows[:, 4] > 0]
        return loader, dataset

    def as_module(self: InferenceModel) -> torch.nn.Module:
        module = real_as_module(self)
        head_forward, layout = module.forward, module.head.contract.layout

        def forward(x: torch.Tensor) -> torch.Tensor:
            out = head_forward(x)
            replayed = torch.zeros_like(out)  # rows of score 0 beyond the oracle's: below any threshold
            for i, image in enumerate(x):
                rows = oracle.get((image * 255).round().to(torch.uint8).contiguous().numpy().tobytes())
                if rows is not None:  # None: test.py's warm-up call
                    replayed[i, :len(rows)] = in_layout(rows, layout)
            return replayed

        module.forward = forward
        return module

    real_loader, real_as_module = test_script.create_dataloader, InferenceModel.as_module
    monkeypatch.setattr(test_script, "create_dataloader", create_dataloader)
    monkeypatch.setattr(InferenceModel, "as_module", as_module)
    result = test_script.run(weights=weights, data=coco_split, img=96, batch_size=16, device="cpu", workers=0,
                             save_json=True, project=tmp_path / "runs", name="val")
    assert result.seen == 60 and len(oracle) == 60
    rows = json.loads(result.json_path.read_text())
    assert {r["category_id"] for r in rows} == {2, 5, 9}  # the file's own category ids
    n_oracle = sum(len(r) for r in oracle.values())
    assert len(rows) == n_oracle if family == "yolo26" else 0.9 * n_oracle < len(rows) <= n_oracle  # NMS or none
    assert 0.1 < result.map < result.map50 < 0.99
    coco_map, coco_map50 = _cocoeval(coco_split.parent / "instances_val.json", result.json_path)
    assert abs(result.map - coco_map) < 0.005 and abs(result.map50 - coco_map50) < 0.005
    assert result.coco_map == pytest.approx(coco_map)  # what --save-json reports: COCOeval on the split's file


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
                       augment=True, conf_thres=0.0, max_det=5, device="cpu", nosave=True,
                       project=tmp_path / "detect")
    assert len(found.detections) == 12 and all(d.shape == (5, 6) for _, d in found.detections)


@pytest.mark.slow
@pytest.mark.parametrize("family, names", [("yolo11", ["torchscript", "onnx", "openvino", "ncnn", "coreml"]),
                                           ("yolov8", ["torchscript", "onnx"])])
def test_every_non_tensorflow_format_of_an_anchor_free_family_exports_verified(family: str, names: list[str],
                                                                             family_cfgs, tmp_path) -> None:
    """TorchScript, ONNX, OpenVINO, NCNN (decoded graph) and Core ML (attention included) of a tiny YOLO11, and
    TorchScript and ONNX of a tiny YOLOv8 (its C2f blocks and plain class branch; the rest of its head and blocks
    are YOLO11's), each verified against the .pt by export.py; the TorchScript and ONNX files read back by the
    runtime give the .pt's detections. SavedModel and TFLite of all three families:
    tests/utils/deploy/test_tf_graph_families.py; YOLO26 in every format: tests/test_release_finetune.py."""
    import export
    from models.yolo import Model
    from utils.deploy.runtime import InferenceModel
    from utils.tasks.contract import OutputContract
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = Model(family_cfgs[family]).eval()
    weights = save_checkpoint(new_checkpoint(model), tmp_path / f"{family}.pt")
    results = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--include", *names]))
    assert [r.format for r in results] == names
    assert all(r.error is None and r.file.exists() and r.verification is not None for r in results)
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(images)
    for result in results[:2]:  # the rows as the .pt's: read by the runtime with the contract the file records
        exported = InferenceModel(result.file, trusted=True)
        assert exported.contract == OutputContract("xywh_cls", 3), result.format
        torch.testing.assert_close(exported(images).float(), expected, atol=1e-3, rtol=1e-4)
