"""benchmarks/bench_large_batch.py: what it reads from a run (mAP@.5 per epoch, the optimizer line) and the
one-class copy of the generated set."""

from __future__ import annotations

from pathlib import Path

import yaml

from benchmarks.bench_large_batch import epoch_maps, one_class, optimizer_line


def test_the_maps_of_every_epoch_and_the_optimizer_line(tmp_path: Path) -> None:
    csv = tmp_path / "results.csv"
    csv.write_text("epoch, metrics/precision, metrics/mAP_0.5, metrics/mAP_0.5:0.95\n0, 0.2, 0.40, 0.1\n"
                   "1, 0.3, 0.35, 0.2\n")
    assert epoch_maps(csv) == [0.40, 0.35]
    log = "optimizer: batch 128 = 2 x 64: lr0 x 1.414 (AdamW), warmup ...; AdamW(lr=0.00282843) with parameter groups"
    assert optimizer_line(log) == "AdamW(lr=0.00282843); batch 128 = 2 x 64: lr0 x 1.414 (AdamW), warmup ..."
    assert optimizer_line("AdamW(lr=0.002) with parameter groups") == "AdamW(lr=0.002); no rule"


def test_one_class_relabels_every_shape(tmp_path: Path) -> None:
    labels = tmp_path / "shapes" / "labels" / "train"
    labels.mkdir(parents=True)
    (labels / "a.txt").write_text("2 0.5 0.5 0.2 0.2\n1 0.1 0.2 0.3 0.4\n")
    data = tmp_path / "shapes.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path / "shapes"), "train": "images/train", "val": "images/val",
                                    "nc": 3, "names": ["circle", "square", "triangle"]}))
    single = one_class(data)
    assert (labels / "a.txt").read_text() == "0 0.5 0.5 0.2 0.2\n0 0.1 0.2 0.3 0.4\n"
    assert yaml.safe_load(single.read_text()) == {**yaml.safe_load(data.read_text()), "nc": 1, "names": ["shape"]}
