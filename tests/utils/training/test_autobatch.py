"""utils/training/autobatch.py: --batch-size -1. The ranks' agreement and the CPU's refusal run here; the CUDA
measurement (one GPU, and two ranks on it) runs in tests/scripts/gpu_smoke.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import train_args
from utils.training.autobatch import _tensors, agreed_total


@pytest.mark.parametrize("measured, share, total", [([37], 37, 37), ([48, 40], 40, 80), ([64, 12, 30, 64], 12, 48),
                                                    ([0, 5], 1, 2)])
def test_the_ranks_agree_on_the_smallest_measured_batch(measured: list[int], share: int, total: int) -> None:
    assert agreed_total(measured) == (share, total)


def test_every_tensor_of_a_heads_training_output_is_measured() -> None:
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    assert [t.numel() for t in _tensors([a, (b, {"boxes": c, "name": "x"})])] == [1, 2, 3]


def test_on_the_cpu_autobatch_refuses_in_one_line(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    import train
    from utils.cli import run_main
    from utils.log import LOGGER

    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", epochs=1)
    args[args.index("--batch-size") + 1] = "-1"
    threads, handlers, level = torch.get_num_threads(), list(LOGGER.handlers), LOGGER.level
    try:
        assert run_main(train.main, train.parse_opt(args[1:]), "train") == 2
    finally:
        torch.set_num_threads(threads)
        LOGGER.handlers[:], LOGGER.level = handlers, level
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error" in line] == [
        "train: error: --batch-size -1 (AutoBatch) measures GPU memory; on the CPU give the total batch, "
        "e.g. --batch-size 16"], err
    assert "Traceback" not in err
