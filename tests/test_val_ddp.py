"""Distributed validation: 2 processes (torchrun, gloo on CPU) give the metrics of 1 process.

Run by pytest, and also the worker that torchrun starts (``python -m torch.distributed.run ... this file``):
every rank evaluates its shard with the oracle detector of tests/utils/training/test_engine.py and writes
the metrics it got, so the test can check that every rank agrees with a 1-process run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import OracleModel, load_script, run_job, torchrun_cmd

pytestmark = [pytest.mark.ddp, pytest.mark.slow]


def _summary(result) -> dict:
    return {"mp": result.mp, "mr": result.mr, "map50": result.map50, "map": result.map,
            "maps": [float(v) for v in result.maps], "seen": result.seen, "n_labels": result.n_labels,
            "confusion": result.confusion.matrix.tolist()}


def _evaluate_oracle(root: Path) -> dict:
    """Evaluate the oracle detector on root's val split with this process's shard loader (4 images per rank)."""
    import torch

    from utils.data.datasets import DatasetOptions
    from utils.data.loader import create_dataloader
    from utils.data.synthetic import SYNTHETIC_NAMES
    from utils.evaluation.evaluate import evaluate

    torch.set_num_threads(1)
    options = DatasetOptions(img_size=96, batch_size=4, rect=True, pad=0.5, nc=len(SYNTHETIC_NAMES),
                             names=SYNTHETIC_NAMES)
    loader, _ = create_dataloader(root / "images" / "val", options, workers=0, shard_eval=True)
    result = evaluate(OracleModel(loader), loader, device="cpu", names=SYNTHETIC_NAMES)
    return _summary(result)


def _worker(root: str, out_dir: str, test_args: list[str]) -> int:
    """torchrun entry: test.py's main() on this rank; inside it, before test.py's own evaluation, the oracle
    evaluation of ``root`` (the group is up then), whose result this rank writes to ``out_dir``."""
    test_script = load_script("test")
    from utils.cli import run_main
    from utils.distributed import comm as dist

    real_evaluate = test_script.evaluate

    def oracle_then_real(model, loader, *args, **kwargs):
        summary = _evaluate_oracle(Path(root))
        summary["world"] = dist.get_world_size()
        (Path(out_dir) / f"rank{dist.get_rank()}.json").write_text(json.dumps(summary))
        return real_evaluate(model, loader, *args, **kwargs)

    test_script.evaluate = oracle_then_real
    return run_main(test_script.main, test_script.parse_opt(test_args), "test")


@pytest.fixture(scope="module")
def odd_val_set(tmp_path_factory) -> Path:
    """25 val images: the shards of 2 ranks differ in size (13 and 12), with no padding duplicate."""
    from utils.data.synthetic import ensure_synthetic

    return ensure_synthetic(tmp_path_factory.mktemp("odd") / "synthetic", n_train=2, n_val=25, img_size=(64, 96),
                            seed=5)


@pytest.fixture(scope="module")
def two_rank_run(odd_val_set, tmp_path_factory, tiny_cfg_file) -> tuple[Path, list[str], str]:
    """One torchrun launch (2 ranks): test.py on a tiny checkpoint, and the oracle evaluation inside it."""
    import torch
    import yaml

    from models.yolo import Model
    from utils.data.synthetic import SYNTHETIC_NAMES
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    out = tmp_path_factory.mktemp("two_ranks")
    torch.manual_seed(0)
    weights = save_checkpoint(new_checkpoint(Model(str(tiny_cfg_file))), out / "tiny.pt")
    data = odd_val_set.parent / "odd.yaml"  # beside the data set: a data YAML's path stays in its folder
    data.write_text(yaml.safe_dump({"path": str(odd_val_set), "train": "images/train", "val": "images/val",
                                    "nc": len(SYNTHETIC_NAMES), "names": SYNTHETIC_NAMES}))
    args = ["--weights", str(weights), "--data", str(data), "--img", "64", "--batch-size", "4", "--device", "cpu",
            "--workers", "0", "--project", str(out), "--save-json", "--verbose", "--conf-thres", "0.005"]
    code, output = run_job(torchrun_cmd(2, "-m", "tests.test_val_ddp", str(odd_val_set), str(out), *args, "--name",
                                        "two"))
    assert code == 0, output[-3000:]
    return out, args, output


def test_two_ranks_return_the_one_process_metrics(odd_val_set, two_rank_run):
    out, _, _ = two_rank_run
    single = _evaluate_oracle(odd_val_set)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r.pop("world") == 2 for r in ranks)
    confusion = single.pop("confusion")
    assert sum(map(sum, confusion)) > 0
    assert all(r.pop("confusion") == confusion for r in ranks)  # both shards' counts, on every rank
    assert ranks[0]["seen"] == 25 and single["seen"] == 25 and single["n_labels"] > 25
    assert 0.1 < single["map"] < 0.99
    for summary in ranks:
        for key in ("mp", "mr", "map50", "map", "seen", "n_labels"):
            assert summary[key] == pytest.approx(single[key], abs=1e-6), key
        assert summary["maps"] == pytest.approx(single["maps"], abs=1e-6)
    assert (out / "two" / "PR_curve.png").is_file()  # test.py's plots, written by rank 0


def _table_rows(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines()
            if line.strip().split(" ")[0] in ("all", "circle", "square", "triangle")]


def test_test_py_under_torchrun_matches_one_process(two_rank_run):
    import torch

    test_script = load_script("test")

    out, args, stdout = two_rank_run
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = test_script.main(test_script.parse_opt([*args, "--name", "one"]))
    finally:
        torch.set_num_threads(threads)
    rows = _table_rows(stdout)
    assert rows[-4].split()[:3] == ["all", "25", str(single.n_labels)]  # the last table: test.py's own
    assert rows[-4].split()[3:] == [f"{v:.3g}" for v in single.results()]
    assert stdout.count("test: weights=") == 1  # options printed once, by rank 0
    one = sorted(json.loads((out / "one" / "predictions.json").read_text()), key=json.dumps)
    two = sorted(json.loads((out / "two" / "predictions.json").read_text()), key=json.dumps)
    assert len(one) == len(two) > 0
    for a, b in zip(one, two):
        assert (a["image_id"], a["category_id"]) == (b["image_id"], b["category_id"])
        assert a["bbox"] == pytest.approx(b["bbox"], abs=0.01) and a["score"] == pytest.approx(b["score"], abs=1e-4)


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2], sys.argv[3:]))
