"""The start-up line for an elastic torchrun job whose agent shares one store across rendezvous rounds: read from
PET_NNODES or the agent's command line, silent for fixed membership, outside torchrun and with the variable set; and
printed once by a real elastic torchrun job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port, job_env, run_job
from utils.distributed.elastic import elastic_store_warning, node_range, parent_argv

TORCHRUN = {"TORCHELASTIC_RUN_ID": "job-1", "RANK": "0", "WORLD_SIZE": "1"}


@pytest.mark.parametrize(("env", "argv", "expected"), [
    ({}, ["torchrun", "--nnodes", "1:4", "--nproc_per_node", "2", "train.py"], (1, 4)),
    ({}, ["python", "-m", "torch.distributed.run", "--nnodes=2:3", "train.py"], (2, 3)),
    ({"PET_NNODES": "1:2"}, ["torchrun", "train.py"], (1, 2)),
    ({"PET_NNODES": "1:2"}, ["torchrun", "--nnodes", "2", "train.py"], (2, 2)),  # the command line wins
    ({}, ["torchrun", "--nproc_per_node", "2", "train.py"], None),
    ({"PET_NNODES": "a:b"}, [], None),
])
def test_the_node_range_comes_from_pet_nnodes_or_the_agents_command_line(env, argv, expected) -> None:
    assert node_range(env, argv) == expected


def test_one_line_only_for_an_elastic_torchrun_job_without_separate_stores() -> None:
    elastic = ["torchrun", "--nnodes", "1:2", "train.py"]
    line = elastic_store_warning(TORCHRUN, elastic)
    assert line is not None and "\n" not in line
    assert "--nnodes 1:2" in line and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in line and "docs/cluster.md" in line
    assert elastic_store_warning({**TORCHRUN, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, elastic) is None
    assert elastic_store_warning(TORCHRUN, ["torchrun", "--nnodes", "2", "train.py"]) is None  # fixed membership
    assert elastic_store_warning({"PET_NNODES": "1:2"}, elastic) is None  # not a torchrun worker


def test_the_parent_command_line_is_read() -> None:
    child = subprocess.run([sys.executable, "-c", "from utils.distributed.elastic import parent_argv; "
                            "print(parent_argv())"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert sys.executable in child.stdout  # its parent is this test's Python
    assert parent_argv()  # and this process's own parent is readable


@pytest.mark.ddp
def test_an_elastic_torchrun_job_says_it_once_at_start_up(tmp_path: Path) -> None:
    """A one-node job that may grow to two (c10d rendezvous on loopback), without the variable: the line comes once,
    before train.py's first error (a data YAML that does not exist). With the variable set nothing is said (above)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc_per_node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "elastic-line",
           "--rdzv-conf", "last_call_timeout=1", str(ROOT / "train.py"), "--data", str(tmp_path / "none.yaml"),
           "--device", "cpu", "--project", str(tmp_path)]
    env = job_env()
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    code, out = run_job(cmd, env=env)
    assert code != 0 and "none.yaml" in out, out[-2000:]
    assert out.count("runs without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1") == 1
