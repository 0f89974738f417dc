"""Training hooks: the event list, and --hook specs that import a factory and pass literal arguments only."""

from __future__ import annotations

import pytest

from utils.hooks import HookBase, HookError, Hooks, load_hook, parse_hook_spec


class Recorder(HookBase):
    def __init__(self, name: str = "r", calls: list | None = None) -> None:
        self.name, self.calls = name, calls if calls is not None else []

    def before_epoch(self, trainer, epoch: int) -> None:  # noqa: ANN001
        self.calls.append((self.name, "before_epoch", epoch))

    def after_train(self, trainer) -> None:  # noqa: ANN001
        self.calls.append((self.name, "after_train"))


def make(name: str = "made", count: int = 0) -> Recorder:
    return Recorder(f"{name}{count}")


def test_hooks_run_in_order_and_silent_events_do_nothing() -> None:
    calls: list = []
    hooks = Hooks([Recorder("a", calls), Recorder("b", calls)])
    hooks.before_epoch(None, 3)
    hooks.after_step(None, None)  # not overridden: nothing
    hooks.after_train(None)
    assert calls == [("a", "before_epoch", 3), ("b", "before_epoch", 3), ("a", "after_train"), ("b", "after_train")]


def test_hook_specs_take_literal_keywords_only() -> None:
    assert parse_hook_spec("tests.utils.test_hooks:make") == ("tests.utils.test_hooks", "make", {})
    assert parse_hook_spec("m:F(rank=1, path='/x', on=True, sizes=[1, 2])") == \
        ("m", "F", {"rank": 1, "path": "/x", "on": True, "sizes": [1, 2]})
    hook = load_hook("tests.utils.test_hooks:make(name='x', count=2)")
    assert isinstance(hook, Recorder) and hook.name == "x2"
    for bad, message in [("no_colon", "expected"), ("m:F(1)", "as keywords"), ("m:F(a=__import__('os'))", "literals"),
                         ("no.such.module:F", "cannot import"), ("tests.utils.test_hooks:missing", "no callable"),
                         ("tests.utils.test_hooks:make(bogus=1)", "unexpected keyword"),
                         ("tests.utils.test_hooks:NAMES", "no callable")]:
        with pytest.raises(HookError, match=message):
            load_hook(bad)


NAMES = ["not", "callable"]


def test_hooks_run_by_priority_then_registration_order():
    from utils.hooks import CHECKPOINT_PRIORITY, LOGGER_PRIORITY, HookBase, Hooks

    calls = []

    class Named(HookBase):
        def __init__(self, name, priority):
            self.name, self.priority = name, priority

        def after_train(self, trainer):
            calls.append(self.name)

    Hooks([Named("user", 100), Named("logger", LOGGER_PRIORITY), Named("ckpt", CHECKPOINT_PRIORITY),
           Named("user2", 100)]).after_train(None)
    assert calls == ["ckpt", "logger", "user", "user2"]


def test_the_checkpointer_runs_first_whatever_the_registration_order():
    from utils.hooks import HookBase, Hooks
    from utils.training.checkpointer import Checkpointer

    hooks = Hooks([HookBase(), Checkpointer(save=lambda *args, **kwargs: None)])
    assert isinstance(hooks.hooks[0], Checkpointer)


def test_hooks_see_a_view_that_follows_the_run_and_may_only_wrap_the_loss():
    from types import SimpleNamespace

    from utils.hooks import HookBase, Hooks, TrainerView

    def loss(preds, targets):  # noqa: ANN001, ANN202
        return preds, targets

    hook = HookBase()
    run = SimpleNamespace(config="config", hyp={"lr0": 0.01}, state=SimpleNamespace(epoch=0), compute_loss=loss,
                          updater=SimpleNamespace(iteration=7), loss_names=("box", "cls", "dfl"),
                          family=SimpleNamespace(name="yolov8"), hooks=Hooks([hook]), ema=SimpleNamespace(ema="ema"))
    view = TrainerView(run)
    assert (view.config, view.hyp["lr0"], view.iteration, view.loss_names, view.family) == \
        ("config", 0.01, 7, ("box", "cls", "dfl"), "yolov8")
    assert view.hooks == (hook,) and view.ema_model == "ema"
    run.updater.iteration, run.state = 8, SimpleNamespace(epoch=3)  # live: the view follows the run
    assert view.iteration == 8 and view.state.epoch == 3
    for name in ("hyp", "state", "updater", "model"):
        with pytest.raises(AttributeError, match="may not set"):
            setattr(view, name, None)
    assert not hasattr(view, "updater") and not hasattr(view, "__dict__")  # the view offers what it declares only
    view.compute_loss = lambda preds, targets: loss(preds, targets)[::-1]  # wrapping the loss is allowed
    assert run.compute_loss(1, 2) == (2, 1) and view.compute_loss is run.compute_loss


def test_hook_state_round_trips_and_close_runs_every_hook():
    from utils.hooks import HookBase, Hooks

    closed = []

    class Tracker(HookBase):
        state_key = "tracker"

        def __init__(self):
            self.run_id = None

        def state_dict(self):
            return {"run_id": self.run_id}

        def load_state_dict(self, state):
            self.run_id = state["run_id"]

        def close(self, trainer, cancelled):
            closed.append(cancelled)
            raise RuntimeError("tracker down")

    class Other(HookBase):
        def close(self, trainer, cancelled):
            closed.append("other")

    first = Tracker()
    first.run_id = "abc"
    saved = Hooks([first, HookBase()]).state_dict()
    assert saved == {"tracker": {"run_id": "abc"}}
    second = Tracker()
    hooks = Hooks([second, Other()])
    hooks.load_state_dict(saved)
    assert second.run_id == "abc"
    try:
        hooks.close(None, cancelled=True)
    except RuntimeError as e:
        assert "tracker down" in str(e)
    else:
        raise AssertionError("the first close error is raised")
    assert closed == [True, "other"]
