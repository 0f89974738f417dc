"""Building blocks of the YOLOv5 family (Conv, Bottleneck, C3, SPP, SPPF, Focus, Concat), which the later families
reuse: each registers its YAML name and says how a row's arguments become its own (models/registry.py)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from models.registry import Row, RowArgs, channel_args, register_module


def autopad(kernel: int | Sequence[int], padding: int | Sequence[int] | None = None) -> int | list[int]:
    """'Same' padding for odd kernels when ``padding`` is None."""
    if padding is not None:
        return padding
    return kernel // 2 if isinstance(kernel, int) else [k // 2 for k in kernel]


def exporting() -> bool:
    """Whether the forward is being traced, exported or compiled: the fast paths here are eager-only (in-place
    ``out=`` products, layout tricks), so the plain modules run instead and the exported graph stays standard."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()


def apply_conv(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)``; a 1x1 convolution of a channels_last tensor runs as one matrix product over its pixels instead.

    torch sends a 1x1 convolution at batch < 16 on one thread to a generic kernel that copies a channels_last
    input to NCHW and back; as (pixels, c_in) @ (c_in, c_out) it needs no copy and returns channels_last too.
    """
    if (conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.groups == 1 and conv.padding in ((0, 0), 0)
            and pixel_rows(x) and not exporting()):
        weight = conv.weight.view(conv.out_channels, conv.in_channels)
        pixels = x.permute(0, 2, 3, 1)
        if not pixels.is_contiguous():  # a channel slice: F.linear would run mm, then add the bias in a second pass
            b, h, w, _ = pixels.shape
            return linear_rows(pixel_matrix(x), weight, conv.bias).view(b, h, w, -1).permute(0, 3, 1, 2)
        return F.linear(pixels, weight, conv.bias).permute(0, 3, 1, 2)
    return conv(x)


def pixel_matrix(x: torch.Tensor) -> torch.Tensor:
    """The (pixels, channels) matrix view of a ``pixel_rows`` tensor (its rows may be longer than its channels)."""
    return x.as_strided((x.size(0) * x.size(2) * x.size(3), x.size(1)), (x.stride(3), 1), x.storage_offset())


def linear_rows(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``rows @ weight.T + bias`` as one BLAS call (the bias is the product's start value), optionally into ``out``."""
    if bias is None:
        return torch.mm(rows, weight.t(), out=out)
    return torch.addmm(bias, rows, weight.t(), out=out)


def pixel_rows(x: torch.Tensor) -> bool:
    """Whether the 4-D ``x`` is laid out channels-last with unit channel stride and equally spaced pixels (a
    channels_last tensor, or a channel slice of one): then (pixels, channels) is a strided matrix view of it."""
    if x.dim() != 4 or x.stride(1) != 1 or x.is_contiguous():
        return False
    row = x.stride(3)
    return row >= x.size(1) and x.stride(2) == row * x.size(3) and x.stride(0) == x.stride(2) * x.size(2)


_PACKED_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # conv -> (key, oneDNN-blocked weight)


def packed_conv(conv: nn.Conv2d, act: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """``act(conv(x))`` by oneDNN with the weight reordered into its blocked layout once (per input size) and the
    SiLU applied inside the convolution; None where ``_packable`` says no. torch otherwise reorders every weight at
    every call (README, Performance)."""
    if not _packable(conv, act, x):
        return None
    weight = conv.weight
    key = (tuple(x.shape), weight.data_ptr(), weight._version)
    cached = _PACKED_WEIGHTS.get(conv)
    if cached is None or cached[0] != key:
        cached = (key, torch.ops.mkldnn._reorder_convolution_weight(
            weight, list(conv.padding), list(conv.stride), list(conv.dilation), conv.groups, list(x.shape)))
        _PACKED_WEIGHTS[conv] = cached
    return torch.ops.mkldnn._convolution_pointwise(x, cached[1], conv.bias, list(conv.padding), list(conv.stride),
                                                   list(conv.dilation), conv.groups,
                                                   "swish" if isinstance(act, nn.SiLU) else "none", [], "")


def _packable(conv: nn.Conv2d, act: nn.Module, x: torch.Tensor) -> bool:
    """No autograd, no export, no dispatch mode (the FLOP counter must see an aten convolution), oneDNN present, a
    channels_last fp32 CPU input, a k > 1 zero-padded kernel (1x1 runs as a matrix product), SiLU or no activation;
    and a weight with a version counter (not an inference tensor), so an in-place change renews the packed copy."""
    if (torch.is_grad_enabled() or exporting() or is_in_torch_dispatch_mode() or not torch.backends.mkldnn.enabled
            or autocasting(x)):
        return False
    if not isinstance(act, nn.SiLU | nn.Identity) or conv.kernel_size == (1, 1) or conv.padding_mode != "zeros":
        return False
    weight = conv.weight
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and x.dim() == 4
            and x.is_contiguous(memory_format=torch.channels_last) and not weight.is_inference()
            and not isinstance(conv.padding, str) and torch.backends.mkldnn.is_available())


