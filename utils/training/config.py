"""The run configuration: train.py's options as one typed, frozen object that the training library reads.

The library never reads the argparse namespace: train.py turns it into a RunConfig once (``from_options``), and
every later change (the image size rounded to the stride, a resumed run's options, an evolution generation's
folder) makes a new one with ``dataclasses.replace``. Options the library does not read itself (a logger's flags,
added by utils/loggers/registry.py) travel in ``extra`` and reach opt.yaml and the loggers unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class RunConfig:
    """What one training run is asked to do (the defaults are train.py's)."""

    weights: str = ""
    trust_weights: bool = False
    cfg: str = ""
    data: str = ""
    hyp: str = ""
    hyp_set: tuple[str, ...] = ()  # KEY=VALUE items over the hyp file's values
    epochs: int = 18
    batch_size: int = 16  # total over all ranks
    img_size: int = 128
    rect: bool = False
    image_weights: bool = False
    quad: bool = False
    noplots: bool = False
    resume: bool | str = False
    nosave: bool = False
    noval: bool = False
    noautoanchor: bool = False
    cache: str | None = None
    device: str = ""
    amp: str = "auto"
    channels_last: bool = False
    colour_on: str = "auto"  # where the HSV change runs: auto, loader, device (train.py --colour-on)
    compile: bool = False
    multi_scale: bool = False
    single_cls: bool = False
    fraction: float = 1.0  # the share of the training images trained on
    optimizer: str = "auto"  # utils.training.optim.AUTO
    sync_bn: bool = False
    workers: int = 8
    project: str = "runs/train"
    name: str = "exp"
    exist_ok: bool = False
    cos_lr: bool = False
    batch_scaling: bool = False  # the large-batch rule above a total batch of 64 (utils.training.optim)
    label_smoothing: float = 0.0
    patience: int = 100
    freeze: tuple[int, ...] = (0,)
    save_period: int = -1
    save_interval_steps: int = 0
    save_interval_minutes: float = 0.0
    seed: int = 0
    evolve: int = 0
    hook: tuple[str, ...] = ()
    loggers: tuple[str, ...] | None = None  # None: the default loggers (utils/loggers/registry.py)
    backend: str = "auto"
    ddp_timeout: float = 600.0
    ddp_long_timeout: float = 1800.0
    local_rank: int = -1
    save_dir: str = ""  # the run folder, once plan_run chose it
    extra: Mapping[str, Any] = field(default_factory=dict)  # options the library does not read (loggers' flags)

    def __post_init__(self) -> None:
        object.__setattr__(self, "freeze", tuple(self.freeze))
        object.__setattr__(self, "hook", tuple(self.hook))
        object.__setattr__(self, "hyp_set", tuple(self.hyp_set))
        if self.loggers is not None:
            object.__setattr__(self, "loggers", tuple(self.loggers))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @classmethod
    def from_options(cls, options: argparse.Namespace | Mapping[str, Any]) -> RunConfig:
        """A RunConfig from parsed options (a namespace or a dict such as a checkpoint's ``opt``)."""
        values = dict(options if isinstance(options, Mapping) else vars(options))
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = {**values.pop("extra", {}), **{k: v for k, v in values.items() if k not in known}}
        return cls(**{k: v for k, v in values.items() if k in known}, extra=extra)

    def options(self) -> dict[str, Any]:
        """Every option as plain Python types, by its flag's name (opt.yaml, checkpoints, loggers)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        values.update(self.extra)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` (options the library does not know go to ``extra``)."""
        known = {f.name for f in dataclasses.fields(self)}
        extra = {k: v for k, v in changes.items() if k not in known}
        if extra:
            changes = {k: v for k, v in changes.items() if k in known}
            changes["extra"] = {**self.extra, **extra}
        return dataclasses.replace(self, **changes)
