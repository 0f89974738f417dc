"""A process group the engine made before our code ran (Ray Train's TorchTrainer does so, through env://): the
start-up joins it (no second init), runs the agreement check and the watch in it, and the teardown leaves it for the
engine to end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from tests.helpers import free_port


def _engine_rank(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", NODE_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from utils.distributed import comm
    from utils.distributed.launcher import DistError

    tdist.init_process_group("gloo", init_method="env://", rank=rank, world_size=2)  # the engine's group
    engine_group = tdist.distributed_c10d._get_default_group()
    comm.init_distributed("cpu", "auto", 60, 60)
    result = {"joined": tdist.distributed_c10d._get_default_group() is engine_group,
              "launcher": comm.launch_env().launcher, "rank": comm.get_rank(), "watch": comm._STATE.watch is not None}
    comm.check_agreement({"epochs": 3})
    try:
        comm.check_agreement({"epochs": 3 + rank})
    except DistError as e:
        result["disagreement"] = str(e)
    result["sum"] = comm.all_reduce_sum(torch.tensor([rank + 1.0])).item()
    comm.cleanup(clean_exit=True)
    result["left_to_engine"] = tdist.is_initialized()
    tdist.barrier()  # the engine's group still works after our teardown
    tdist.destroy_process_group()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.ddp
def test_a_group_the_engine_made_is_joined_checked_and_left_to_the_engine(tmp_path: Path) -> None:
    mp.start_processes(_engine_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, result in enumerate(results):
        assert result["joined"] and result["launcher"] == "engine" and result["rank"] == rank and result["watch"]
        assert result["disagreement"].startswith("rank 1 differs from rank 0 in epochs: 4 vs 3")
        assert result["sum"] == 3.0 and result["left_to_engine"]
