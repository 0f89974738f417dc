"""Helper for tests/test_fault_tolerance.py: writes a good last.pt, then a second one that stalls halfway.

Usage: ``slow_checkpoint_writer.py WEIGHTS_DIR READY_FILE``. The second write's ``torch.save`` is replaced
by one that writes half the bytes, flushes them, creates READY_FILE and sleeps, so the test can SIGKILL
the process while the checkpoint is being written.
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import torch

from utils.weights.checkpoint import FORMAT, save_run_checkpoints


def checkpoint(epoch: int) -> dict:
    return {"format": FORMAT, "model": {"w": torch.full((64, 1024), float(epoch))}, "model_yaml": {}, "epoch": epoch}


def main(weights: Path, ready: Path) -> None:
    save_run_checkpoints(checkpoint(1), weights, is_best=True)
    real_save = torch.save

    def stalling_save(obj: object, f: io.BufferedWriter, *args: object, **kwargs: object) -> None:
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        ready.write_text(str(os.getpid()))
        time.sleep(120)  # killed here by the test
        f.write(data[len(data) // 2:])

    torch.save = stalling_save
    save_run_checkpoints(checkpoint(2), weights, is_best=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
