"""Exact-resume pieces: RNG states, train_state pack/unpack, world-size rules, run folder and checkpoint choice."""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as tdist

from utils import dist, resume
from utils.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from utils.resume import (
    ResumeError,
    SaveInterval,
    TrainPosition,
    adapt_to_world_size,
    capture_rng_state,
    find_resume_checkpoint,
    pack_train_state,
    plan_run,
    restore_rng_state,
    resume_options,
    rng_state_for,
    unpack_train_state,
)


def draws() -> tuple:
    return random.random(), random.gauss(0, 1), float(np.random.rand()), float(np.random.randn()), \
        torch.rand(3).tolist()


def opts(tmp_path: Path, resume: object = False, name: str = "exp") -> argparse.Namespace:
    return argparse.Namespace(project=str(tmp_path / "runs"), name=name, exist_ok=False, resume=resume)


def write_last(run_dir: Path, epoch: int = 0) -> Path:
    return save_checkpoint({"format": FORMAT, "model": {}, "model_yaml": {}, "epoch": epoch},
                           run_dir / "weights" / "last.pt")


@pytest.fixture
def job_store(monkeypatch: pytest.MonkeyPatch) -> tdist.Store:
    """An in-process stand-in for torchrun's agent store (the real one is exercised in test_elastic_restart)."""
    store = tdist.HashStore()
    monkeypatch.setattr(dist, "job_store", lambda timeout_s=60.0: store)
    return store


def test_rng_round_trip_through_weights_only_file(tmp_path: Path) -> None:
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    np.random.randn()
    state = capture_rng_state()
    expected = draws()
    torch.save({"rng": state}, tmp_path / "rng.pt")
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)["rng"]
    draws()  # move every generator on
    restore_rng_state(loaded)
    assert draws() == expected


def test_restore_rejects_malformed_state() -> None:
    with pytest.raises(ResumeError, match="RNG state is incomplete"):
        restore_rng_state({"python": {}})


def test_rng_state_for_rules() -> None:
    state = {"rng": [{"r": 0}, {"r": 1}]}
    assert rng_state_for(state, 1, 2) == {"r": 1}
    assert rng_state_for(state, 0, 1) == {"r": 0}  # resized job: rank 0 takes rank 0's stream
    assert rng_state_for(state, 2, 4) is None  # other ranks keep their fresh seed


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


