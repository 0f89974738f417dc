"""What a model config costs, found before it is built for real: its settings checked, its parameters counted and
one forward pass at an image size traced on the meta device (shapes only: no memory, no arithmetic).

A config from a stranger (a ``--cfg`` YAML, the description inside a ``.pt`` of ours or of a release) may be small
and still ask for minutes and gigabytes: an SPPF kernel of 2001 pads every map by 1000 pixels a side. So every
aten operation the pass calls is counted from its shapes, whatever block or head calls it: convolutions and
matrix products by torch's FLOP formulas, pooling windows by their area, every operation by the values it writes,
and the largest single tensor. Nothing here knows a block, a head or a task: a new one is counted as it runs.
Above a limit (``LIMITS``: the largest real models, yolov8x-seg, yolo11x and yolov5x at 1280 px, stay below a
tenth to a fifth of each) the config is refused in one line naming the row, before any of it runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from models.registry import LIMITS, ModelConfigError

REFERENCE_SIZE = 1280  # the image side the limits are set for; larger runs get limits in proportion to pixels
ATEN = torch.ops.aten
WINDOWED = {ATEN.max_pool2d, ATEN.max_pool2d_with_indices, ATEN.avg_pool2d, ATEN.max_pool1d, ATEN.avg_pool1d,
            ATEN.max_pool3d, ATEN.max_pool3d_with_indices, ATEN.avg_pool3d}
READS = {ATEN._local_scalar_dense.default, ATEN._to_copy.default}  # a number read out of a tensor (tolist, float)
BATCH_NORM = ATEN.native_batch_norm.default  # its meta kernel is a slow Python decomposition: shapes given here


@dataclass
class Cost:
    """One forward pass of one image: FLOPs of products, values written by all operations, the largest tensor."""

    parameters: int = 0
    flops: float = 0.0
    values: float = 0.0
    largest: int = 0
    operations: int = 0


def limits_at(size: int) -> dict[str, float]:
    """The cost limits of a pass at ``size`` px: LIMITS' values at REFERENCE_SIZE, in proportion to the pixels
    above it (a real model's cost grows with them)."""
    scale = max(1.0, (size / REFERENCE_SIZE) ** 2)
    return {"flops": LIMITS["flops"] * scale, "values": LIMITS["values"] * scale, "tensor": LIMITS["tensor"] * scale,
            "operations": LIMITS["operations"]}


# ------------------------------------------------------------------------------------------ settings
def _tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _settings(module: nn.Module) -> dict[str, tuple]:
    """The shape settings of one torch layer that must be positive integers (or non-negative, for padding)."""
    if isinstance(module, nn.modules.conv._ConvNd):
        padding = () if isinstance(module.padding, str) else _tuple(module.padding)
        return {"kernel": _tuple(module.kernel_size), "stride": _tuple(module.stride),
                "dilation": _tuple(module.dilation), "groups": (module.groups,),
                "channels": (module.in_channels, module.out_channels), "padding": padding}
    if isinstance(module, (nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd)):
        stride = _tuple(module.stride) if module.stride not in (None, ()) else _tuple(module.kernel_size)
        return {"kernel": _tuple(module.kernel_size), "stride": stride, "padding": _tuple(module.padding),
                "dilation": _tuple(getattr(module, "dilation", 1))}
    if isinstance(module, nn.Linear):
        return {"channels": (module.in_features, module.out_features)}
    if isinstance(module, nn.modules.batchnorm._NormBase):
        return {"channels": (module.num_features,)}
    return {}


def check_settings(block: nn.Module, where: str) -> None:
    """ModelConfigError (one line, starting with ``where``) when a layer of ``block`` has a kernel, stride,
    dilation, group or channel count that is not a positive integer (kernels and channels within LIMITS), or a
    negative padding: torch would fail deep inside (a division by a stride of 0) or loop over a huge window."""
    for name, module in block.named_modules():
        for setting, values in _settings(module).items():
            low, high = 0 if setting == "padding" else 1, LIMITS.get(setting, math.inf)
            if not all(isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in values):
                layer = f"{type(module).__name__} {name}".strip()
                bound = f"in {low}..{high}" if high < math.inf else f"of at least {low}"
                raise ModelConfigError(f"{where}: {layer} has {setting} {str(values)[:40]}; each must be an "
                                       f"integer {bound}")


# ------------------------------------------------------------------------------------------ cost of a pass
class CostCounter(TorchDispatchMode):
    """Counts every aten operation of a pass on meta tensors; ModelConfigError as soon as a limit is passed. A
    number read out of a meta tensor (a head reading its strides) reads as 1."""

    def __init__(self, limits: dict[str, float], source: str, size: int) -> None:
        super().__init__()
        self.cost, self.limits, self.source, self.size = Cost(), limits, source, size
        self.row: Any = "?"  # the row running (set by _rows_named)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in READS and isinstance(args[0], torch.Tensor) and args[0].is_meta and \
                (func is ATEN._local_scalar_dense.default or kwargs.get("device") == torch.device("cpu")):
            return 1 if func is ATEN._local_scalar_dense.default else \
                torch.ones(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype, device="cpu")
        if func is BATCH_NORM and args[0].is_meta:  # (out, saved mean, saved 1/std): (C,) in training, else (0,)
            x, saved = args[0], args[0].shape[1] if args[5] else 0
            out = (torch.empty_like(x), x.new_empty(saved), x.new_empty(saved))
        else:
            out = func(*args, **kwargs)
        self._count(func, args, kwargs, out)
        return out

    def _count(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        cost, packet = self.cost, func._overloadpacket
        tensors = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
        written = sum(t.numel() for t in tensors)
        cost.operations += 1
        cost.values += written
        cost.largest = max([cost.largest, *(t.numel() for t in tensors)])
        if packet in flop_registry:
            cost.flops += flop_registry[packet](*args, **kwargs, out_val=out)
        elif packet in WINDOWED and tensors:
            kernel = _tuple(args[1] if len(args) > 1 else kwargs.get("kernel_size", 1))
            cost.flops += tensors[0].numel() * math.prod(int(k) for k in kernel)
        self._check()

    def _check(self) -> None:
        cost, limits = self.cost, self.limits
        for name, value, what in (("tensor", cost.largest, "values in one tensor"),
                                  ("values", cost.values, "values written in all"),
                                  ("flops", cost.flops, "FLOPs"),
                                  ("operations", cost.operations, "operations")):
            if value > limits[name]:
                raise ModelConfigError(f"{self.source}: row {self.row} would take {value:,.4g} {what} for one "
                                       f"{self.size}x{self.size} image, more than the limit of {limits[name]:,.4g} "
                                       "(the largest real models take a sixth or less); refused before building it")


@contextmanager
def _rows_named(layers: nn.Module, counter: CostCounter) -> Iterator[None]:
    """Forward pre-hooks that tell the counter which row runs (for its message)."""
    def enter(module: nn.Module, inputs: Any) -> None:
        counter.row = getattr(module, "i", "?")

    handles = [layer.register_forward_pre_hook(enter) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def check_cost(layers: nn.Module, forward: Callable[[torch.Tensor], Any], channels: int, size: int,
               source: str) -> Cost:
    """The cost of ``forward`` (the model's rows ``layers``, built on the meta device, in train mode) over one
    ``channels`` x ``size`` x ``size`` image; ModelConfigError (one line naming the row) above ``limits_at(size)``
    or LIMITS' parameters. A pass that fails on its shapes is the rows not fitting together, one line too."""
    parameters = sum(p.numel() for p in layers.parameters())
    if parameters > LIMITS["parameters"]:
        raise ModelConfigError(f"{source}: {parameters:,} parameters, more than {LIMITS['parameters']:,}")
    counter = CostCounter(limits_at(size), source, size)
    try:
        with torch.no_grad(), torch.device("meta"), _rows_named(layers, counter), counter:  # new tensors: meta too
            forward(torch.zeros(1, channels, size, size))
    except ModelConfigError:
        raise
    except (RuntimeError, TypeError, ValueError, IndexError, ArithmeticError, NotImplementedError) as e:
        raise ModelConfigError(f"{source}: row {counter.row}: the rows do not fit together "
                               f"({(str(e).splitlines() or [type(e).__name__])[0][:200]})") from None
    counter.cost.parameters = parameters
    return counter.cost
