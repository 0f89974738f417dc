"""The classification head of YOLOv8-cls, YOLO11-cls and YOLO26-cls: a 1x1 Conv to 1280 channels, global average
pooling, dropout and a linear layer to the class logits.

Train mode returns the logits (b, nc) the cross-entropy reads (utils/training/loss_classify.py); eval mode (and
export) returns the softmax probabilities (b, nc), the ``probs`` layout of its output contract
(utils/tasks/contract.py): no boxes, no NMS; the classify task's post-processing ranks the classes
(utils/tasks/classify/predict.py). The children's names and order are the reference's (conv, pool, drop,
linear), so ultralytics' release files load by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from models.blocks import DEPTHWISE_CLS_HEAD
from models.common import Conv
from models.registry import LIMITS, ModelConfigError, Row, RowArgs, is_number, register_module
from utils.tasks.contract import OutputContract

HIDDEN = 1280  # the channels of the head's 1x1 convolution (fixed, whatever the width multiple)
DROPOUT = 0.0  # ultralytics' default dropout before the linear layer (its ``dropout`` training argument)


@register_module("Classify", table_name="utils.tasks.classify.head.Classify")
class Classify(nn.Module):
    """See the module docstring. The head interface of models/head.py: ``family``, ``task``, ``anchor_based``,
    ``contract``, ``stride`` (the network's total stride, found by the builder's dry run: the multiple an input
    size should have; not saved), ``set_strides``, ``init_biases``, ``export_metadata``.

    YAML row: ``[-1, 1, Classify, [nc]]``. ``family`` is YOLO11's when a C3k2 row came before (YOLO11-cls and
    YOLO26-cls are one network), else YOLOv8's.
    """

    task = "classify"
    anchor_based = False
    batchnorm = (1e-5, 0.1)  # the model's BatchNorm eps and momentum: PyTorch's, as the reference's classifiers keep

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[nc, kernel?, stride?]`` -> ``(c_in, nc, kernel, stride, family)``: the class count as written (never
        scaled by the width multiple), the input the sum of the sources' channels (a list ``from`` is concatenated),
        the family from the rows before (a C3k2 row's note)."""
        nc, *rest = row.args or [None]
        if isinstance(nc, bool) or not isinstance(nc, int) or not 1 <= nc <= LIMITS["classes"]:
            raise ModelConfigError(f"{row.where}: Classify takes the class count (1..{LIMITS['classes']}) first, "
                                   f"got {str(nc)[:40]}")
        if len(rest) > 2 or not all(is_number(v) and v == int(v) and 1 <= v <= 7 for v in rest):
            raise ModelConfigError(f"{row.where}: Classify takes [nc, kernel, stride] with kernel and stride in 1..7")
        kernel, stride = [*(int(v) for v in rest), 1, 1][:2]
        family = "yolo11" if row.notes.get(DEPTHWISE_CLS_HEAD) else "yolov8"
        return RowArgs([sum(row.channels_in), nc, kernel, stride, family], 1, 0)

    def __init__(self, c_in: int, nc: int = 1000, kernel: int = 1, stride: int = 1, family: str = "yolov8") -> None:
        super().__init__()
        self.nc = int(nc)
        self.family = family
        self.conv = Conv(c_in, HIDDEN, kernel, stride)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(p=DROPOUT, inplace=True)
        self.linear = nn.Linear(HIDDEN, self.nc)
        self.register_buffer("stride", torch.zeros(1), persistent=False)

    @property
    def contract(self) -> OutputContract:
        return OutputContract("probs", self.nc, task=self.task)

    def set_strides(self, stride: torch.Tensor) -> None:
        """The builder's dry run found the input's total downsampling."""
        with torch.no_grad():
            self.stride.copy_(stride.reshape(-1)[-1:])

    def clear_grid_cache(self) -> None:
        """No cached grids (the head interface asks every head after its strides or weights change)."""

    def init_biases(self, class_freq: torch.Tensor | None = None) -> None:
        """The linear layer starts at PyTorch's default initialisation (no prior, as the reference)."""

    def export_metadata(self) -> dict[str, Any]:
        return {"contract": self.contract.metadata(), "stride": [float(self.stride[-1])]}

    def forward(self, x: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        if isinstance(x, (list, tuple)):
            x = torch.cat(list(x), 1)
        logits = self.linear(self.drop(self.pool(self.conv(x)).flatten(1)))  # (b, nc)
        return logits if self.training else logits.softmax(1)