def autocasting(x: torch.Tensor) -> bool:
    """Whether autocast is on for ``x``'s device: the direct kernels and out= products above bypass its casts, so
    under it (validation during mixed-precision training) the plain modules run."""
    return torch.is_autocast_enabled(x.device.type)


def activate(act: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``act(x)``; an in-place SiLU runs out of place where autograd records it (same values): its backward needs
    the input, so in place autograd would first copy ``x`` - one more pass over the tensor (README, Performance)."""
    if isinstance(act, nn.SiLU) and act.inplace and x.requires_grad and torch.is_grad_enabled() and not exporting():
        return F.silu(x)
    return act(x)


@register_module("Conv")
class Conv(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU. ``fuse()`` folds the BN into the conv for inference."""

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[c_out, kernel, stride, ...]`` -> ``(c_in, scaled c_out, kernel, stride, ...)``."""
        return channel_args(row)

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, padding: int | None = None,
                 groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, autopad(kernel, padding), groups=groups, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(c_out)
        self.act: nn.Module = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.bn, nn.Identity) and (y := packed_conv(self.conv, self.act, x)) is not None:
            return y
        return activate(self.act, self.bn(apply_conv(self.conv, x)))

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


@register_module("Bottleneck")
class Bottleneck(nn.Module):
    """1x1 (YOLOv5; 3x3 in the later families' blocks: ``kernels``) then 3x3 conv, with a residual connection when
    shapes allow."""

    yaml_args = Conv.yaml_args

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True, groups: int = 1, expansion: float = 0.5,
                 kernels: tuple[int, int] = (1, 3)) -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, kernels[0], 1)
        self.cv2 = Conv(hidden, c_out, kernels[1], 1, groups=groups)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y

    def update_(self, x: torch.Tensor) -> None:
        """Inference: replace ``x`` by ``forward(x)`` in place (the residual is added into it), so a caller holding
        ``x`` in a larger buffer needs no copy back."""
        hidden = self.cv1(x)
        if self.add:
            x.add_(self.cv2(hidden))
        else:
            x.copy_(self.cv2(hidden))


@register_module("C3")
class C3(nn.Module):
    """CSP block with three convolutions: one branch through ``n`` bottlenecks, one bypass, then merge."""

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[c_out, shortcut, ...]`` -> ``(c_in, scaled c_out, number, shortcut, ...)``: the row's number is the
        block's own count of bottlenecks."""
        return channel_args(row, repeats_inside=True)

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True, groups: int = 1,
                 expansion: float = 0.5) -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(c_in, hidden, 1, 1)
        self.cv3 = Conv(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, groups, expansion=1.0) for _ in range(n)))
        self.register_buffer("merged_weight", None, persistent=False)  # set by merge() after fusing
        self.register_buffer("merged_bias", None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged_weight is not None and pixel_rows(x) and not torch.is_grad_enabled() and not exporting():
            return self._forward_merged(x)
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), dim=1))

    @torch.no_grad()
    def merge(self) -> None:
        """After ``fuse()``: cv1 and cv2 (two 1x1 convolutions of the same input) as one matrix product."""
        convs = (self.cv1.conv, self.cv2.conv)
        if any(c.bias is None or c.kernel_size != (1, 1) or c.stride != (1, 1) or c.groups != 1 for c in convs) or \
                not (isinstance(self.cv1.act, nn.SiLU) and isinstance(self.cv2.act, nn.SiLU)):
            return
        self.merged_weight = torch.cat([c.weight.reshape(c.out_channels, -1) for c in convs])
        self.merged_bias = torch.cat([c.bias for c in convs])

    def _forward_merged(self, x: torch.Tensor) -> torch.Tensor:
        """Inference on a channels_last ``x``: cv1 and cv2 write one (b, h, w, 2 hidden) buffer, the bottlenecks
        update its first half in place, and cv3 reads the buffer: no concatenation, no copy back."""
        both = F.silu(F.linear(x.permute(0, 2, 3, 1), self.merged_weight, self.merged_bias), inplace=True)
        first = both[..., :self.cv1.conv.out_channels].permute(0, 3, 1, 2)
        for bottleneck in self.m:
            bottleneck.update_(first)
        return self.cv3(both.permute(0, 3, 1, 2))