def test_pack_unpack_restores_optimizer_scheduler_and_position(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 1 - e / 10)
    counter = Counter()
    for _ in range(3):
        model(torch.ones(4, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
        counter.count += 1
    position = TrainPosition(epoch=2, samples_seen=48, batch_size=16, world_size=2, accumulate=4)
    path = save_checkpoint({"format": FORMAT, "model": {}, "model_yaml": {},
                            "train_state": pack_train_state(position, optimizer=optimizer, scheduler=scheduler,
                                                            ema=counter, scaler=None)}, tmp_path / "last.pt")
    state = load_checkpoint(path)["train_state"]  # weights_only load

    model2 = torch.nn.Linear(3, 2)
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, lambda e: 1 - e / 10)
    counter2 = Counter()
    restored = unpack_train_state(state, optimizer=optimizer2, scheduler=scheduler2, ema=counter2)
    assert restored == position and restored.step_in_epoch == 3
    assert counter2.count == 3 and scheduler2.last_epoch == 3
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(0.07)
    buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    buffers2 = [optimizer2.state[p]["momentum_buffer"] for p in model2.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(buffers, buffers2, strict=True))


def test_pending_gradients_survive_a_checkpoint_between_steps(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[1].bias.requires_grad_(False)  # a parameter without a gradient stays without one
    model(torch.ones(4, 3)).sum().backward()  # accumulated, not yet stepped
    state = pack_train_state(TrainPosition(), grads_of=model)
    torch.save(state, tmp_path / "s.pt")
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    unpack_train_state(torch.load(tmp_path / "s.pt", weights_only=True), grads_of=fresh)
    for before, after in zip(model.parameters(), fresh.parameters(), strict=True):
        assert (before.grad is None and after.grad is None) or torch.equal(before.grad, after.grad)
    assert fresh[1].bias.grad is None and fresh[0].weight.grad is not None
    with pytest.raises(ResumeError, match="gradients for 4 parameters, the model has 2"):
        unpack_train_state(state, grads_of=torch.nn.Linear(3, 2))


def test_unpack_refuses_missing_state_and_other_versions() -> None:
    state = pack_train_state(TrainPosition(), ema=Counter())
    with pytest.raises(ResumeError, match="no 'optimizer' state"):
        unpack_train_state(state, optimizer=Counter())
    with pytest.raises(ResumeError, match="version 99"):
        unpack_train_state({**state, "version": 99})


def test_world_size_change_keeps_batch_accumulation_schedule(caplog: pytest.LogCaptureFixture) -> None:
    saved = TrainPosition(epoch=1, samples_seen=32, batch_size=16, world_size=2, accumulate=4)
    with caplog.at_level("INFO", logger="yolo"):
        adapted, changes = adapt_to_world_size(saved, 1, requested_batch=8)
    assert adapted == TrainPosition(epoch=1, samples_seen=32, batch_size=16, world_size=1, accumulate=4)
    assert changes == ["--batch-size 8 ignored: a resumed run keeps its total batch 16",
                       "processes 2 -> 1, batch per process 8 -> 16"]
    assert "kept total batch 16, accumulation 4 to nominal batch 64" in caplog.text
    assert adapt_to_world_size(saved, 2) == (saved, [])
    with pytest.raises(ResumeError, match="total batch 16 cannot be split over 3 processes"):
        adapt_to_world_size(saved, 3)


def test_find_resume_checkpoint_from_flag(tmp_path: Path) -> None:
    assert find_resume_checkpoint(opts(tmp_path)) is None
    old = write_last(tmp_path / "runs" / "exp")
    new = write_last(tmp_path / "runs" / "exp2")
    os.utime(old, (time.time() - 100, time.time() - 100))
    assert find_resume_checkpoint(opts(tmp_path, resume=True)) == new  # bare --resume: the latest
    assert find_resume_checkpoint(opts(tmp_path, resume=str(old))) == old
    assert find_resume_checkpoint(opts(tmp_path, resume=str(old.parent.parent))) == old  # a run folder
    with pytest.raises(ResumeError, match="nothere.pt not found"):
        find_resume_checkpoint(opts(tmp_path, resume=str(tmp_path / "nothere.pt")))
    with pytest.raises(ResumeError, match="no last.pt found under"):
        find_resume_checkpoint(opts(tmp_path / "empty", resume=True))


def test_plan_run_new_and_resumed(tmp_path: Path) -> None:
    first = plan_run(opts(tmp_path))
    second = plan_run(opts(tmp_path))
    assert (first.save_dir.name, second.save_dir.name) == ("exp", "exp2") and first.save_dir.is_dir()
    assert first.resume_from is None and first.reason == "new run"
    last = write_last(first.save_dir)
    resumed = plan_run(opts(tmp_path, resume=str(last)))
    assert resumed == resume.RunPlan(first.save_dir, last, "--resume")
    with pytest.raises(ResumeError, match="--resume .*missing.pt"):
        plan_run(opts(tmp_path, resume=str(tmp_path / "missing.pt")))


def test_plan_run_after_elastic_restart_uses_recorded_folder(tmp_path: Path, job_store: tdist.Store,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    first = plan_run(opts(tmp_path))  # attempt 0 records its folder
    assert job_store.get(resume.RUN_DIR_KEY).decode() == str(first.save_dir.resolve())
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    no_checkpoint_yet = plan_run(opts(tmp_path))  # died before saving: start again in the same folder
    assert no_checkpoint_yet == resume.RunPlan(first.save_dir.resolve(), None, "elastic restart 1")
    last = write_last(first.save_dir, epoch=1)
    again = plan_run(opts(tmp_path, resume=False))
    assert again.save_dir == first.save_dir.resolve() and again.resume_from == last.resolve()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["exp"]


def test_restart_without_agent_store_starts_new_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert plan_run(opts(tmp_path)).reason == "new run"


def test_resume_options_keep_runtime_flags() -> None:
    current = argparse.Namespace(epochs=10, batch_size=8, device="cpu", workers=0, resume="x.pt", new_flag=1)
    merged = resume_options(current, {"epochs": 3, "batch_size": 16, "device": "0", "workers": 8, "gone": 1})
    assert vars(merged) == {"epochs": 3, "batch_size": 16, "device": "cpu", "workers": 0, "resume": "x.pt",
                            "new_flag": 1}


def test_save_interval_by_steps_and_minutes() -> None:
    assert [s for s in range(10) if SaveInterval(steps=3).due(s)] == [3, 6, 9]
    assert not any(SaveInterval().due(s) for s in range(10))
    now = [0.0]
    interval = SaveInterval(minutes=1, clock=lambda: now[0])
    assert not interval.due(1)
    now[0] = 61.0
    assert interval.due(2) and not interval.due(3)  # the clock restarts at each save
    now[0] = 125.0
    assert interval.due(4)
