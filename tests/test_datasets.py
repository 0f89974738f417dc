"""Data sets as people have them, end to end: the same set written as YOLO txt, COCO JSON and VOC XML trains to the
same labels and the same first epoch; validation on a COCO JSON split agrees with pycocotools' COCOeval on the
original file; a malformed annotation file stops train.py with one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import train
from tests.helpers import OracleModel, load_script, our_tracebacks
from tests.utils.data.test_formats import CATEGORY_IDS, NAMES, write_sets, yaml_with
from utils.cli import run_main
from utils.data.coco_json import coco_ids
from utils.data.config import load_data_config
from utils.data.datasets import DatasetOptions, YoloDataset
from utils.data.loader import create_dataloader
from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic
from utils.evaluation.evaluate import evaluate
from utils.hyp import load_hyp
from utils.training.builder import TrainData, build_trainer
from utils.training.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train_args(data: Path, cfg: Path, project: Path) -> list[str]:
    return ["--data", str(data), "--cfg", str(cfg), "--weights", "", "--img", "64", "--batch-size", "4", "--epochs",
            "1", "--workers", "0", "--device", "cpu", "--seed", "0", "--project", str(project), "--noautoanchor",
            "--noplots"]


def _first_epoch(data: Path, cfg_file: Path, save_dir: Path) -> tuple[list, torch.Tensor, list[bytes]]:
    """One training epoch on a data YAML's train split, built as train.py builds it (augmenting seeded loader, the
    loss, SGD with warmup, EMA): the labels, the epoch's mean (box, obj, cls) loss, and the weights after it."""
    hyp = load_hyp()
    options = DatasetOptions(img_size=64, batch_size=4, augment=True, hyp=hyp, nc=3, seed=0)
    loader, dataset = create_dataloader(load_data_config(data).train, options, workers=0, shuffle=True)
    # a total batch of 64 (the nominal one) steps after every batch; the 4 images stand for it
    config = RunConfig(cfg=str(cfg_file), epochs=1, batch_size=64, img_size=64, optimizer="SGD", amp="off",
                       save_dir=str(save_dir), noplots=True, noautoanchor=True, seed=0)
    trainer = build_trainer(config, hyp, torch.device("cpu"), data=TrainData(loader, None, dataset, list(NAMES)))
    loss = trainer.train_epoch(0)
    labels = [[Path(f).name for f in dataset.im_files], [lab.tobytes() for lab in dataset.labels]]
    return labels, loss, [v.numpy().tobytes() for v in trainer.model_without_ddp.state_dict().values()]


def test_yolo_coco_and_voc_train_to_identical_labels_and_first_epoch(tiny_cfg_file, tmp_path):
    yamls = write_sets(tmp_path / "set", n_train=4, n_val=1)  # one batch of 4: one optimizer step
    runs = {kind: _first_epoch(data, tiny_cfg_file, tmp_path / kind) for kind, data in yamls.items()}
    assert runs["yolo"][0] == runs["coco"][0] == runs["voc"][0]  # labels bit for bit, in one order
    assert sum(len(b) for b in runs["yolo"][0][1]) > 0
    assert torch.equal(runs["yolo"][1], runs["coco"][1]) and torch.equal(runs["yolo"][1], runs["voc"][1])
    assert runs["yolo"][1].sum() > 0  # the first epoch's (box, obj, cls) loss
    assert runs["yolo"][2] == runs["coco"][2] == runs["voc"][2]  # and the weights it trained


def test_crowd_boxes_and_difficult_objects_are_ignore_regions_unless_kept(tmp_path):
    yamls = write_sets(tmp_path / "set", n_train=3, n_val=1)  # image 0 has a crowd / difficult box [0, 0, 7, 7]
    for kind, crowd in (("coco", 1.0), ("voc", 0.0)):  # crowd: intersection over the detection; difficult: IoU
        dataset = YoloDataset(load_data_config(yamls[kind]).train, img_size=64, nc=3)
        regions = [dataset.ignore_regions(f).tolist() for f in dataset.im_files]
        assert regions == [[[0, 0, 0, 7, 7, crowd]], [], []], kind
        kept = YoloDataset(load_data_config(yaml_with(yamls[kind], keep_crowd=True)).train, img_size=64, nc=3)
        assert [kept.ignore_regions(f).tolist() for f in kept.im_files] == [[], [], []]
        assert len(kept.labels[0]) == len(dataset.labels[0]) + 1  # kept: an ordinary label
    yolo = YoloDataset(load_data_config(yamls["yolo"]).train, img_size=64, nc=3)
    assert not any(len(yolo.ignore_regions(f)) for f in yolo.im_files)


