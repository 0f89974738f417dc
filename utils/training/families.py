"""The model families training knows: for each, its loss (named terms), its hyperparameter file and the keys its
loss and recipe need. An open registry: a family is one ``register_family`` line; the trainer asks the model's
head which family it belongs to (``head.family``) and never tests which head it is.

A loss object (``LossFn``) has ``names`` (its terms, in the order of ``items``) and
``__call__(preds, targets) -> (total, items)``: ``total`` a scalar tensor to backpropagate (scaled by the batch size,
as YOLOv5's loss does), ``items`` a detached (len(names),) tensor of the terms to log. ``targets`` is (n, 6)
[image, class, cx, cy, w, h] normalised to [0, 1]. The factory gets the de-paralleled model and the run's
hyperparameters plus the two run options a loss may read, ``img_size`` and ``label_smoothing``. A loss whose
weights change over the run (YOLO26's one-to-many / one-to-one balance) defines ``set_epoch(epoch, epochs)``, which
the Trainer calls before every epoch (a resumed run's too).

A family's ``loss`` trains its heads of the base task (detection); every other task names its loss per family in
its record (utils/tasks/registry.py, ``Task.losses``), and ``loss_for(task)`` picks, from the head's ``task``. A
task's loss takes the batch's extra tensors by name as keywords (what the task's collate adds to a batch).

One DDP step = one process's step. Over W ranks of b images each (B = W b), rank r's loss is
``total_r = b * T_r`` and the Trainer backpropagates ``W * total_r``; DDP averages the gradients, so the step's
gradient is ``(1 / W) * sum_r W b grad T_r = b * sum_r grad T_r``. One process on the B images backpropagates
``B * T`` with T the terms on the whole batch. The two are equal exactly when ``sum_r T_r = W * T``, that is when
the ranks' terms average to the whole batch's. A term that is a sum over items (cells, positives, pixels) divided
by a count that depends on the batch (matched targets, positives, the sum of target scores, the cells of a mean),
``T = S / N`` with ``S = sum_r S_r`` and ``N = sum_r N_r``, gets that only when each rank divides its own sum by
``N / W``: ``sum_r S_r / (N / W) = W * S / N``. A loss therefore never divides by its own rank's count:
``utils.distributed.loss_share.LossShare(counts)`` all-reduces a call's counts once (every rank, every call, before
any early return) and gives ``divisor(i, floor)`` (a floor such as ``max(., 1)`` applies to the global count, as one
process applies it) and ``mean(local_mean, i)`` (a mean over this rank's items as its share of the global mean). A
divisor that is the same on every rank (the batch per rank, a fixed pixel count) needs nothing. For one process
both return the values the loss computed before, so its training is unchanged bit for bit. The logged terms (the
ranks' mean) are then the whole batch's too. BatchNorm still normalises each rank's batch alone (use --sync-bn on
GPUs).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import torch
from torch import nn

from utils.errors import UserError
from utils.hyp import HYPS_DIR, SYNTHETIC_DATA, SYNTHETIC_HYP
from utils.tasks.registry import BASE_TASK, all_tasks, get_task

BASE_HYP = ("lr0", "lrf", "momentum", "weight_decay")  # what the optimizer and its schedule read, in every family


class FamilyError(UserError, ValueError):
    """A family that is not registered, or whose loss is not installed; one line."""


class LossFn(Protocol):
    """What the trainer and evaluation need of a family's loss (see the module docstring)."""

    names: tuple[str, ...]

    def __call__(self, preds: Any, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


LossFactory = Callable[[nn.Module, dict], LossFn]


@dataclass(frozen=True)
class Family:
    """One family: ``loss`` builds its loss from (model, hyp); ``hyp_file`` is its default hyperparameters;
    ``required_hyp`` the keys a hyp file must hold to train it; ``synthetic_hyp_file`` the file tuned for the
    built-in synthetic set (None: ``hyp_file``); ``evolve_bounds`` overrides --evolve's (gain, low, high) per key."""

    name: str
    loss: LossFactory
    hyp_file: Path
    required_hyp: tuple[str, ...]
    synthetic_hyp_file: Path | None = None
    evolve_bounds: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "evolve_bounds", MappingProxyType(dict(self.evolve_bounds)))

    def loss_for(self, task: str = BASE_TASK) -> LossFactory:
        """The loss factory of this family's heads of ``task`` (the base task's: ``loss``; another task's: the one
        its record names for this family); a one-line FamilyError when it has none."""
        record = get_task(task)
        if record.base:
            return self.loss
        reference = record.loss_reference(self.name)
        if reference is None:
            known = [t.name for t in all_tasks() if t.base or t.loss_reference(self.name)]
            raise FamilyError(f"the {self.name} family has no {str(task)[:40]!r} loss (tasks: {', '.join(known)})")
        module, _, attribute = reference.partition(":")
        return lazy_loss(module, attribute, self.name)

    def default_hyp_file(self, data: str | Path | None) -> Path:
        """The hyp file used without --hyp: the synthetic set's tuned one for the built-in data (where the family
        has one), else ``hyp_file``."""
        synthetic = data is not None and Path(str(data)).name in SYNTHETIC_DATA
        tuned = self.synthetic_hyp_file
        return tuned if synthetic and tuned is not None and tuned.is_file() else self.hyp_file


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add (or replace) ``family`` in the registry; returns it."""
    _FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    """The family called ``name``; a one-line FamilyError naming the known ones otherwise."""
    found = _FAMILIES.get(str(name))
    if found is None:
        raise FamilyError(f"model family {str(name)[:40]!r} is not registered (known: {', '.join(_FAMILIES)})")
    return found


def family_names() -> list[str]:
    return list(_FAMILIES)


def lazy_loss(module: str, attribute: str, family: str) -> LossFactory:
    """A loss factory that imports ``module`` and calls its ``attribute`` only when a run needs it, so a family's
    loss is one file that may arrive later; until then the family fails with one line. The loss class is called
    with (model, hyp) and, where the hyp carries them, ``img_size`` and ``label_smoothing`` as keywords."""

    def build(model: nn.Module, hyp: dict) -> LossFn:
        try:
            factory = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as e:
            raise FamilyError(f"the {family} family's loss ({module}.{attribute}) is not available in this "
                              f"installation ({str(e).splitlines()[0][:120]})") from None
        run_options = {k: hyp[k] for k in ("img_size", "label_smoothing") if k in hyp}
        return factory(model, hyp, **run_options)

    return build


def _yolov5_loss(model: nn.Module, hyp: dict) -> LossFn:
    from utils.training.loss import ComputeLoss

    return ComputeLoss(model, hyp, int(hyp.get("img_size", 640)), float(hyp.get("label_smoothing", 0.0)))


ANCHOR_FREE_HYP = HYPS_DIR / "hyp.anchor-free.yaml"
ANCHOR_FREE_BOUNDS = {"box": (1, 1.0, 20.0), "cls": (1, 0.2, 4.0), "dfl": (1, 0.4, 6.0)}  # evolved gains' ranges

register_family(Family("yolov5", _yolov5_loss, HYPS_DIR / "hyp.scratch.yaml",
                       (*BASE_HYP, "box", "obj", "cls", "anchor_t"), synthetic_hyp_file=SYNTHETIC_HYP))
for _name in ("yolov8", "yolo11"):  # one anchor-free loss (task-aligned assigner, BCE + CIoU + DFL); own recipes
    register_family(Family(_name, lazy_loss("utils.training.loss_anchor_free", "AnchorFreeLoss", _name),
                           ANCHOR_FREE_HYP, (*BASE_HYP, "box", "cls", "dfl"), evolve_bounds=ANCHOR_FREE_BOUNDS))
register_family(Family("yolo26", lazy_loss("utils.training.loss_anchor_free", "EndToEndLoss", "yolo26"),
                       ANCHOR_FREE_HYP, (*BASE_HYP, "box", "cls", "dfl"), evolve_bounds=ANCHOR_FREE_BOUNDS))