def max_pool_same(x: torch.Tensor, kernel: int) -> torch.Tensor:
    """``nn.MaxPool2d(kernel, 1, kernel // 2)(x)`` as row maxima then column maxima of shifted slices (same values).

    torch's NCHW max-pool kernel measured 10-15x slower on one CPU thread (benchmarks/bench_model.py); the separable
    form costs 2 (kernel - 1) elementwise maxima.
    """
    pad = kernel // 2
    padded = F.pad(x, (pad, pad, pad, pad), value=float("-inf"))
    rows = _running_max(padded, kernel, dim=-1)
    return _running_max(rows, kernel, dim=-2)


def _running_max(x: torch.Tensor, kernel: int, dim: int) -> torch.Tensor:
    """Maximum over each window of ``kernel`` consecutive elements along ``dim`` (the output is kernel - 1 shorter)."""
    length = x.size(dim) - kernel + 1
    out = torch.maximum(x.narrow(dim, 0, length), x.narrow(dim, 1, length))
    for shift in range(2, kernel):
        torch.maximum(out, x.narrow(dim, shift, length), out=out)
    return out


def _pool(pool: nn.MaxPool2d, x: torch.Tensor) -> torch.Tensor:
    """``pool(x)``; without autograd, the separable form (its gradient would split ties, the module's does not)."""
    if (torch.is_grad_enabled() and x.requires_grad) or not isinstance(pool.kernel_size, int) or exporting():
        return pool(x)
    return max_pool_same(x, pool.kernel_size)


@register_module("SPP")
class SPP(nn.Module):
    """Spatial pyramid pooling: parallel max-pools of several kernel sizes, concatenated."""

    yaml_args = Conv.yaml_args

    def __init__(self, c_in: int, c_out: int, kernels: Sequence[int] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(hidden * (len(kernels) + 1), c_out, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(k, stride=1, padding=k // 2) for k in kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [_pool(pool, x) for pool in self.m], dim=1))


@register_module("SPPF")
class SPPF(nn.Module):
    """SPP with one 5x5 max-pool applied ``pools`` (3) times in series: same receptive fields (5, 9, 13), faster.

    A row that gives the pool count (YOLO26: ``[c_out, 5, 3, True]``) builds ultralytics 8.4's form: the first 1x1
    convolution linear (no SiLU), and with ``shortcut`` the input added to the output when the channels agree; rows
    of two arguments (YOLOv5, YOLOv8, YOLO11) keep the SiLU, as that version's builder and release files do.
    """

    yaml_args = Conv.yaml_args

    def __init__(self, c_in: int, c_out: int, kernel: int = 5, pools: int | None = None,
                 shortcut: bool = False) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, 1, act=pools is None)
        pools = 3 if pools is None else pools
        self.cv2 = Conv(hidden * (pools + 1), c_out, 1, 1)
        self.m = nn.MaxPool2d(kernel, stride=1, padding=kernel // 2)
        self.n = pools  # the attribute names of ultralytics' SPPF, which its release files hold
        self.add = bool(shortcut) and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(self.n):
            y.append(_pool(self.m, y[-1]))
        out = self.cv2(torch.cat(y, dim=1))
        return x + out if self.add else out


@register_module("Focus")
class Focus(nn.Module):
    """Space-to-depth (every other pixel into channels, x4) then a Conv: the early YOLOv5 stem."""

    yaml_args = Conv.yaml_args

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, padding: int | None = None,
                 groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = Conv(c_in * 4, c_out, kernel, stride, padding, groups, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, c, h, w) -> (b, 4c, h/2, w/2)
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


@register_module("Concat")
class Concat(nn.Module):
    """Concatenate a list of tensors along ``dimension``."""

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """Arguments as written; the output has the sum of the sources' channels."""
        return RowArgs(list(row.args), row.repeats, sum(row.channels_in))

    def __init__(self, dimension: int = 1) -> None:
        super().__init__()
        self.d = dimension

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, self.d)
