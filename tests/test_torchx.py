"""TorchX's own DDP component runs train.py as it is: ``torchx run -s local_cwd dist.ddp -j 1x2 --script train.py --
...`` starts torchrun with two processes on the CPU (gloo), which train one run; rank 0 alone talks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, csv_epochs, free_port, run_job, train_args

pytestmark = [pytest.mark.ddp, pytest.mark.slow]


def test_torchx_dist_ddp_on_local_cwd_trains_with_two_processes(tiny_dataset: Path, tiny_cfg_file: Path,
                                                                tmp_path: Path) -> None:
    script_args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", epochs=1)[1:]  # without train.py's path
    cmd = [sys.executable, "-m", "torchx.cli.main", "run", "-s", "local_cwd", "dist.ddp", "-j", "1x2",
           "--rdzv_port", str(free_port()), "--script", "train.py", "--", *script_args]
    code, out = run_job(cmd, cwd=ROOT)
    assert code == 0, out[-3000:]
    assert "Job finished: SUCCEEDED" in out and "batch 4 per rank, 2 ranks" in out
    assert out.count("1 epochs completed in") == 1  # rank 0's output only
    assert csv_epochs(tmp_path / "runs" / "exp") == ["0"]
    assert (tmp_path / "runs" / "exp" / "weights" / "last.pt").is_file()
