"""Worker for tests/test_elastic_restart.py: attempt 0 loses rank 1 to SIGKILL, attempt 1 must finish.

Run under ``torch.distributed.run --nproc_per_node 2 --max-restarts 1``. Usage:
``elastic_worker.py EVENTS_FILE PROJECT_DIR``. Each rank appends ``attempt=<n> rank=<r> <event>``
lines to EVENTS_FILE so the test can see what ran. Besides the group restart itself it checks
that the run folder chosen by attempt 0 is found again by attempt 1 (utils.training.resume.plan_run),
with the last.pt attempt 0 wrote as the checkpoint to resume from.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch

from utils.distributed import comm as dist
from utils.training.config import RunConfig
from utils.training.run_plan import plan_run
from utils.weights.checkpoint import FORMAT, load_checkpoint, save_run_checkpoints


def record(events: Path, event: str) -> None:
    """Append one event line (a short O_APPEND write does not interleave with the other rank's)."""
    with open(events, "a") as f:
        f.write(f"attempt={dist.restart_count()} rank={os.environ['RANK']} t={time.time():.2f} {event}\n")


def main(events: Path, project: Path) -> int:
    dist.init_distributed(device="cpu", timeout_s=30, long_timeout_s=60)
    record(events, f"init world={dist.get_world_size()}")
    plan = plan_run(RunConfig(project=str(project), name="exp"))
    record(events, f"plan save_dir={plan.save_dir.name} resume_from={plan.resume_from} reason={plan.reason!r}")
    if plan.resume_from is not None:
        record(events, f"resumed epoch={load_checkpoint(plan.resume_from)['epoch']}")
    elif dist.is_main_process():
        save_run_checkpoints({"format": FORMAT, "model": {}, "model_yaml": {}, "epoch": 7}, plan.save_dir / "weights")
    total = dist.all_reduce_sum(torch.tensor([float(dist.get_rank() + 1)]))
    dist.barrier()
    if dist.restart_count() == 0:
        if dist.get_rank() == 1:
            record(events, "kill")
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()  # rank 0 waits here for the dead peer until gloo or the agent ends it
    record(events, f"sum={total.item():g}")
    dist.cleanup()
    record(events, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
