"""Early stopping: epochs without improvement, its state in checkpoints, patience 0 = never."""

from __future__ import annotations

import pytest

from utils.training.early_stop import EarlyStopping


def test_early_stopping_counts_epochs_without_improvement(caplog: pytest.LogCaptureFixture) -> None:
    stopper = EarlyStopping(patience=2)
    with caplog.at_level("INFO", logger="yolo"):
        decisions = [stopper(epoch, f) for epoch, f in enumerate([0.1, 0.3, 0.2, 0.25])]
    assert decisions == [False, False, False, True]
    assert (stopper.best_epoch, stopper.best_fitness) == (1, 0.3)
    assert "the best was epoch 1" in caplog.text
    restored = EarlyStopping(patience=2)
    restored.load_state_dict(stopper.state_dict())
    assert (restored.best_epoch, restored.best_fitness) == (1, 0.3)
    never = EarlyStopping(patience=0)
    assert not any(never(epoch, 0.0) for epoch in range(50))
