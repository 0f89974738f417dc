"""The stuck-rank watch: which ranks are late, the one line, and the thread that ends a stalled rank."""

from __future__ import annotations

import json
import time

import pytest
import torch.distributed as tdist

from utils.distributed import watchdog
from utils.distributed.watchdog import Mark, MarkWatch, is_peer_failure, late_ranks, stuck_message


def test_late_ranks_are_behind_or_not_waiting() -> None:
    mine = Mark(seq=10, phase="train", epoch=0, batch=4, waiting=True)
    marks = {1: Mark(9, "train", 0, 4), 2: Mark(10, "train", 0, 4, waiting=True), 3: Mark(10, "train", 0, 4)}
    assert late_ranks(mine, marks) == [1, 3]
    line = stuck_message(0, mine, {1: marks[1]}, 18.0)
    assert line == ("rank 1 stopped making progress (rank 1 last seen in train, epoch 0, batch 4); rank 0 waited "
                    "18 s in train, epoch 0, batch 4; ending the job")
    assert "every rank has waited 18 s in the same collective" in stuck_message(0, mine, {2: marks[2]}, 18.0)


def test_the_watch_publishes_marks_and_ends_a_stalled_rank(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(watchdog, "EARLY", 1.0)
    store, exits = tdist.HashStore(), []
    store.set("mark/1", json.dumps({"seq": 1, "phase": "train", "epoch": 0, "batch": 3, "waiting": False,
                                        "long": False}))
    watch = MarkWatch(store, rank=0, world_size=2, timeout_s=0.5, long_timeout_s=60, interval_s=0.05,
                          exit=exits.append).start()
    watch.at("train", 0, 3)
    watch.waits()  # rank 0 went on to the vote and waits; rank 1 never gets there
    time.sleep(0.2)
    assert json.loads(store.get("mark/0"))["waiting"] is True and not exits  # published, not yet stalled
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.close()
    assert exits and exits[0] == watchdog.EXIT_STUCK
    err = capsys.readouterr().err
    assert "train: error: rank 1 stopped making progress (rank 1 last seen in train, epoch 0, batch 3)" in err


def test_a_long_wait_uses_the_long_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "EARLY", 1.0)
    exits = []
    watch = MarkWatch(tdist.HashStore(), 0, 2, timeout_s=0.2, long_timeout_s=60, interval_s=0.05,
                          exit=exits.append).start()
    watch.at("label cache", long=True)  # rank 0 scans for everyone: the others wait long
    time.sleep(0.5)
    watch.close()
    assert not exits


def test_peer_failures_are_recognised() -> None:
    assert is_peer_failure(RuntimeError("[/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]"))
    assert is_peer_failure(tdist.DistBackendError("NCCL communicator was aborted"))
    assert not is_peer_failure(RuntimeError("shape mismatch"))


def _stall_with_peer(peer_beats: bool, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rank 0 and rank 1 wait in the same collective (the same mark, both waiting); rank 1's beat goes on or stops.
    Returns the exit codes the watch asked for."""
    monkeypatch.setattr(watchdog, "EARLY", 1.0)
    store, exits = tdist.HashStore(), []
    store.set("mark/1", json.dumps({"seq": 3, "phase": "checkpoint", "epoch": 2, "batch": 0, "waiting": True,
                                    "long": False}))
    store.add("beat/1", 1)
    watch = MarkWatch(store, rank=0, world_size=2, timeout_s=0.6, long_timeout_s=60, interval_s=0.05,
                      exit=exits.append).start()
    watch.at("checkpoint", 2, 0)
    watch.waits()
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        if peer_beats:
            store.add("beat/1", 1)
        time.sleep(0.02)
    watch.close()
    assert int(store.get("beat/0")) > 1  # this rank beat too, for the others
    return exits


def test_a_frozen_rank_waiting_in_the_same_collective_is_named(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    assert _stall_with_peer(peer_beats=False, monkeypatch=monkeypatch)[:1] == [watchdog.EXIT_STUCK]
    err = capsys.readouterr().err
    assert ("train: error: rank 1 is not responding: its process is frozen or its host is gone; last seen waiting "
            "in checkpoint, epoch 2, batch 0; rank 0 waited 1 s in checkpoint, epoch 2, batch 0") in err, err
    assert "lost each other" not in err


def test_ranks_alive_in_the_same_collective_lost_each_other(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    assert _stall_with_peer(peer_beats=True, monkeypatch=monkeypatch)[:1] == [watchdog.EXIT_STUCK]
    err = capsys.readouterr().err
    assert "every rank is alive: the ranks lost each other" in err and "not responding" not in err, err


def test_several_silent_ranks_in_one_line() -> None:
    marks = {1: Mark(4, "train", 0, 7), 3: Mark(5, "validation", batch=2, waiting=True)}
    line = stuck_message(0, Mark(5, "validation", batch=2, waiting=True), marks, 9.0, silent=[1, 3])
    assert line == ("ranks 1, 3 are not responding: their processes are frozen or their hosts are gone; rank 1 last "
                    "seen in train, epoch 0, batch 7; rank 3 last seen waiting in validation, batch 2; rank 0 waited "
                    "9 s in validation, batch 2; ending the job")
