"""Optimizer set-up and stepping: parameter groups, LR schedules with warmup, accumulation, clipping, EMA.

Everything here is a function of (epoch, global iteration) and plain counters, so a checkpoint that
stores those counters (``WeightUpdater.state_dict``) resumes the schedule exactly.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from utils.log import LOGGER

OPTIMIZERS = ("SGD", "Adam", "AdamW")
AUTO = "auto"  # --optimizer auto: the hyp file's optimizer entry if it has one, else choose_optimizer's rule
AUTO_LONG_RUN = 10_000  # optimizer steps at the nominal batch above which auto picks SGD (ultralytics' rule)
NOMINAL_BATCH = 64  # the batch the hyperparameters are tuned for; smaller batches accumulate up to it
MAX_GRAD_NORM = 10.0
MIN_WARMUP_ITERS = 100


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and DistributedDataParallel/DataParallel's wrappers, in either order (the
    model itself otherwise)."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def freeze_layers(model: nn.Module, freeze: list[int]) -> None:
    """``--freeze N`` freezes layers 0..N-1; ``--freeze i j k`` freezes those layers."""
    layers = list(range(freeze[0])) if len(freeze) == 1 else list(freeze)
    prefixes = tuple(f"model.{i}." for i in layers)
    frozen = 0
    for name, param in model.named_parameters():
        if prefixes and name.startswith(prefixes):
            param.requires_grad_(False)
            frozen += 1
    if frozen:
        LOGGER.info(f"Froze {frozen} tensors in layers {layers}")


def accumulate_steps(total_batch: int, nominal_batch: int = NOMINAL_BATCH) -> int:
    """Batches to accumulate before a step so that each step sees about ``nominal_batch`` images."""
    return max(round(nominal_batch / total_batch), 1)


def scaled_weight_decay(weight_decay: float, total_batch: int, accumulate: int,
                        nominal_batch: int = NOMINAL_BATCH) -> float:
    """Weight decay scaled by the images per step relative to the nominal batch."""
    return weight_decay * total_batch * accumulate / nominal_batch


@dataclass(frozen=True)
class BatchScaling:
    """The large-batch rule (docs/cluster.md) for a total batch above the nominal one, k = batch / nominal.

    The loss sums over the images of a step (the family's loss times the batch, times the world size), so a step's
    gradient already grows k times: SGD's step grows with it, and the linear scaling rule (Goyal et al. 2017) holds
    without touching lr0 (lr_factor 1; a further x k would scale it k squared). Adam and AdamW divide the gradient's
    scale away, so their lr0 is scaled: x sqrt(k), the square-root rule for adaptive methods (Malladi et al. 2022).
    The warmup keeps its length in images, warmup_epochs, without the minimum of MIN_WARMUP_ITERS iterations that
    guards small batches (at k times fewer iterations per epoch it would stretch the warmup k times). The EMA keeps
    its horizon in images: each of its updates stands for k nominal steps, so decay ** k and tau / k (Busbridge et
    al. 2023). Weight decay is scaled as at every batch (scaled_weight_decay). Used with --batch-scaling only; k = 1
    (nothing changes) at or below the nominal batch."""

    k: float = 1.0
    lr_factor: float = 1.0

    def text(self, total_batch: int, optimizer: str) -> str:
        """For the log: what the rule did, or '' when it did nothing."""
        if self.k == 1.0:
            return ""
        return f"batch {total_batch} = {self.k:g} x {NOMINAL_BATCH}: lr0 x {self.lr_factor:.4g} ({optimizer}), " \
               f"warmup warmup_epochs without a minimum, EMA decay ** {self.k:g}; "

    def scale_ema(self, ema: ModelEMA) -> None:
        """Give ``ema`` the same horizon in images as at the nominal batch (decay ** k, tau / k)."""
        ema.decay, ema.tau = ema.decay ** self.k, ema.tau / self.k


def batch_scaling(optimizer: str, total_batch: int, enabled: bool = False,
                  nominal_batch: int = NOMINAL_BATCH) -> BatchScaling:
    """The rule's factors for ``total_batch`` images per step with ``optimizer`` (see BatchScaling)."""
    if not enabled or total_batch <= nominal_batch:
        return BatchScaling()
    k = total_batch / nominal_batch
    return BatchScaling(k, 1.0 if optimizer.lower() == "sgd" else math.sqrt(k))


def min_warmup_iters(batch_scale: float = 1.0) -> int:
    """The warmup's minimum in iterations: MIN_WARMUP_ITERS, none under the large-batch rule (batch_scale > 1)."""
    return 0 if batch_scale > 1 else MIN_WARMUP_ITERS


def parameter_groups(model: nn.Module) -> tuple[list, list, list]:
    """(decayed weights, normalisation weights, biases): only conv/linear weights get weight decay."""
    decayed, norm_weights, biases = [], [], []
    norm_types = tuple(v for k, v in vars(nn).items() if "Norm" in k and isinstance(v, type))
    for module in unwrap(model).modules():
        for name, param in module.named_parameters(recurse=False):
            if name == "bias":
                biases.append(param)
            elif isinstance(module, norm_types):
                norm_weights.append(param)
            else:
                decayed.append(param)
    return decayed, norm_weights, biases


def build_optimizer(model: nn.Module, name: str = "SGD", lr: float = 0.01, momentum: float = 0.937,
                    weight_decay: float = 5e-4) -> torch.optim.Optimizer:
    """SGD (Nesterov), Adam or AdamW over three groups; group 0 holds the biases (warmup gives them bias lr)."""
    decayed, norm_weights, biases = parameter_groups(model)
    groups = [{"params": biases, "weight_decay": 0.0, "group": "bias"},
              {"params": decayed, "weight_decay": weight_decay, "group": "weight"},
              {"params": norm_weights, "weight_decay": 0.0, "group": "norm"}]
    key = name.lower()
    if key == "sgd":
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    elif key == "adam":
        optimizer = torch.optim.Adam(groups, lr=lr, betas=(momentum, 0.999))
    elif key == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))
    else:
        raise ValueError(f"optimizer {name!r} is not one of SGD, Adam, AdamW")
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
    return optimizer


