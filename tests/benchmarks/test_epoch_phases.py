"""benchmarks.epoch_phases: exclusive phase times (nested phases counted once) and the shares built from them."""

from __future__ import annotations

from benchmarks import epoch_phases
from benchmarks.epoch_phases import STEP_LOOP, PhaseClock, shares


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
