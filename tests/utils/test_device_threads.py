"""utils.device.measured_threads: the thread count is measured (real timings), and the rule picks by the gain; the
scripts shorten OpenMP's spin before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from utils.device import ThreadVote, measured_threads


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_one_core_needs_no_measurement() -> None:
    assert measured_threads(1) == 1 and torch.get_num_threads() == 1


def test_the_gain_threshold_decides_between_one_thread_and_all() -> None:
    assert measured_threads(2, rounds=1, min_gain=0.0) == 2 and torch.get_num_threads() == 2  # any timing passes
    assert measured_threads(2, rounds=1, min_gain=float("inf")) == 1 and torch.get_num_threads() == 1  # none does
    assert measured_threads(2, rounds=3) in (1, 2)  # this machine's own answer, either way


def test_a_probe_that_does_not_apply_leaves_the_thread_count() -> None:
    torch.set_num_threads(1)
    assert measured_threads(2, rounds=1, apply=False) in (1, 2) and torch.get_num_threads() == 1
    assert measured_threads(1, apply=False) == 1 and torch.get_num_threads() == 1


def test_the_vote_changes_the_count_after_two_agreeing_probes() -> None:
    torch.set_num_threads(1)
    vote, verdicts = ThreadVote(), iter([2, 1, 2, 2, 2, 1, 1])
    changes = [vote.remeasure(lambda: next(verdicts)) for _ in range(7)]
    assert changes == [None, None, None, (1, 2), None, None, (2, 1)] and torch.get_num_threads() == 1


WATCH_TORCH = """
import os, runpy, sys
seen = []
class Watch:  # notes the environment at the moment torch is first imported (when OpenMP reads it)
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("GOMP_SPINCOUNT"))
sys.meta_path.insert(0, Watch())
sys.path.insert(0, sys.argv[1])
runpy.run_path(sys.argv[2], run_name="imported")
print(seen)
"""


def _no_openmp_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}


@pytest.mark.parametrize("script", ["train.py", "test.py", "detect.py", "export.py"])
def test_each_script_shortens_openmps_spin_before_torch_loads(script: str) -> None:
    done = subprocess.run([sys.executable, "-c", WATCH_TORCH, str(ROOT), str(ROOT / script)], capture_output=True,
                          text=True, env=_no_openmp_settings(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['10000']"


@pytest.mark.parametrize("setting, expected", [
    ({}, "10000 False"),  # and importing it loads no torch
    ({"GOMP_SPINCOUNT": "300000"}, "300000 False"),  # the user's spin is kept
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "None False"),  # so is the user's wait policy, without a spin beside it
])
def test_the_spin_default_leaves_a_users_openmp_settings(setting: dict[str, str], expected: str) -> None:
    code = "import os, sys, utils.distributed.openmp; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**_no_openmp_settings(), **setting}, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == expected, done.stderr[-2000:]