@dataclass(frozen=True)
class OptimizerChoice:
    """The optimizer a run uses, the hyperparameters it trains with (``hyp`` with lr0, momentum and warmup_bias_lr as
    --optimizer auto set them) and why, for the log."""

    name: str
    hyp: dict
    reason: str = ""


def choose_optimizer(name: str, hyp: dict, num_classes: int, images: int, batch_size: int,
                     epochs: int) -> OptimizerChoice:
    """--optimizer as given, or for ``auto`` (docs/training-recipe.md): the hyp file's ``optimizer`` entry when it
    has one; else, as ultralytics decides it, SGD (lr0 0.01, momentum 0.9) when the run takes more than
    AUTO_LONG_RUN steps of the nominal batch (ceil(images / max(batch, 64)) * epochs), otherwise AdamW with
    lr0 = round(0.002 * 5 / (4 + classes), 6), momentum 0.9 and warmup_bias_lr 0, recorded in the returned hyp
    with the optimizer's name (``optimizer``: a run or --evolve generation given that hyp keeps these values as
    they are). The hyp's other values stay."""
    if name not in ("", AUTO):
        return OptimizerChoice(name, hyp)
    if hyp.get("optimizer"):
        return OptimizerChoice(str(hyp["optimizer"]), hyp, "auto: the hyp file's optimizer entry, ")
    steps = math.ceil(images / max(batch_size, NOMINAL_BATCH)) * epochs
    if steps > AUTO_LONG_RUN:
        chosen, changes = "SGD", {"lr0": 0.01, "momentum": 0.9}
    else:
        chosen, changes = "AdamW", {"lr0": round(0.002 * 5 / (4 + num_classes), 6), "momentum": 0.9,
                                    "warmup_bias_lr": 0.0}
    values = ", ".join(f"{k}={v:g}" for k, v in changes.items())
    reason = f"auto chose {chosen} ({values}) for {steps} steps of {max(batch_size, NOMINAL_BATCH)} images " \
             f"({'>' if steps > AUTO_LONG_RUN else '<='} {AUTO_LONG_RUN}) and {num_classes} classes: "
    return OptimizerChoice(chosen, {**hyp, **changes, "optimizer": chosen}, reason)  # the choice written down too