def _coco_val_set(root: Path, n_val: int = 60) -> Path:
    """The synthetic val split as a COCO file with its own ids (image ids 500 + 3i, category ids 2, 5, 9), the
    first object of every other image marked as a crowd box; returns the data YAML."""
    ensure_synthetic(root, n_train=2, n_val=n_val, img_size=(64, 96), seed=3)
    import cv2

    doc: dict = {"images": [], "annotations": [],
                 "categories": [{"id": i, "name": n} for i, n in zip(CATEGORY_IDS, SYNTHETIC_NAMES)]}
    for index, image in enumerate(sorted((root / "images" / "val").glob("*.jpg"))):
        h, w = cv2.imread(str(image)).shape[:2]
        image_id = 500 + 3 * index
        doc["images"].append({"id": image_id, "file_name": image.name, "width": w, "height": h})
        rows = np.loadtxt(root / "labels" / "val" / f"{image.stem}.txt", ndmin=2)
        boxes = [(int(c), [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], int(i == 0 and index % 2 == 0))
                 for i, (c, cx, cy, bw, bh) in enumerate(rows)]
        for c, box, crowd in boxes:
            doc["annotations"].append({"id": len(doc["annotations"]) + 1, "image_id": image_id, "iscrowd": crowd,
                                       "category_id": CATEGORY_IDS[c], "bbox": box, "area": box[2] * box[3]})
    (root / "instances_val.json").write_text(json.dumps(doc))
    data = root / "coco-split.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": {
        "coco": "instances_val.json", "images": "images/val"}, "nc": 3, "names": list(SYNTHETIC_NAMES)}))
    return data


def _cocoeval(annotations: Path, predictions: Path, use_cats: bool = True) -> tuple[float, float]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = COCO(str(annotations))
    evaluator = COCOeval(gt, gt.loadRes(str(predictions)), "bbox")
    evaluator.params.useCats = int(use_cats)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return float(evaluator.stats[0]), float(evaluator.stats[1])


def _crowd_split_oracle(root: Path) -> tuple:
    """The COCO val split of _coco_val_set, its shard loader and dataset, and an oracle detector that also detects
    the crowd boxes (built from a keep_crowd loader: the same images in the same batches)."""
    split = load_data_config(_coco_val_set(root)).val[0]
    options = DatasetOptions(img_size=96, batch_size=16, rect=True, pad=0.5, nc=3)
    loader, dataset = create_dataloader([split], options, workers=0, shard_eval=True)
    with_crowd, _ = create_dataloader([replace(split, keep_crowd=True)], options, workers=0, shard_eval=True)
    return split, loader, dataset, OracleModel(with_crowd)


def test_coco_split_map_agrees_with_cocoeval_on_the_original_file(tmp_path):
    pytest.importorskip("pycocotools")
    split, loader, dataset, oracle = _crowd_split_oracle(tmp_path / "synthetic")
    result = evaluate(oracle, loader, "cpu", SYNTHETIC_NAMES, save_dir=tmp_path, save_json=True,
                      anno_json=split.annotations, coco_ids=coco_ids(split))
    rows = json.loads(result.json_path.read_text())
    file_ids = {image["id"] for image in json.loads(split.annotations.read_text())["images"]}
    assert {r["image_id"] for r in rows} <= file_ids and len({r["image_id"] for r in rows}) == 60
    assert {r["category_id"] for r in rows} == set(CATEGORY_IDS)
    assert 0.1 < result.map < result.map50 < 0.99
    coco_map, coco_map50 = _cocoeval(split.annotations, result.json_path)
    assert abs(result.map - coco_map) < 0.005 and abs(result.map50 - coco_map50) < 0.005
    assert result.coco_map == pytest.approx(coco_map)  # what --save-json reports: COCOeval on the original file
    assert sum(len(dataset.ignore_regions(f)) for f in dataset.im_files) == 30  # every other image's crowd box
    dataset.ignore_regions = lambda path: np.zeros((0, 6))  # the rule off: the crowd detections count as FPs
    oracle.calls = 0
    counted = evaluate(oracle, loader, "cpu", SYNTHETIC_NAMES)
    assert coco_map - counted.map > 0.005 and coco_map50 - counted.map50 > 0.01  # beyond the tolerance above


