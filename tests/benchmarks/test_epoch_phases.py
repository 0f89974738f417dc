"""benchmarks.epoch_phases: exclusive phase times (nested phases counted once) and the shares built from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import epoch_phases
from benchmarks.epoch_phases import STEP_LOOP, PhaseClock, shares
from tests.helpers import ROOT, train_args


def test_nested_phases_are_counted_once_and_validation_names_its_parts() -> None:
    elapsed = [0.0]  # a clock the test advances: each _spin is that much CPU time

    def _spin(seconds: float) -> None:
        elapsed[0] += seconds

    clock = PhaseClock(now=lambda: elapsed[0])
    loop = clock.wrap(lambda: (_spin(0.02), forward(), _spin(0.02)), STEP_LOOP)
    forward = clock.wrap(lambda: (_spin(0.03), inner()), "forward")
    inner = clock.wrap(lambda: _spin(0.01), "forward")  # a module inside a module: still the forward
    validation = clock.wrap(lambda: (_spin(0.01), forward()), "validation")
    probe = clock.wrap(lambda: forward(), "AMP decision")  # a forward outside the loop belongs to its caller
    clock.enter("other")
    loop()
    validation()
    probe()
    clock.leave()
    s = {k: round(v, 9) for k, v in clock.seconds.items()}
    assert s == {"other": 0.0, STEP_LOOP: 0.04, "forward": 0.04, "validation": 0.01, "validation: forward": 0.04,
                 "AMP decision": 0.04}  # the loop's own time without its forward; every second counted once


def test_shares_of_the_model_for_the_run_and_for_a_recurring_epoch() -> None:
    result = {"phases": {"forward": 30.0, "backward": 50.0, "validation: forward": 5.0,
                         "start-up imports (train.py and what it imports)": 10.0},
              "other_threads_s": 3.0, "workers_s": 2.0}
    got = shares(result)
    assert got["total_s"] == 100.0 and got["model_s"] == 80.0 and abs(got["not_model"] - 0.2) < 1e-12
    assert got["recurring_s"] == 87.0 and abs(got["recurring_not_model"] - 7 / 87) < 1e-12
    assert epoch_phases.OTHER_THREADS in epoch_phases.ONCE_PER_RUN


def test_a_tiny_run_timed_on_the_wall_clock(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path) -> None:
    out = tmp_path / "phases.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "epoch_phases.py"), "--clock", "wall", "--tree", str(ROOT),
               "--out", str(out), "--", *train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", epochs=1)[1:]]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["clock"] == "wall" and result["missing"] == []
    phases = result["phases"]
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["checkpoint saving"] > 0
    assert sum(phases.values()) <= wall  # wall seconds of one thread, each counted once: within the process's life
    assert (tmp_path / "runs" / "exp" / "weights" / "last.pt").is_file()
