"""DDP at cluster scale, on loopback: ranks started as Slurm tasks (no torchrun) on "machines" that share no files,
and a stuck rank named by a live one."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, OutputPump, alive, finish, process_tree, start, torchrun_cmd, train_args
from utils.distributed.launcher import SLURM_PORT_BASE, SLURM_PORT_SPAN

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
    # --project: the job's requeue record (<project>/.jobs/slurm-<id>) goes into the node's folder, not the checkout
    resume = [[str(ROOT / "train.py"), "--resume", "runs/exp", "--project", "runs", "--data", str(datas[r]),
               "--hook", checksum] for r in range(2)]
    results = srun(list(folders), resume, job_id + SLURM_PORT_SPAN)  # a new job, the same derived port
    out = "\n".join(o for _, o in results)
    assert [code for code, _ in results] == [0, 0], out[-3000:]
    assert "Resuming from epoch 3 of 4, batch 0" in out, out[-3000:]  # the step the stop saved
    sums = [(tmp_path / f"checksum-rank{r}.txt").read_text() for r in range(2)]
    assert sums[0] == sums[1], sums  # replicas identical after the reload and the resume
    assert not list(folders[1].rglob("*.pt"))


FROZEN_TIMEOUT_S = 20  # --ddp-timeout of the frozen-rank jobs: the line comes 0.9 x this after the others stall


def named_frozen_rank(proc: subprocess.Popen, pump: OutputPump, timeout_s: float = 150) -> str:
    """The line naming a silent rank, once it is printed; then every process of the job is killed at once (not
    after torchrun's 30 s grace period for the frozen rank)."""
    deadline = time.monotonic() + timeout_s
    line = ""
    while not line and time.monotonic() < deadline and (proc.poll() is None or pump.thread.is_alive()):
        line = next((text for _, text in pump.lines if "not responding" in text or "lost each other" in text), "")
        time.sleep(0.1)
    for pid in alive(process_tree(proc.pid)):
        os.kill(pid, signal.SIGKILL)
    pump.wait(timeout_s=30)
    return line[line.find("train: error:"):]  # (tqdm's bar may share the terminal line)


def test_a_frozen_rank_is_named_in_a_step_and_in_a_collective(tmp_path: Path, tiny_dataset: Path,
                                                                tiny_cfg_file: Path) -> None:
    """Rank 1 frozen with SIGSTOP inside a step (behind the others) and, in a second job, while it waits in the
    checkpoint's collective with them (same place, so only its stopped beat tells it apart): named both times."""
    faults = {"step": "tests.plugins.faults:FailAt(rank=1, epoch=0, batch=1, action='stop')",
              "collective": "tests.plugins.faults:FreezeInCollective(rank=1, epoch=0, seconds=3)"}
    jobs = {}
    for where, fault in faults.items():  # both jobs at once: the frozen ranks cost no CPU while the others wait
        args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / where, "--noval", "--ddp-timeout",
                          str(FROZEN_TIMEOUT_S), "--hook", fault, epochs=2)
        proc = start(torchrun_cmd(2, *args))
        jobs[where] = (proc, OutputPump(proc))
    lines = {where: named_frozen_rank(*job) for where, job in jobs.items()}
    texts = {where: pump.text for where, (_, pump) in jobs.items()}
    frozen = "train: error: rank 1 is not responding: its process is frozen or its host is gone; last seen "
    # its last mark: batch 1, or batch 0 when it froze itself before its watch thread published batch 1
    assert re.match(re.escape(frozen) + r"in train, epoch 0, batch [01]; rank 0 waited ", lines["step"]), \
        texts["step"][-3000:]
    assert lines["collective"].startswith(frozen + "waiting in checkpoint, epoch 1, batch 0; rank 0 waited "), \
        texts["collective"][-3000:]
    for where, line in lines.items():
        waited = int(re.search(r"waited (\d+) s", line).group(1))
        assert waited <= FROZEN_TIMEOUT_S, line  # before the collective's own timeout
        assert "lost each other" not in texts[where] and "stopped making progress" not in texts[where]
        print(f"frozen in a {where}: {line}")