def describe_groups(optimizer: torch.optim.Optimizer) -> str:
    """``SGD(lr=0.01) with parameter groups 57 weight(decay=0.0), 60 weight(decay=0.0005), 60 bias``."""
    parts = [f"{len(g['params'])} {g.get('group', '?')}(decay={g['weight_decay']:g})" for g in optimizer.param_groups]
    return f"{type(optimizer).__name__}(lr={optimizer.param_groups[0]['initial_lr']:g}) with parameter groups " + \
        ", ".join(parts)


def lr_lambda(epochs: int, lrf: float, cosine: bool = False) -> Callable[[float], float]:
    """LR factor for an epoch: 1 at epoch 0 falling to ``lrf`` at ``epochs``, linearly or on a cosine."""
    if cosine:
        return lambda e: ((1 - math.cos(e * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return lambda e: (1 - e / epochs) * (1.0 - lrf) + lrf


class LRSchedule:
    """Per-epoch LR factor plus warmup: over the first ``warmup_iters`` iterations the bias group's lr falls
    from ``warmup_bias_lr`` and the others rise from 0 to their scheduled lr, momentum rises from
    ``warmup_momentum``, and the accumulation grows from 1 to its nominal value. ``batch_scale``: BatchScaling.k."""

    def __init__(self, hyp: dict, epochs: int, batches_per_epoch: int, cosine: bool = False,
                 accumulate: int = 1, batch_scale: float = 1.0) -> None:
        self.factor = lr_lambda(epochs, hyp["lrf"], cosine)
        self.momentum = hyp["momentum"]
        self.warmup_momentum = hyp.get("warmup_momentum", 0.8)
        self.warmup_bias_lr = hyp.get("warmup_bias_lr", 0.1)
        self.accumulate = accumulate
        warmup = max(round(hyp.get("warmup_epochs", 3.0) * batches_per_epoch), min_warmup_iters(batch_scale))
        # never more than half of the run, so short runs still train at full rate
        self.warmup_iters = int(min(warmup, epochs * batches_per_epoch / 2)) if hyp.get("warmup_epochs", 3.0) else 0

    def accumulate_at(self, iteration: int) -> int:
        """Batches to accumulate at global ``iteration`` (ramps up during warmup)."""
        if iteration >= self.warmup_iters:
            return self.accumulate
        return max(1, int(np.interp(iteration, [0, self.warmup_iters], [1, self.accumulate]).round()))

    def apply(self, optimizer: torch.optim.Optimizer, epoch: int, iteration: int) -> None:
        """Set every group's lr (and momentum during warmup) for this epoch and global iteration."""
        scheduled = self.factor(epoch)
        warm = iteration < self.warmup_iters
        for group in optimizer.param_groups:
            target = group["initial_lr"] * scheduled
            if warm:
                start = self.warmup_bias_lr if group.get("group") == "bias" else 0.0
                group["lr"] = float(np.interp(iteration, [0, self.warmup_iters], [start, target]))
                momentum = float(np.interp(iteration, [0, self.warmup_iters], [self.warmup_momentum, self.momentum]))
                _set_momentum(group, momentum)
            else:
                group["lr"] = target
                if iteration == self.warmup_iters:
                    _set_momentum(group, self.momentum)


def _set_momentum(group: dict, momentum: float) -> None:
    if "momentum" in group:
        group["momentum"] = momentum
    elif "betas" in group:
        group["betas"] = (momentum, group["betas"][1])


class ModelEMA:
    """Exponential moving average of the weights (and BN buffers): decay d * (1 - exp(-updates / tau)),
    which starts near 0 so that early epochs are not dominated by the random initialisation.

    Keep one on every rank: the parameters' updates are identical everywhere, but each rank's BatchNorm statistics
    are its own (DDP gives every forward rank 0's, then the rank's batch moves them), so before a distributed
    validation ``share_buffers`` gives every rank rank 0's (what last.pt holds).
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0) -> None:
        self.ema = copy.deepcopy(unwrap(model)).eval()
        self.decay, self.tau, self.updates = decay, tau, updates
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """ema = d * ema + (1 - d) * model for every floating-point tensor, as two foreach operations."""
        self.updates += 1
        d = self.current_decay()
        source = unwrap(model).state_dict()
        pairs = [(value, source[key].detach()) for key, value in self.ema.state_dict().items()
                 if value.dtype.is_floating_point]
        if pairs:
            averaged, latest = (list(side) for side in zip(*pairs))
            torch._foreach_mul_(averaged, d)
            torch._foreach_add_(averaged, latest, alpha=1 - d)

    @torch.no_grad()
    def share_buffers(self, broadcast: Callable[[torch.Tensor], Any]) -> None:
        """Every floating-point buffer (BatchNorm statistics) through ``broadcast`` (in place, from rank 0)."""
        for buffer in self.ema.buffers():
            if buffer.dtype.is_floating_point:
                broadcast(buffer)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "ema": self.ema.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        self.ema.load_state_dict(state["ema"])


class WeightUpdater:
    """Turns losses into weight updates: backward (AMP-scaled on CUDA), accumulation up to the nominal batch,
    warmup and LR schedule, gradient clipping, the optimizer step and the EMA update. Counts global iterations
    so a checkpoint resumes the schedule exactly.

    Under DDP the micro-batches of an accumulation that do not step run inside ``no_sync()`` (the caller asks
    ``sync_context()`` before the forward pass): gradients are all-reduced once per optimizer step, not once
    per batch. Until then each rank's gradients are its own; ``share_pending_grads()`` averages them when a
    checkpoint must hold them.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: LRSchedule,
                 ema: ModelEMA | None = None, amp: bool = False, max_grad_norm: float = MAX_GRAD_NORM) -> None:
        self.model, self.optimizer, self.schedule, self.ema = model, optimizer, schedule, ema
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp)
        self.max_grad_norm = max_grad_norm
        self.iteration = 0  # batches backpropagated since the start of training
        self.last_step = -1  # iteration of the last optimizer step
        self.steps = 0

    def begin_batch(self, epoch: int) -> None:
        """Set lr/momentum for the coming batch."""
        self.schedule.apply(self.optimizer, epoch, self.iteration)

    def will_step(self) -> bool:
        """True when the next backward completes an accumulation (so the optimizer steps after it)."""
        return self.iteration - self.last_step >= self.schedule.accumulate_at(self.iteration)

    @property
    def pending(self) -> bool:
        """Gradients of batches since the last optimizer step are waiting in ``.grad``."""
        return self.iteration - 1 > self.last_step

    def sync_context(self) -> contextlib.AbstractContextManager:
        """Wrap the coming forward and backward in it: DDP's ``no_sync()`` unless this batch steps."""
        if isinstance(self.model, nn.parallel.DistributedDataParallel) and not self.will_step():
            return self.model.no_sync()
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> bool:
        """Backpropagate ``loss`` and step when enough batches have accumulated; True when it stepped."""
        stepped = self.will_step()
        self.scaler.scale(loss).backward()
        if stepped:
            self.step()
        self.iteration += 1
        return stepped

    def step(self) -> None:
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)
        self.last_step = self.iteration
        self.steps += 1

    def share_pending_grads(self, all_reduce_mean: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Average the gradients accumulated since the last step over the ranks (``all_reduce_mean`` is
        utils.distributed.comm's), so every rank holds what a checkpoint stores. DDP's own average at the next step then
        gives the same total. All ranks must call it; a no-op without pending gradients or DDP."""
        if not self.pending or not isinstance(self.model, nn.parallel.DistributedDataParallel):
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            all_reduce_mean(flat)
            for grad, average in zip(grads, flat.split([g.numel() for g in grads])):
                grad.copy_(average.view_as(grad))  # in place: each .grad keeps its layout (channels_last on the CPU)

    def forget_pending(self) -> None:
        """Drop accumulated gradients; the next batch starts a fresh accumulation."""
        self.last_step = self.iteration - 1
        self.optimizer.zero_grad(set_to_none=True)

    def lrs(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scaler, EMA and the counters that position the schedule (plain types and tensors)."""
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None,
                "iteration": self.iteration, "last_step": self.last_step, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        self.iteration, self.last_step = int(state["iteration"]), int(state["last_step"])
        self.steps = int(state.get("steps", 0))
