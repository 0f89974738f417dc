"""Proof that torchrun's elastic restart works on this stack: the restarted group forms, and finds its run.

On torch 2.14 a group restarted by torchrun hangs in a plain gloo ``init_process_group`` (the agent's
store still holds the previous attempt's keys); utils.distributed.comm prefixes the keys with the restart count.
These tests launch real torchrun jobs whose rank 1 SIGKILLs itself on attempt 0, and two torchrun "nodes" on
loopback (``--nnodes 1:2``) that train.py survives losing one of, and that a second node joins mid-run.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import csv_epochs, finish, free_port, job_env, run_job, start, train_args, wait_for
from utils.distributed.launcher import SEPARATE_STORES

pytestmark = [pytest.mark.ddp, pytest.mark.slow]


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


@pytest.mark.parametrize("rendezvous", ["c10d"])  # static: tests/test_fault_tolerance.py restarts train.py so
def test_restarted_group_forms_and_resumes_same_run(tmp_path: Path, rendezvous: str) -> None:
    events_file, project = tmp_path / "events.txt", tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
           *rendezvous_args(rendezvous), "-m", "tests.scripts.elastic_worker", str(events_file), str(project)]
    code, output = run_job(cmd)
    events = parse_events(events_file)
    log = "\n".join(f"{e['attempt']}/{e['rank']}: {e['event']}" for e in events)
    assert code == 0, f"torchrun exit {code}\n{log}\n{output[-3000:]}"

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


def elastic_node(port: int, job: str, args: list[str], hold: str) -> subprocess.Popen:
    """One torchrun "node" of an elastic job on loopback: 1 or 2 nodes, one process each, 3 restarts, short
    rendezvous timeouts, and the agent's environment docs/cluster.md asks for (a store per rendezvous round)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc_per_node", "1",
           "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job,
           "--rdzv-conf", "join_timeout=90,last_call_timeout=1,close_timeout=10,keep_alive_interval=1",
           "--monitor-interval", "0.5", *args, "--hook", hold, "--ddp-timeout", "60"]
    return start(cmd, env=job_env(**{SEPARATE_STORES: "1"}))


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("change", ["join", "lost"])
def test_two_node_job_survives_a_node_joining_or_lost(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                                      change: str) -> None:
    """join: node A trains alone; node B starts when A is at epoch 1, A's agent SIGTERMs its worker for the new round
    and both continue A's run from its last.pt at world size 2. lost: A and B train together; B (agent and worker) is
    SIGKILLed at epoch 1 and A continues alone. Either way every epoch is done once, in one run folder, rc 0."""
    project, marker, port, job = tmp_path / "runs", tmp_path / "held", free_port(), f"yolo-{uuid.uuid4().hex[:8]}"
    args = train_args(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval", epochs=3)
    held = "0, world=1" if change == "join" else "1, world=2"
    hold = f"tests.plugins.faults:HoldAt(marker={str(marker)!r}, rank={held})"
    node_a = elastic_node(port, job, args, hold)
    wait_for(lambda: listening(port), node_a)  # A hosts the rendezvous store (the node that must stay)
    node_b = elastic_node(port, job, args, hold) if change == "lost" else None
    wait_for(marker.is_file, node_a)
    if node_b is None:  # A holds alone at epoch 1: B joins
        node_b = elastic_node(port, job, args, hold)
    else:  # B's worker holds at epoch 1 of the 2-process run: lose the node, agent and worker
        for pid in map(int, marker.read_text().split()):
            os.kill(pid, signal.SIGKILL)
    code_a, out_a = finish(node_a)
    code_b, out_b = finish(node_b)
    assert code_a == 0, out_a[-3000:]
    run_dir = project / "exp"
    assert csv_epochs(run_dir) == ["0", "1", "2"] and sorted(p.name for p in project.iterdir()) == [".jobs", "exp"]
    assert list((project / ".jobs").iterdir()) == []  # the finished run removed its torchrun record
    if change == "join":
        assert code_b == 0, out_b[-3000:]
        assert "train: stopped by SIGTERM at epoch 1, batch 1; last.pt saved; torchrun's next round" in out_a
        assert f"Resuming (torchrun job '{job}': a restart or a node joined) from {run_dir}" in out_a + out_b
        assert "Resume: processes 1 -> 2, batch per process 8 -> 4" in out_a + out_b
        assert "Resuming from epoch 1 of 3, batch 2" in out_a + out_b
    else:
        assert code_b == -signal.SIGKILL
        assert "Resume: processes 2 -> 1, batch per process 4 -> 8" in out_a, out_a[-3000:]
        assert re.search(r"Resuming from epoch 1 of 3, batch [0-9]", out_a), out_a[-3000:]
