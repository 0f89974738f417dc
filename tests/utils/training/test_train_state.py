"""The run state (TrainState) and a checkpoint's train_state: RNG states, pack/unpack, pending gradients, world-size
rules."""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from utils.training.resume import (
    ResumeError,
    adapt_to_world_size,
    pack_train_state,
    restore_rng_state,
    unpack_train_state,
)
from utils.training.train_state import TrainPosition, TrainState, capture_rng_state, rng_state_for
from utils.weights.checkpoint import FORMAT, load_checkpoint, save_checkpoint


def run_state(position: TrainPosition) -> dict:
    """What TrainState.state_dict() gives for a run at ``position``."""
    return TrainState(position).state_dict()


def draws() -> tuple:
    return random.random(), random.gauss(0, 1), float(np.random.rand()), float(np.random.randn()), \
        torch.rand(3).tolist()


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
                            "train_state": pack_train_state(run_state(position), optimizer=optimizer,
                                                            scheduler=scheduler, ema=counter, scaler=None)},
                           tmp_path / "last.pt")
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
    state = pack_train_state(run_state(TrainPosition()), grads_of=model)
    torch.save(state, tmp_path / "s.pt")
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    unpack_train_state(torch.load(tmp_path / "s.pt", weights_only=True), grads_of=fresh)
    for before, after in zip(model.parameters(), fresh.parameters(), strict=True):
        assert (before.grad is None and after.grad is None) or torch.equal(before.grad, after.grad)
    assert fresh[1].bias.grad is None and fresh[0].weight.grad is not None
    with pytest.raises(ResumeError, match="gradients for 4 parameters, the model has 2"):
        unpack_train_state(state, grads_of=torch.nn.Linear(3, 2))


def test_restored_gradients_take_the_layout_of_their_parameters() -> None:
    conv = torch.nn.Conv2d(2, 4, 3)
    conv.weight.grad = torch.randn(4, 2, 3, 3)  # saved from an NCHW run
    state = pack_train_state(run_state(TrainPosition()), grads_of=conv)
    fresh = torch.nn.Conv2d(2, 4, 3).to(memory_format=torch.channels_last)  # resumed on the CPU: channels_last
    unpack_train_state(state, grads_of=fresh)
    assert torch.equal(fresh.weight.grad, conv.weight.grad)
    assert fresh.weight.grad.stride() == fresh.weight.stride()  # accumulation then adds in place, no reorder


def test_unpack_refuses_missing_state_and_other_versions() -> None:
    state = pack_train_state(run_state(TrainPosition()), ema=Counter())
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


def test_train_state_round_trips_position_best_fitness_maps_and_rng() -> None:
    state = TrainState(TrainPosition(epoch=3, samples_seen=16, batch_size=8), best_fitness=0.25,
                       maps=np.array([0.1, 0.2, 0.3]))
    state.advance(3, 24)
    saved = state.state_dict()
    assert saved["position"]["samples_seen"] == 24 and saved["maps"] == [0.1, 0.2, 0.3]
    restored = TrainState(maps=np.zeros(3))
    assert not restored.resumed
    restored.load_state_dict(torch.load(_roundtrip(saved), weights_only=True))
    assert (restored.epoch, restored.samples_seen, restored.best_fitness) == (3, 24, 0.25)
    assert restored.maps.tolist() == [0.1, 0.2, 0.3] and restored.saved_position == (3, 24) and restored.resumed
    assert restored.rng is not None and torch.equal(restored.rng["torch"], saved["rng"][0]["torch"])
    other_classes = TrainState(maps=np.zeros(2))
    other_classes.load_state_dict(saved)
    assert other_classes.maps.tolist() == [0.0, 0.0]  # maps of another class count are not taken


def _roundtrip(obj: dict) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer
