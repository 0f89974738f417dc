"""benchmarks/bench_recipe.py: what it reads from a run (best metrics of results.csv, the optimizer line) and the
variants it compares."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_recipe import VARIANTS, best_metrics, chosen_optimizer, parse_opt


def test_the_best_of_each_metric_over_the_epochs(tmp_path: Path) -> None:
    csv = tmp_path / "results.csv"
    csv.write_text("epoch,train/box_loss,metrics/precision,metrics/recall,metrics/mAP_0.5,metrics/mAP_0.5:0.95\n"
                   "0,0.1,0.2,0.3,0.40,0.10\n1,0.1,0.2,0.3,0.35,0.20\n2,0.1,0.2,0.3,0.38,0.15\n")
    assert best_metrics(csv) == (0.40, 0.20)  # each metric's own best epoch
    (tmp_path / "empty.csv").write_text("epoch,metrics/mAP_0.5,metrics/mAP_0.5:0.95\n")
    with pytest.raises(ValueError, match="no epochs"):
        best_metrics(tmp_path / "empty.csv")


def test_the_optimizer_line_and_the_variants() -> None:
    log = "x\noptimizer: auto chose AdamW (lr0=0.001429) ...: AdamW(lr=0.001429) with parameter groups 3 bias\n"
    assert chosen_optimizer(log) == "auto chose AdamW (lr0=0.001429) ...: AdamW(lr=0.001429)"
    assert chosen_optimizer("nothing") == ""
    assert all(changes["close_mosaic"] in (0, 10) for _, changes in VARIANTS.values())  # each states its own
    assert VARIANTS["sgd"][0] == ["--optimizer", "SGD"] and VARIANTS["auto"][0] == ["--optimizer", "auto"]
    quick = parse_opt(["--quick"])
    assert (quick.epochs, quick.images, quick.img, quick.variants) == (2, 64, 64, ["sgd", "auto"])
