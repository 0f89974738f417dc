"""Proof that torchrun's elastic restart works on this stack: the restarted group forms, and finds its run.

On torch 2.14 a group restarted by torchrun hangs in a plain gloo ``init_process_group`` (the agent's
store still holds the previous attempt's keys); utils.dist prefixes the keys with the restart count.
These tests launch real torchrun jobs whose rank 1 SIGKILLs itself on attempt 0.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "scripts" / "elastic_worker.py"
pytestmark = [pytest.mark.ddp, pytest.mark.slow]
JOB_TIMEOUT_S = 180  # generous bound for a loaded 2-core machine; a hang fails instead of blocking the suite


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_bounded(cmd: list[str], timeout_s: float, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; on timeout kill the whole process group and fail the test."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd[:6])} ... did not finish within {timeout_s} s (hang):\n{out[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def rendezvous_args(kind: str) -> list[str]:
    port = free_port()
    if kind == "c10d":
        return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    return ["--master-addr", "127.0.0.1", "--master-port", str(port)]  # default static rendezvous


def parse_events(path: Path) -> list[dict[str, str]]:
    """``attempt=1 rank=0 t=... plan save_dir=exp ...`` lines -> dicts (the event text under 'event')."""
    events = []
    for line in path.read_text().splitlines():
        match = re.match(r"attempt=(\d+) rank=(\d+) t=\S+ (.*)", line)
        if match:
            events.append({"attempt": match.group(1), "rank": match.group(2), "event": match.group(3)})
    return events


@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_restarted_group_forms_and_resumes_same_run(tmp_path: Path, rendezvous: str) -> None:
    events_file, project = tmp_path / "events.txt", tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
           *rendezvous_args(rendezvous), str(WORKER), str(events_file), str(project)]
    result = run_bounded(cmd, JOB_TIMEOUT_S, tmp_path)
    events = parse_events(events_file)
    log = "\n".join(f"{e['attempt']}/{e['rank']}: {e['event']}" for e in events)
    assert result.returncode == 0, f"torchrun exit {result.returncode}\n{log}\n{result.stdout[-3000:]}"

    def seen(attempt: str, text: str) -> set[str]:
        return {e["rank"] for e in events if e["attempt"] == attempt and text in e["event"]}

    assert seen("0", "kill") == {"1"}, log  # attempt 0 really lost a worker
    assert seen("0", "done") == set(), log
    assert seen("1", "sum=3") == {"0", "1"}, log  # attempt 1 formed a 2-rank group and all-reduced
    assert seen("1", "done") == {"0", "1"}, log
    # attempt 1 continued in attempt 0's folder (a new run would have made exp2) from its last.pt
    assert seen("1", "plan save_dir=exp resume_from=") == {"0", "1"}, log
    assert seen("1", "reason='elastic restart 1'") == {"0", "1"}, log
    assert seen("1", "resumed epoch=7") == {"0", "1"}, log
    assert seen("1", str(project / "exp" / "weights" / "last.pt")) == {"0", "1"}, log
    assert sorted(p.name for p in project.iterdir()) == ["exp"]
