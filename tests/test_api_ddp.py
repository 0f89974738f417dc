"""``train.run(..., nproc_per_node=2)``: two processes on the CPU (gloo) started by torch's elastic launcher from
Python; rank 0's result comes back, a UserError comes back as itself, and the calling process keeps its signal
handlers."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import train
from tests.helpers import victim_folder
from tests.test_api import results_row, tiny_train
from utils.distributed.comm import DistError
from utils.errors import UserError

pytestmark = [pytest.mark.ddp, pytest.mark.slow]


def test_two_processes_from_python_return_rank_0s_metrics(tiny_dataset: Path, tiny_cfg_file: Path, tmp_path: Path,
                                                         capfd: pytest.CaptureFixture) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    result = train.run(nproc_per_node=2, **tiny_train(tiny_dataset, tiny_cfg_file, tmp_path))
    output = capfd.readouterr()
    assert "batch 4 per rank, 2 ranks" in output.out, output.out[-3000:] + output.err[-3000:]
    assert output.out.count("1 epochs completed in") == 1  # rank 0 alone prints
    assert result.save_dir == tmp_path / "exp" and (result.save_dir / "weights" / "last.pt").is_file()
    row = results_row(result.save_dir)  # written by rank 0
    assert [result.metrics[k] for k in result.metrics] == pytest.approx(
        [row[f"metrics/{k}"] for k in result.metrics], abs=1e-5)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ


def test_a_user_error_in_the_processes_is_raised_as_itself(tiny_dataset: Path, tiny_cfg_file: Path,
                                                          tmp_path: Path) -> None:
    options = {**tiny_train(tiny_dataset, tiny_cfg_file, tmp_path), "batch_size": 3}
    with pytest.raises(DistError, match=r"^--batch-size 3 must be a positive multiple of the world size 2"):
        train.run(nproc_per_node=2, **options)
    assert list(tmp_path.iterdir()) == []  # issue 42: a failed start leaves no empty run folder


def test_two_processes_never_train_into_a_folder_outside_the_project(tiny_dataset: Path, tiny_cfg_file: Path,
                                                                     tmp_path: Path) -> None:
    """Issue 44: ``name='../victim'`` with the project folder not made yet trained into ``victim``."""
    victim, files = victim_folder(tmp_path)
    options = {**tiny_train(tiny_dataset, tiny_cfg_file, tmp_path / "runs" / "train"), "name": "../victim"}
    with pytest.raises(UserError, match=r"^--name '../victim' holds a path separator"):
        train.run(nproc_per_node=2, **options)
    assert {p.relative_to(victim).as_posix(): p.read_bytes() for p in victim.rglob("*") if p.is_file()} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]


def test_a_crash_in_one_process_is_the_launchers_error_with_its_traceback(tiny_dataset: Path, tiny_cfg_file: Path,
                                                                         tmp_path: Path) -> None:
    """A hook passed from Python reaches the processes (pickled); rank 1 raises in its first step."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from tests.plugins.faults import FailAt

    with pytest.raises(ChildFailedError) as failure:
        train.run(nproc_per_node=2, hooks=[FailAt(rank=1, epoch=0, batch=0)],
                  **tiny_train(tiny_dataset, tiny_cfg_file, tmp_path), ddp_timeout=60)
    assert "rank 1: test fault injected at epoch 0 batch 0" in str(failure.value)
