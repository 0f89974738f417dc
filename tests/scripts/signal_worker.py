"""Worker for tests/test_fault_tolerance.py: a paced step loop under GracefulStop.

Usage: ``signal_worker.py EVENTS_FILE WEIGHTS_DIR MODE`` where MODE is ``self-term-rank1`` (rank 1 sends
itself SIGTERM at step 3), ``self-int`` (the process sends itself SIGINT at step 3) or ``wait`` (loop until
signalled from outside). Every rank checks ``should_stop()`` after each step; rank 0 then saves last.pt
holding the step. Events go to EVENTS_FILE as ``rank=<r> <event>`` lines.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from utils import dist  # noqa: E402
from utils.checkpoint import FORMAT, save_run_checkpoints  # noqa: E402
from utils.cli import run_main  # noqa: E402
from utils.signals import GracefulStop  # noqa: E402

MAX_STEPS = 3000  # 0.05 s each: the loop ends by itself (and the test fails) if no stop arrives


def record(events: Path, event: str) -> None:
    with open(events, "a") as f:
        f.write(f"rank={os.environ.get('RANK', '0')} {event}\n")


def main(opt: argparse.Namespace) -> None:
    dist.init_distributed(device="cpu", timeout_s=60)
    with GracefulStop() as stop:
        for step in range(MAX_STEPS):
            dist.all_reduce_sum(torch.ones(1))
            record(opt.events, f"step={step}")
            if step == 3 and opt.mode == "self-term-rank1" and dist.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            if step == 3 and opt.mode == "self-int":
                os.kill(os.getpid(), signal.SIGINT)
            signalled_here = stop.requested
            if stop.should_stop():
                if dist.is_main_process():
                    save_run_checkpoints({"format": FORMAT, "model": {}, "model_yaml": {}, "epoch": step},
                                         opt.weights)
                record(opt.events, f"stopped step={step} local_signal={signalled_here}")
                stop.raise_stop()
            time.sleep(0.05)
    record(opt.events, "finished")


def entry(argv: list[str]) -> int:
    opt = argparse.Namespace(events=Path(argv[0]), weights=Path(argv[1]), mode=argv[2])
    clean = False
    try:
        code = run_main(main, opt, "signal_worker")
        clean = code == 0
    finally:
        handler = signal.getsignal(signal.SIGTERM)
        record(opt.events, f"exit handler_restored={handler in (signal.SIG_DFL, None)}")
        dist.cleanup(clean_exit=clean)
    return code


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
