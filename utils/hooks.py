"""Training events and the hooks that listen to them.

The epoch loop announces a small set of events; checkpoints, loggers, plots and anything a user adds plug into
them instead of into the loop. A hook overrides the events it needs. ``trainer`` is a TrainerView: what a hook may
read of the run (its RunConfig, hyperparameters, TrainState, the model without DDP, the EMA model, the loaders, the
loss's term names, ...), not the Trainer itself; the one thing a hook may replace is the loss function
(``trainer.compute_loss``, to wrap it):

    before_train(trainer)                          after set-up (and after a resume restored the state)
    before_epoch(trainer, epoch)
    before_step(trainer, epoch, batch)             before the batch's forward pass
    after_step(trainer, step)                      after the batch's backward/step (``step``: a StepInfo)
    after_epoch(trainer, epoch, metrics)           after validation; ``metrics``: the epoch's results.csv row by
                                                   column name ("train/<loss term>_loss" for each of the loss's
                                                   names, "metrics/mAP_0.5", "x/lr0", ...)
    on_checkpoint(trainer, epoch, samples_seen)    after last.pt was written; it holds the position (epoch,
                                                   samples of that epoch already seen)
    after_train(trainer)                           after the last epoch (not after a failure)
    close(trainer, cancelled)                      always, last: flush what is queued (``cancelled``: a stop
                                                   signal or an error ended the run; be quick)

Order: hooks run by ``priority`` (lower first), then in registration order. The Checkpointer has
CHECKPOINT_PRIORITY (0), so at ``after_epoch`` the epoch's last.pt and best.pt exist before any logger
(LOGGER_PRIORITY) or user hook (DEFAULT_PRIORITY) runs.

State: a hook with a ``state_key`` has its ``state_dict()`` (plain Python types) saved in every checkpoint under
``ckpt["hooks"][state_key]`` and handed back through ``load_state_dict`` when the run resumes, before
``before_train`` (a tracker's run id continues the same tracked run).

Every rank calls every hook; a hook that must act once checks ``utils.distributed.comm.is_main_process()``
when it is built, not in the loop.

From the command line, ``train.py --hook 'package.module:Factory(key=value, ...)'`` builds a hook: the module
is imported by its dotted name and the factory called with the literal keyword arguments (numbers, strings,
booleans, None, lists). Nothing else in the text is evaluated. The factory must be a HookBase subclass or a function
annotated to return one (``def make(...) -> MyHook``); anything else is refused before it is called.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils.errors import UserError

CHECKPOINT_PRIORITY = 0  # the Checkpointer: files exist before anything reads or uploads them
LOGGER_PRIORITY = 50  # results.csv, TensorBoard, trackers
DEFAULT_PRIORITY = 100  # plots and user hooks


class HookError(UserError, ValueError):
    """A ``--hook`` spec that cannot be read or built."""


@dataclass
class StepInfo:
    """What ``after_step`` hooks see of one batch."""

    epoch: int
    batch: int  # index in the whole epoch (a resumed epoch keeps counting from where it stopped)
    imgs: torch.Tensor  # (b, 3, h, w) float in [0, 1]
    targets: torch.Tensor  # (n, 6) [image, cls, cx, cy, w, h] normalised
    paths: Any
    stepped: bool  # the optimizer stepped after this batch (False while accumulating or when skipped)
    skipped: bool  # the batch's loss was non-finite on some rank, so no rank used it
    boundary: bool = True  # a checkpoint may be taken here (under DDP: no partial accumulation pending)
    save_due: bool = False  # rank 0's clock asked for a timed checkpoint (--save-interval-minutes)


class TrainerView:
    """What hooks see of a run (the Trainer of utils/training/loop.py builds one for its hooks). Every attribute is
    read-only and live (it follows the run), except ``compute_loss``, which a hook may replace with a wrapper of
    the same interface (``(preds, targets) -> (total, items)``)."""

    __slots__ = ("_trainer",)

    def __init__(self, trainer: Any) -> None:
        object.__setattr__(self, "_trainer", trainer)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "compute_loss":
            raise AttributeError(f"a hook may not set {name!r} on the run (only compute_loss, to wrap the loss)")
        self._trainer.compute_loss = value

    @property
    def config(self) -> Any:
        """The run's RunConfig (utils/training/config.py)."""
        return self._trainer.config

    @property
    def hyp(self) -> Mapping[str, Any]:
        """The run's hyperparameters."""
        return self._trainer.hyp

    @property
    def device(self) -> torch.device:
        return self._trainer.device

    @property
    def save_dir(self) -> Path:
        """The run folder."""
        return self._trainer.save_dir

    @property
    def names(self) -> list[str]:
        """The class names."""
        return self._trainer.names

    @property
    def family(self) -> str:
        """The model's family (utils/training/families.py)."""
        return self._trainer.family.name

    @property
    def loss_names(self) -> tuple[str, ...]:
        """The names of the loss's terms (results.csv's train/<name>_loss)."""
        return self._trainer.loss_names

    @property
    def state(self) -> Any:
        """The TrainState: position, best fitness, resumed, ... (utils/training/train_state.py)."""
        return self._trainer.state

    @property
    def iteration(self) -> int:
        """Batches backpropagated since the run began."""
        return self._trainer.updater.iteration

    @property
    def model_without_ddp(self) -> nn.Module:
        """The model being trained, without DDP's wrapper."""
        return self._trainer.model_without_ddp

    @property
    def ema_model(self) -> nn.Module:
        """The EMA of the weights: what is validated and saved."""
        return self._trainer.ema.ema

    @property
    def train_loader(self) -> Any:
        return self._trainer.train_loader

    @property
    def val_loader(self) -> Any:
        return self._trainer.val_loader

    @property
    def background(self) -> Any:
        """The plots' BackgroundTasks (utils/loggers/background.py)."""
        return self._trainer.background

    @property
    def stop(self) -> Any:
        """The GracefulStop: ``requested``, ``agreed``, ``signum``."""
        return self._trainer.stop

    @property
    def hooks(self) -> tuple[HookBase, ...]:
        """The run's hooks, in the order they run."""
        return tuple(self._trainer.hooks.hooks)

    @property
    def compute_loss(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        return self._trainer.compute_loss


class HookBase:
    """Does nothing at every event; subclass it and override the events you need."""

    priority: int = DEFAULT_PRIORITY
    state_key: str | None = None  # set to keep state in checkpoints (see the module docstring)

    def before_train(self, trainer: TrainerView) -> None:
        pass

    def before_epoch(self, trainer: TrainerView, epoch: int) -> None:
        pass

    def before_step(self, trainer: TrainerView, epoch: int, batch: int) -> None:
        pass

    def after_step(self, trainer: TrainerView, step: StepInfo) -> None:
        pass

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, trainer: TrainerView, epoch: int, samples_seen: int) -> None:
        pass

    def after_train(self, trainer: TrainerView) -> None:
        pass

    def close(self, trainer: TrainerView, cancelled: bool) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Hooks(HookBase):
    """Hooks called like one hook: by priority (lower first), then in the order they were added."""

    def __init__(self, hooks: Iterable[HookBase] = ()) -> None:
        self.hooks: list[HookBase] = []
        for hook in hooks:
            self.append(hook)

    def append(self, hook: HookBase) -> None:
        self.hooks.append(hook)
        self.hooks.sort(key=lambda h: h.priority)  # stable: registration order within a priority

    def before_train(self, trainer: TrainerView) -> None:
        for hook in self.hooks:
            hook.before_train(trainer)

    def before_epoch(self, trainer: TrainerView, epoch: int) -> None:
        for hook in self.hooks:
            hook.before_epoch(trainer, epoch)

    def before_step(self, trainer: TrainerView, epoch: int, batch: int) -> None:
        for hook in self.hooks:
            hook.before_step(trainer, epoch, batch)

    def after_step(self, trainer: TrainerView, step: StepInfo) -> None:
        for hook in self.hooks:
            hook.after_step(trainer, step)

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        for hook in self.hooks:
            hook.after_epoch(trainer, epoch, metrics)

    def on_checkpoint(self, trainer: TrainerView, epoch: int, samples_seen: int) -> None:
        for hook in self.hooks:
            hook.on_checkpoint(trainer, epoch, samples_seen)

    def after_train(self, trainer: TrainerView) -> None:
        for hook in self.hooks:
            hook.after_train(trainer)

    def close(self, trainer: TrainerView, cancelled: bool) -> None:
        """Every hook's close, even when one of them fails (the first error is raised after the rest ran)."""
        error: BaseException | None = None
        for hook in self.hooks:
            try:
                hook.close(trainer, cancelled)
            except Exception as e:  # noqa: BLE001 - the others must still flush
                error = error or e
        if error is not None:
            raise error

    def state_dict(self) -> dict[str, Any]:
        """{state_key: state} of the hooks that keep state (saved under ckpt["hooks"])."""
        return {h.state_key: h.state_dict() for h in self.hooks if h.state_key}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for hook in self.hooks:
            if hook.state_key and isinstance(state.get(hook.state_key), dict):
                hook.load_state_dict(state[hook.state_key])


