"""Proof that torchrun's elastic restart works on this stack: the restarted group forms, and finds its run.

On torch 2.14 a group restarted by torchrun hangs in a plain gloo ``init_process_group`` (the agent's
store still holds the previous attempt's keys); utils.distributed.comm prefixes the keys with the restart count.
These tests launch real torchrun jobs whose rank 1 SIGKILLs itself on attempt 0.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port, run_job

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
