"""Streamed shards under DDP: two gloo ranks (torchrun) train every sample exactly once per epoch, and a run stopped
mid-epoch resumes on one process - another world size - training exactly the samples the two had not reached."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, finish, make_shard_set, start, torchrun_cmd, train_args
from utils.weights.checkpoint import load_checkpoint

pytestmark = pytest.mark.ddp


def _steps(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob("rank*.jsonl")) for line in path.read_text().splitlines()]


def test_two_ranks_train_each_sample_once_and_one_process_resumes_mid_epoch_exactly(tiny_cfg_file: Path,
                                                                                     tmp_path: Path) -> None:
    data = make_shard_set(tmp_path, n_images=128, per_shard=16, val="shards/train-000000.tar")  # 2 steps of 64
    project, record = tmp_path / "runs", tmp_path / "trained"
    hook = ["--hook", f"tests.plugins.samples:TrainedSamples(folder={str(record)!r})"]
    stop = ["--hook", "tests.plugins.faults:FailAt(rank=0, epoch=1, batch=0, action='term')"]
    args = train_args(data, tiny_cfg_file, project, "--batch-size", "64", "--noval", "--amp", "off", "--name", "cut",
                      epochs=2)
    code, out = finish(start(torchrun_cmd(2, *args, "--workers", "1", *hook, *stop)))
    position = load_checkpoint(project / "cut" / "weights" / "last.pt")["train_state"]["position"]
    assert (position["epoch"], position["world_size"]) == (1, 2) and position["samples_seen"] == 64, out[-3000:]
    first = _steps(record)
    epoch0 = [p for step in first if step["epoch"] == 0 for p in step["paths"]]
    assert len(epoch0) == 128 and len(set(epoch0)) == 128  # two ranks: every sample once
    before = [p for step in first if step["epoch"] == 1 for p in step["paths"]]
    assert len(before) == position["samples_seen"]
    for path in record.glob("*.jsonl"):
        path.unlink()
    resume = [sys.executable, str(ROOT / "train.py"), "--resume", str(project / "cut"), "--workers", "0", *hook]
    code, out = finish(start(resume))
    assert code == 0, out[-3000:]
    after = [p for step in _steps(record) for p in step["paths"]]
    assert all(step["world"] == 1 and step["epoch"] == 1 for step in _steps(record))
    assert sorted(before + after) == sorted(epoch0)  # the epoch completed on one process: each sample once