def parse_hook_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``'pkg.mod:Factory(a=1, b="x")'`` -> ('pkg.mod', 'Factory', {'a': 1, 'b': 'x'}); literals only."""
    module, sep, call = spec.partition(":")
    if not sep or not module or not call:
        raise HookError(f"--hook {spec!r}: expected 'package.module:Factory' or 'package.module:Factory(key=value)'")
    try:
        node = ast.parse(call.strip(), mode="eval").body
    except SyntaxError:
        raise HookError(f"--hook {spec!r}: {call!r} is not a name or a call with keyword arguments") from None
    if isinstance(node, ast.Name):
        return module, node.id, {}
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
        raise HookError(f"--hook {spec!r}: give the factory's arguments as keywords, e.g. Factory(rank=1)")
    try:
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except ValueError:
        raise HookError(f"--hook {spec!r}: argument values must be literals (numbers, strings, lists)") from None
    return module, node.func.id, kwargs


def load_hook(spec: str) -> HookBase:
    """Import ``package.module`` and build the hook its factory returns (see the module docstring)."""
    module_name, factory_name, kwargs = parse_hook_spec(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise HookError(f"--hook {spec!r}: cannot import {module_name} ({e})") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise HookError(f"--hook {spec!r}: {module_name} has no callable {factory_name}")
    if not _builds_hooks(factory, module):
        raise HookError(f"--hook {spec!r}: {factory_name} is neither a HookBase subclass nor a function annotated to "
                        "return one (-> MyHook); it was not called")
    try:
        hook = factory(**kwargs)
    except TypeError as e:
        raise HookError(f"--hook {spec!r}: {e}") from None
    if not isinstance(hook, HookBase):
        raise HookError(f"--hook {spec!r}: {factory_name} returned {type(hook).__name__}, not a HookBase")
    return hook


def _builds_hooks(factory: Any, module: Any) -> bool:
    """True for a HookBase subclass, or a function whose return annotation names one (resolved by name in its
    module, never evaluated), so ``--hook`` calls nothing that is not meant to build a hook."""
    if isinstance(factory, type):
        return issubclass(factory, HookBase)
    try:
        returned = inspect.signature(factory, eval_str=False).return_annotation
    except (TypeError, ValueError):
        return False
    if isinstance(returned, str):
        target: Any = module
        for part in returned.split("."):
            target = getattr(target, part, None) if part.isidentifier() else None
        returned = target
    return isinstance(returned, type) and issubclass(returned, HookBase)
