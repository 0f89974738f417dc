"""utils.device.measured_threads: the thread count is measured (real timings), and the rule picks by the gain."""

from __future__ import annotations

import pytest
import torch

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
