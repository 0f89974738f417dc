"""Building blocks of the YOLOv5 family: Conv, Bottleneck, C3, SPP, SPPF, Focus, Concat."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def autopad(kernel: int | Sequence[int], padding: int | Sequence[int] | None = None) -> int | list[int]:
    """'Same' padding for odd kernels when ``padding`` is None."""
    if padding is not None:
        return padding
    return kernel // 2 if isinstance(kernel, int) else [k // 2 for k in kernel]


class Conv(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU. ``fuse()`` folds the BN into the conv for inference."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, padding: int | None = None,
                 groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, autopad(kernel, padding), groups=groups, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(c_out)
        self.act: nn.Module = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold BatchNorm into the convolution (eval-mode statistics); the BN becomes Identity."""
        if not isinstance(self.bn, nn.BatchNorm2d):
            return
        conv, bn = self.conv, self.bn
        fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                          conv.dilation, conv.groups, bias=True).to(conv.weight)
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)  # (c_out,)
        fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
        conv_bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
        fused.bias.copy_((conv_bias - bn.running_mean) * scale + bn.bias)
        fused.requires_grad_(False)
        self.conv, self.bn = fused, nn.Identity()


class Bottleneck(nn.Module):
    """1x1 then 3x3 conv, with a residual connection when shapes allow."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True, groups: int = 1, expansion: float = 0.5) -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(hidden, c_out, 3, 1, groups=groups)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP block with three convolutions: one branch through ``n`` bottlenecks, one bypass, then merge."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True, groups: int = 1,
                 expansion: float = 0.5) -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(c_in, hidden, 1, 1)
        self.cv3 = Conv(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, groups, expansion=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), dim=1))


class SPP(nn.Module):
    """Spatial pyramid pooling: parallel max-pools of several kernel sizes, concatenated."""

    def __init__(self, c_in: int, c_out: int, kernels: Sequence[int] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(hidden * (len(kernels) + 1), c_out, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(k, stride=1, padding=k // 2) for k in kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [pool(x) for pool in self.m], dim=1))


class SPPF(nn.Module):
    """SPP with one 5x5 max-pool applied three times in series: same receptive fields (5, 9, 13), faster."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 5) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(hidden * 4, c_out, 1, 1)
        self.m = nn.MaxPool2d(kernel, stride=1, padding=kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), dim=1))


class Focus(nn.Module):
    """Space-to-depth (every other pixel into channels, x4) then a Conv: the early YOLOv5 stem."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, padding: int | None = None,
                 groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = Conv(c_in * 4, c_out, kernel, stride, padding, groups, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, c, h, w) -> (b, 4c, h/2, w/2)
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class Concat(nn.Module):
    """Concatenate a list of tensors along ``dimension``."""

    def __init__(self, dimension: int = 1) -> None:
        super().__init__()
        self.d = dimension

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, self.d)
