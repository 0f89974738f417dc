"""Two gloo processes (torchrun): the synthetic set and the label cache are built once, then shared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_job, torchrun_cmd
from utils.data.ram_cache import shm_dir


@pytest.mark.ddp
def test_two_ranks_build_the_cache_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code, output = run_job(torchrun_cmd(2, "-m", "tests.scripts.data_ddp_worker", str(tmp_path / "data"), str(out)))
    assert code == 0, output[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["generate"] for r in ranks] == [1, 0]  # local rank 0 generated, rank 1 found it valid
    assert [r["save_cache"] for r in ranks] == [1, 0]  # one cache write; rank 1 read it
    assert (tmp_path / "data" / "labels" / "train.cache").is_file()
    assert [r["found"] for r in ranks] == [10, 10]
    assert not set(ranks[0]["order"]) & set(ranks[1]["order"])  # ranks see disjoint halves of the epoch
    assert len(ranks[0]["order"]) == len(ranks[1]["order"]) == 5
    # --cache ram: one copy on the machine, mapped by both ranks, every image of the epoch read from it
    assert ranks[0]["cached"] == ranks[1]["cached"] == 10 and [r["decoded_in_epoch"] for r in ranks] == [0, 0]
    assert len(ranks[0]["cache_files"]) == 1 and ranks[0]["cache_files"] == ranks[1]["cache_files"]
    assert not list(shm_dir().glob("yolo-ram-*"))  # the name was removed once mapped: nothing left behind
    assert output.count("images and labels... 10 found") == 1  # the summary is printed once (rank 0)
