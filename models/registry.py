"""The open registry of model blocks and heads, and how one YAML row becomes a block's constructor arguments.

A YAML row ``[from, number, module, args]`` names its module; the builder (models/yolo.py) looks the name up here,
never by ``eval``. Each registered class declares how its row's arguments become its constructor's (its
``yaml_args`` classmethod, or a ``spec`` given at registration for classes that are not ours, such as
``nn.Upsample``): input channels prepended, output channels scaled by the width multiple, repeats kept inside the
block, the source channels a head needs. One name may stand for several classes told apart by the row
(ultralytics' YAMLs call every detection head ``Detect``): each registration then says ``when`` it applies.

Adding a block is one decorated class::

    @register_module("MyBlock")
    class MyBlock(nn.Module):
        @classmethod
        def yaml_args(cls, row: Row) -> RowArgs:
            return channel_args(row)  # [c_out, ...] -> (c_in, scaled c_out, ...)

A task's heads (utils/tasks/<task>/head.py) register the same way; the modules each registered task names
(``Task.heads``) are imported the first time a name is looked up, so the model layer never imports a task's room.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torch import nn

from utils.errors import UserError
from utils.tasks.registry import all_tasks

# Bounds of a config from a file (a stranger's checkpoint holds one): yolov5x uses 1.33/1.25, n <= 9, 1280 channels,
# kernels of at most 13 (SPP).
# What one image's forward pass may cost at 1280 px (models/cost.py; more in proportion to the pixels above it):
# yolov8x-seg takes 1.3e12 FLOPs, yolo26x writes 2.5e9 values in 1160 operations, yolov8x's largest tensor 4.1e7.
LIMITS = {"multiple": 4.0, "repeats": 100, "channels": 8192, "kernel": 64, "rows": 256, "classes": 10_000,
          "levels": 8, "anchors": 32, "upsample": 8, "reg_max": 64, "parameters": 500_000_000, "flops": 2e13,
          "values": 4e10, "tensor": 2**28, "operations": 100_000}


class ModelConfigError(UserError, ValueError):
    """A model YAML the builder cannot use; the message names the file and the row."""


def make_divisible(x: float, divisor: int = 8) -> int:
    return int(math.ceil(x / divisor) * divisor)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Row:
    """One YAML row as its module class sees it (arguments already resolved: ``nc`` -> the class count, ...)."""

    name: str  # the module name in the YAML
    index: int
    where: str  # "file: row i (section)", the start of every error message about the row
    args: list
    repeats: int  # ``number`` after the depth multiple
    channels_in: list[int]  # output channels of each source row (one for an int ``from``)
    cfg: Mapping[str, Any]  # the whole model config (read-only)
    width: float = 1.0
    max_channels: float = math.inf
    scale: str = ""  # the model scale letter (n, s, m, l, x) for configs with ``scales``
    notes: dict[str, Any] = field(default_factory=dict)  # left by earlier rows for later ones (see C3k2)

    @property
    def c_in(self) -> int:
        return self.channels_in[0]

    def scaled(self, channels: float) -> int:
        """Output channels after the width multiple (and the scale's channel cap), rounded up to a multiple of 8."""
        return make_divisible(min(channels, self.max_channels) * self.width, 8)


class RowArgs(NamedTuple):
    """What a row builds: constructor arguments, how many copies in a row (1: the block repeats inside), channels
    out (0 for a head)."""

    args: list
    repeats: int
    c_out: int


Spec = Callable[[Row], RowArgs]
Predicate = Callable[[Mapping[str, Any], list], bool]


@dataclass(frozen=True)
class Entry:
    """A registered class: how its rows become arguments, when it applies, the name the layer table shows."""

    cls: type[nn.Module]
    spec: Spec
    when: Predicate | None = None
    table_name: str = ""


_REGISTRY: dict[str, list[Entry]] = {}


def register_module(name: str, cls: type[nn.Module] | None = None, *, spec: Spec | None = None,
                    when: Predicate | None = None, table_name: str = "") -> Any:
    """Register ``cls`` under the YAML name ``name`` (as a decorator when ``cls`` is omitted).

    ``spec(row) -> RowArgs`` defaults to the class's ``yaml_args`` classmethod. ``when(cfg, args)`` limits the
    entry to the rows it applies to, for a name several classes share; the first entry that applies is used.
    Registering the same class under the same name again replaces its entry (a module imported twice).
    """
    def add(target: type[nn.Module]) -> type[nn.Module]:
        row_spec = spec if spec is not None else getattr(target, "yaml_args", None)
        if row_spec is None:
            raise TypeError(f"{target.__name__} has no yaml_args classmethod and no spec was given")
        entries = [e for e in _REGISTRY.get(name, []) if e.cls is not target]
        qualname = table_name or f"{target.__module__}.{target.__name__}"
        _REGISTRY[name] = [*entries, Entry(target, row_spec, when, qualname)]
        return target

    return add if cls is None else add(cls)


def load_task_heads() -> None:
    """Import the head modules of every registered task (each registers its heads); once per process."""
    for task in all_tasks():
        for module in task.heads:
            importlib.import_module(module)


def lookup(name: Any, cfg: Mapping[str, Any], args: list) -> Entry | None:
    """The entry for YAML name ``name`` that applies to a row with ``args`` in ``cfg``; None when there is none."""
    if not isinstance(name, str):
        return None
    load_task_heads()
    for entry in _REGISTRY.get(name, []):
        if entry.when is None or entry.when(cfg, args):
            return entry
    return None


def known_names() -> list[str]:
    load_task_heads()
    return sorted(_REGISTRY)


# ------------------------------------------------------------------------------------------ common specs
def channel_args(row: Row, repeats_inside: bool = False) -> RowArgs:
    """``[c_out, *rest]`` -> ``[c_in, scaled c_out, *rest]``; with ``repeats_inside`` the row's number becomes the
    block's own third argument (``n``) and the block is built once."""
    args = row.args
    if not args or not is_number(args[0]) or args[0] <= 0:
        raise ModelConfigError(f"{row.where}: {row.name} needs a positive number of output channels as its first "
                               f"argument, got {str(args[:1])[:60]}")
    if args[0] > LIMITS["channels"]:
        raise ModelConfigError(f"{row.where}: {args[0]} channels is more than {LIMITS['channels']}")
    c_out = row.scaled(args[0])
    built = [row.c_in, c_out, *args[1:]]
    repeats = row.repeats
    if repeats_inside:
        built.insert(2, repeats)
        repeats = 1
    return RowArgs(built, repeats, c_out)


def same_channels(row: Row) -> RowArgs:
    """Arguments as written; the output has the input's channels (upsampling, identity layers)."""
    return RowArgs(list(row.args), row.repeats, row.c_in)


def upsample_args(row: Row) -> RowArgs:
    """``nn.Upsample``: ``[None, scale, mode]`` with a bounded scale."""
    args = row.args
    if len(args) < 2 or args[0] is not None or not is_number(args[1]) or not 0 < args[1] <= LIMITS["upsample"]:
        raise ModelConfigError(f"{row.where}: Upsample takes [None, scale (at most {LIMITS['upsample']}), mode]")
    return same_channels(row)


register_module("nn.Upsample", nn.Upsample, spec=upsample_args, table_name="torch.nn.modules.upsampling.Upsample")
register_module("Upsample", nn.Upsample, spec=upsample_args, table_name="torch.nn.modules.upsampling.Upsample")