def test_single_class_validation_ignores_crowd_boxes_of_every_class(tmp_path):
    pytest.importorskip("pycocotools")
    split, loader, _, oracle = _crowd_split_oracle(tmp_path / "synthetic")
    result = evaluate(oracle, loader, "cpu", SYNTHETIC_NAMES, single_cls=True, save_dir=tmp_path, save_json=True,
                      coco_ids=coco_ids(split))
    coco_map, coco_map50 = _cocoeval(split.annotations, result.json_path, use_cats=False)  # COCOeval, one class
    assert 0.1 < result.map < result.map50 < 0.99
    assert abs(result.map - coco_map) < 0.005 and abs(result.map50 - coco_map50) < 0.005


def test_test_py_save_json_writes_the_files_ids(tiny_weights, tmp_path):
    data = _coco_val_set(tmp_path / "synthetic", n_val=8)
    test_script = load_script("test")
    opt = test_script.parse_opt(["--weights", str(tiny_weights), "--data", str(data), "--img", "64", "--device",
                                 "cpu", "--workers", "0", "--save-json", "--project", str(tmp_path / "runs"),
                                 "--conf-thres", "0.001"])
    result = test_script.main(opt)
    rows = json.loads(result.json_path.read_text())
    assert rows and {r["image_id"] for r in rows} <= set(range(500, 524, 3))
    assert {r["category_id"] for r in rows} <= set(CATEGORY_IDS)
    assert result.coco_map is not None and abs(result.coco_map - result.map) < 0.005


def test_a_malformed_annotation_file_stops_train_py_with_one_line(tiny_cfg_file, tmp_path, capsys):
    yamls = write_sets(tmp_path / "set", n_train=2, n_val=1)
    annotations = yamls["coco"].parent / "annotations" / "instances_train.json"
    annotations.write_text('{"images": [], "categories": [}')
    opt = train.parse_opt(_train_args(yamls["coco"], tiny_cfg_file, tmp_path / "runs"))
    assert run_main(train.main, opt, "train") == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"train: error: {annotations}: not valid JSON (Expecting value at line 1, "
                                        "column 31); fix or re-export the annotation file"]
    assert not our_tracebacks(err)


DDP_WORKER = '''
import json, sys
from pathlib import Path
from utils.data import annotations
from utils.data.config import load_data_config
from utils.data.datasets import DatasetOptions, YoloDataset
from utils.data.loader import create_dataloader
from utils.distributed import comm as dist

parses, real_parse = [0], annotations.scan_files
annotations.scan_files = lambda *a, **k: parses.__setitem__(0, parses[0] + 1) or real_parse(*a, **k)
dist.init_distributed(device="cpu", backend="gloo", timeout_s=60, long_timeout_s=120)
try:
    split = load_data_config(sys.argv[1]).train
    loader, dataset = create_dataloader(split, DatasetOptions(img_size=64, batch_size=2, nc=3), workers=0)
    result = {"parses": parses[0], "found": dataset.scan.found, "labels": [lab.tolist() for lab in dataset.labels]}
    Path(sys.argv[2], f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
finally:
    dist.cleanup()
'''


@pytest.mark.ddp
def test_two_ranks_parse_a_coco_split_once(tmp_path):
    from tests.helpers import ROOT, job_env, run_job, torchrun_cmd

    yamls = write_sets(tmp_path / "set", n_train=4, n_val=1)
    worker = tmp_path / "coco_ddp_worker.py"
    worker.write_text(DDP_WORKER)
    code, output = run_job(torchrun_cmd(2, str(worker), str(yamls["coco"]), str(tmp_path)),
                           env=job_env(PYTHONPATH=str(ROOT)))
    assert code == 0, output[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["parses"] for r in ranks] == [1, 0]  # local rank 0 parsed and cached; rank 1 read the cache
    assert ranks[0]["labels"] == ranks[1]["labels"] and ranks[0]["found"] == 4
