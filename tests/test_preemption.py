"""Pre-emption: a signal from outside - to the torchrun agent, to every process of the job, Ctrl-C's SIGINT, or
Slurm's SIGUSR1 to the ranks - stops a 2-rank job with 2 DataLoader workers per rank at a step every rank agrees
on. Rank 0 saves that step, every process is gone within torchrun's 30 s grace period, our processes print one
line and no traceback, and the chain of resumes ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import (
    ROOT,
    alive,
    finish,
    our_tracebacks,
    process_tree,
    start,
    torchrun_cmd,
    tracebacks,
    train_args,
    wait_for,
)
from utils.weights.checkpoint import load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.ddp]
BATCH = 32  # 2 ranks x 16; accumulation 2 (nominal batch 64): a checkpoint can be taken every other batch
EPOCHS = 4  # 128 images: 4 batches per epoch
GRACE_S = 30.0  # torchrun's default wait between SIGTERM and SIGKILL
# (what receives the signal, the signal): one stop in each of the first four epochs
STAGES = [("agent", signal.SIGTERM), ("job", signal.SIGTERM), ("agent", signal.SIGINT), ("ranks", signal.SIGUSR1)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    folder = tmp_path_factory.mktemp("preempt")
    root = ensure_synthetic(folder / "synthetic", n_train=128, n_val=8, img_size=(64, 80), seed=1)
    path = folder / "data.yaml"
    path.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                    "nc": len(SYNTHETIC_NAMES), "names": list(SYNTHETIC_NAMES)}))
    return path


def beacon_hook(path: Path) -> list[str]:
    return ["--hook", f"tests.plugins.faults:Beacon(path={str(path)!r}, seconds=0.3)"]


def reached(beacon: Path, epoch: int) -> bool:
    """Both ranks have finished batch 1 or later of ``epoch``."""
    if not beacon.exists():
        return False
    done = {line.split()[0] for line in beacon.read_text().splitlines()
            if len(line.split()) == 3 and int(line.split()[1]) == epoch and int(line.split()[2]) >= 1}
    return done == {"0", "1"}


def send(proc, target: str, signum: int) -> list[int]:
    """Signal the agent, every process of the job (as Slurm's scancel does), or the ranks' process groups (what
    srun --signal reaches); returns every process of the job."""
    tree = process_tree(proc.pid)
    ranks = [pid for pid in tree if pid != proc.pid and os.getpgid(pid) == pid]  # torchrun gives each its session
    if target == "agent":
        os.kill(proc.pid, signum)
    elif target == "job":
        for pid in tree:
            os.kill(pid, signum)
    else:
        for pid in ranks:
            os.killpg(pid, signum)
    return tree


def weights_of(path: Path) -> list[dict]:
    ckpt = load_checkpoint(path)
    return [ckpt["model"], ckpt["train_state"]["states"]["model"]]


def test_every_way_of_stopping_saves_the_step_and_the_resumes_end_bit_identical(
        data: Path, tiny_cfg_file: Path, tmp_path: Path) -> None:
    project, run_dir = tmp_path / "runs", tmp_path / "runs" / "cut"
    args = train_args(data, tiny_cfg_file, project, "--batch-size", str(BATCH), "--workers", "2", "--noval",
                      epochs=EPOCHS)
    code, out = finish(start(torchrun_cmd(2, *args, "--name", "whole")))
    assert code == 0, out[-3000:]
    samples_before = -1
    for stage, (target, signum) in enumerate(STAGES):
        beacon = tmp_path / f"beacon{stage}.txt"
        command = [*args, "--name", "cut"] if stage == 0 else [str(ROOT / "train.py"), "--resume", str(run_dir),
                                                               "--workers", "2"]
        proc = start(torchrun_cmd(2, *command, *beacon_hook(beacon)))
        wait_for(lambda: reached(beacon, stage), proc)  # noqa: B023
        sent = time.monotonic()
        tree = send(proc, target, signum)
        code, out = finish(proc, timeout_s=90)
        took = time.monotonic() - sent
        name = signal.Signals(signum).name
        where = f"stage {stage} ({name} to the {target}): "
        assert took < GRACE_S and not alive(tree), f"{where}{took:.1f} s, left {alive(tree)}\n{out[-3000:]}"
        assert not our_tracebacks(out), where + out[-3000:]
        assert all("SignalException" in tb for tb in tracebacks(out)), where + out[-3000:]  # torchrun's own
        lines = [line for line in out.splitlines() if line.startswith(f"train: stopped by {name} at epoch {stage}")]
        assert len(lines) == 1, where + out[-3000:]  # one line, from rank 0 only
        position = load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]["position"]
        batch = int(lines[0].split("batch ")[1].split(";")[0])
        assert position["epoch"] == stage and position["samples_seen"] == (batch + 1) * BATCH, where + str(position)
        assert position["samples_seen"] > 0 and (stage, position["samples_seen"]) > (stage - 1, samples_before)
        samples_before = position["samples_seen"]
        if signum == signal.SIGUSR1:
            assert code == 0 and "job can be requeued" in lines[0], where + out[-3000:]
        print(f"{where}exited {took:.1f} s after the signal, last.pt at epoch {stage} batch {batch}")
    code, out = finish(start(torchrun_cmd(2, str(ROOT / "train.py"), "--resume", str(run_dir), "--workers", "2")))
    assert code == 0, out[-3000:]
    whole, cut = weights_of(project / "whole" / "weights" / "last.pt"), weights_of(run_dir / "weights" / "last.pt")
    diff = max((a[k].float() - b[k].float()).abs().max().item() for a, b in zip(whole, cut) for k in a)
    assert diff == 0.0, diff
    assert torch.equal(whole[0]["model.24.anchors"], cut[0]["model.24.anchors"])
