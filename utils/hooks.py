"""Training events and the hooks that listen to them.

The epoch loop announces a small set of events; plots, checkpoints and anything a user adds plug into them
instead of into the loop. A hook overrides the events it needs:

    before_train(trainer)                   after set-up, before the first epoch
    before_epoch(trainer, epoch)
    before_step(trainer, epoch, batch)      before the batch's forward pass
    after_step(trainer, step)               after the batch's backward/step (``step``: a StepInfo)
    after_epoch(trainer, epoch, metrics)    after validation and the epoch's checkpoint
    on_checkpoint(trainer, position)        after last.pt was written (``position``: epoch, samples seen)
    after_train(trainer)                    after the last epoch (not after a failure)

Every rank calls every hook, in registration order; a hook that must act once checks
``utils.dist.is_main_process()`` when it is built, not in the loop.

From the command line, ``train.py --hook 'package.module:Factory(key=value, ...)'`` builds a hook: the module
is imported by its dotted name and the factory called with the literal keyword arguments (numbers, strings,
booleans, None, lists). Nothing else in the text is evaluated.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from utils.errors import UserError


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


class HookBase:
    """Does nothing at every event; subclass it and override the events you need."""

    def before_train(self, trainer: Any) -> None:
        pass

    def before_epoch(self, trainer: Any, epoch: int) -> None:
        pass

    def before_step(self, trainer: Any, epoch: int, batch: int) -> None:
        pass

    def after_step(self, trainer: Any, step: StepInfo) -> None:
        pass

    def after_epoch(self, trainer: Any, epoch: int, metrics: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, trainer: Any, epoch: int, samples_seen: int) -> None:
        pass

    def after_train(self, trainer: Any) -> None:
        pass


class Hooks(HookBase):
    """An ordered list of hooks, called like one hook."""

    def __init__(self, hooks: Iterable[HookBase] = ()) -> None:
        self.hooks = list(hooks)

    def append(self, hook: HookBase) -> None:
        self.hooks.append(hook)

    def before_train(self, trainer: Any) -> None:
        for hook in self.hooks:
            hook.before_train(trainer)

    def before_epoch(self, trainer: Any, epoch: int) -> None:
        for hook in self.hooks:
            hook.before_epoch(trainer, epoch)

    def before_step(self, trainer: Any, epoch: int, batch: int) -> None:
        for hook in self.hooks:
            hook.before_step(trainer, epoch, batch)

    def after_step(self, trainer: Any, step: StepInfo) -> None:
        for hook in self.hooks:
            hook.after_step(trainer, step)

    def after_epoch(self, trainer: Any, epoch: int, metrics: dict[str, float]) -> None:
        for hook in self.hooks:
            hook.after_epoch(trainer, epoch, metrics)

    def on_checkpoint(self, trainer: Any, epoch: int, samples_seen: int) -> None:
        for hook in self.hooks:
            hook.on_checkpoint(trainer, epoch, samples_seen)

    def after_train(self, trainer: Any) -> None:
        for hook in self.hooks:
            hook.after_train(trainer)


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
    try:
        hook = factory(**kwargs)
    except TypeError as e:
        raise HookError(f"--hook {spec!r}: {e}") from None
    if not isinstance(hook, HookBase):
        raise HookError(f"--hook {spec!r}: {factory_name} returned {type(hook).__name__}, not a HookBase")
    return hook
