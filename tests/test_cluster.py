"""DDP at cluster scale, on loopback: ranks started as Slurm tasks (no torchrun) on "machines" that share no files,
and a stuck rank named by a live one."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, OutputPump, alive, finish, process_tree, start, torchrun_cmd, train_args, wait_for
from utils.distributed.comm import SLURM_PORT_BASE, SLURM_PORT_SPAN

pytestmark = [pytest.mark.slow, pytest.mark.ddp]


def slurm_port_job_id() -> int:
    """A Slurm job id whose derived port (SLURM_PORT_BASE + id mod SLURM_PORT_SPAN) is free on loopback."""
    for offset in range(SLURM_PORT_SPAN):
        port = SLURM_PORT_BASE + (os.getpid() * 7 + offset) % SLURM_PORT_SPAN
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port - SLURM_PORT_BASE + 5 * SLURM_PORT_SPAN  # any id with that remainder
    pytest.fail("no free port in the Slurm range")


def slurm_env(rank: int, job_id: int) -> dict[str, str]:
    """What srun gives task ``rank`` of a 2-task step on one node: no RANK/WORLD_SIZE, no MASTER_* at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": str(job_id),
            "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2",
            "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "127.0.0.1"}


def node(tmp_path: Path, name: str, tiny_dataset: Path) -> tuple[Path, Path]:
    """A 'machine': its own working folder and its own copy of the data set (nothing shared with the other)."""
    folder = tmp_path / name
    data = yaml.safe_load(tiny_dataset.read_text())
    shutil.copytree(data["path"], folder / "data")
    (folder / "data.yaml").write_text(yaml.safe_dump({**data, "path": str(folder / "data")}))
    return folder, folder / "data.yaml"


def srun(folders: list[Path], per_rank: list[list[str]], job_id: int) -> list[tuple[int, str]]:
    """Start the two tasks (each in its folder) and wait for both: [(exit code, output)] by rank."""
    procs = [start([sys.executable, *args], cwd=folder, env=slurm_env(rank, job_id))
             for rank, (folder, args) in enumerate(zip(folders, per_rank))]
    return [finish(p) for p in procs]


def test_srun_tasks_without_torchrun_on_machines_that_share_no_files(tmp_path: Path, tiny_dataset: Path,
                                                                      tiny_cfg_file: Path) -> None:
    folders, datas = zip(*(node(tmp_path, f"node{r}", tiny_dataset) for r in range(2)))
    job_id = slurm_port_job_id()
    nan = "tests.plugins.faults:NanLoss(rank=1, epoch=1, batch=0, count=3)"  # reload of node 0's last.pt
    stop = "tests.plugins.faults:FailAt(rank=0, epoch=2, batch=0, action='term')"
    first = [[*train_args(datas[r], tiny_cfg_file, Path("runs"), "--noval", epochs=4), "--hook", nan, "--hook", stop]
             for r in range(2)]
    results = srun(list(folders), first, job_id)
    out = "\n".join(o for _, o in results)
    assert all(code != 0 for code, _ in results) and "stopped by SIGTERM" in out, out[-3000:]
    assert "Using 0 dataloader workers and batch 4 per rank, 2 ranks" in out, out[-3000:]
    assert re.search(r"non-finite loss in 3 steps in a row: reloaded \S*node0\S*last\.pt", out), out[-3000:]
    assert (folders[0] / "runs" / "exp" / "weights" / "last.pt").is_file()
    assert not list(folders[1].rglob("*.pt")) and not (folders[1] / "runs").exists()  # rank 1 wrote nothing
    checksum = f"tests.plugins.faults:Checksum(folder={str(tmp_path)!r})"
    resume = [[str(ROOT / "train.py"), "--resume", "runs/exp", "--data", str(datas[r]), "--hook", checksum]
              for r in range(2)]
    results = srun(list(folders), resume, job_id + SLURM_PORT_SPAN)  # a new job, the same derived port
    out = "\n".join(o for _, o in results)
    assert [code for code, _ in results] == [0, 0], out[-3000:]
    assert "Resuming from epoch 3 of 4, batch 0" in out, out[-3000:]  # the step the stop saved
    sums = [(tmp_path / f"checksum-rank{r}.txt").read_text() for r in range(2)]
    assert sums[0] == sums[1], sums  # replicas identical after the reload and the resume
    assert not list(folders[1].rglob("*.pt"))


def test_a_frozen_rank_is_named_and_the_job_ends(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path) -> None:
    beacon = tmp_path / "beacon.txt"
    args = [*train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--noval", "--ddp-timeout", "20",
                        epochs=30),
            "--hook", f"tests.plugins.faults:Beacon(path={str(beacon)!r}, seconds=0.2)"]
    proc = start(torchrun_cmd(2, *args))  # torchrun SIGKILLs the frozen rank 30 s after its SIGTERM
    pump = OutputPump(proc)
    wait_for(lambda: beacon.exists() and sum(1 for line in beacon.read_text().splitlines()
                                             if line.startswith("1 0 ")) >= 2, proc)
    rank1 = next(pid for pid in process_tree(proc.pid)
                 if pid != proc.pid and b"RANK=1\x00" in Path(f"/proc/{pid}/environ").read_bytes()
                 and os.getpgid(pid) == pid)
    tree = process_tree(proc.pid)
    os.kill(rank1, signal.SIGSTOP)  # frozen: alive, holds its sockets, makes no progress
    frozen = time.monotonic()
    code, ended = pump.wait(timeout_s=150)
    took = ended - frozen
    for pid in alive(tree):
        os.kill(pid, signal.SIGKILL)
    seen = [line for line in beacon.read_text().splitlines() if line.startswith("1 0 ")]
    last_batch = int(seen[-1].split()[2])
    out = pump.text
    assert code != 0 and took < 80, f"{took:.0f} s\n{out[-3000:]}"
    line = next((text for text in out.splitlines() if "stopped making progress" in text), "")
    line = line[line.find("train: error:"):]  # (tqdm's bar may share the terminal line)
    expected = "train: error: rank 1 stopped making progress (rank 1 last seen in train, epoch 0, batch "
    assert line.startswith(expected), out[-3000:]
    assert int(re.search(r"batch (\d+)", line).group(1)) in (last_batch, last_batch + 1), (line, seen[-3:])
    print(f"frozen rank named after {took:.0f} s: {line}")
