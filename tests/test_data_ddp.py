"""Two gloo processes (torchrun): the synthetic set and the label cache are built once, then shared."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ddp
def test_two_ranks_build_the_cache_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(ROOT / "tests" / "scripts" / "data_ddp_worker.py"), str(tmp_path / "data"), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["generate"] for r in ranks] == [1, 0]  # local rank 0 generated, rank 1 found it valid
    assert [r["save_cache"] for r in ranks] == [1, 0]  # one cache write; rank 1 read it
    assert (tmp_path / "data" / "labels" / "train.cache").is_file()
    assert [r["found"] for r in ranks] == [10, 10]
    assert not set(ranks[0]["order"]) & set(ranks[1]["order"])  # ranks see disjoint halves of the epoch
    assert len(ranks[0]["order"]) == len(ranks[1]["order"]) == 5
    assert ranks[0]["cached"] == [0, 2, 4, 6, 8] and ranks[1]["cached"] == [1, 3, 5, 7, 9]  # RAM cache is split
    assert proc.stdout.count("Scanning '") == 1  # the summary is printed once (rank 0)
