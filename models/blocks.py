"""Building blocks of the YOLOv8, YOLO11 and YOLO26 families: DWConv, C2f, C3k, C3k2, Attention, PSABlock, C2PSA.

Architectures as ultralytics defines them (the facts its YAMLs and release files hold: channels, kernels, the
order of children, so its release files map onto these modules name for name); our own code. Each block registers
its YAML name and how a row's arguments become its own (models/registry.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.common import C3, Bottleneck, Conv, exporting
from models.registry import Row, RowArgs, channel_args, register_module

DEPTHWISE_CLS_HEAD = "depthwise_cls_head"  # a note C3k2 leaves for the head (see C3k2.yaml_args)


@register_module("DWConv")
class DWConv(Conv):
    """Depthwise convolution: a Conv with one group per greatest common divisor of the channel counts."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, act: bool = True) -> None:
        super().__init__(c_in, c_out, kernel, stride, None, math.gcd(c_in, c_out), act)


@register_module("C2f")
class C2f(nn.Module):
    """CSP block with two convolutions: the first one's output split in two halves, ``n`` bottlenecks chained on
    the second half, and every intermediate output concatenated into the last 1x1 convolution (YOLOv8)."""

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[c_out, shortcut, ...]`` -> ``(c_in, scaled c_out, number, shortcut, ...)``."""
        return channel_args(row, repeats_inside=True)

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = False, groups: int = 1,
                 expansion: float = 0.5) -> None:
        super().__init__()
        self.c = int(c_out * expansion)  # hidden channels (the attribute name ultralytics' files hold)
        self.cv1 = Conv(c_in, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c_out, 1)
        self.m = nn.ModuleList(self._inner(shortcut, groups) for _ in range(n))

    def _inner(self, shortcut: bool, groups: int) -> nn.Module:
        return Bottleneck(self.c, self.c, shortcut, groups, expansion=1.0, kernels=(3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            y.append(block(y[-1]))
        return self.cv2(torch.cat(y, 1))


@register_module("C3k")
class C3k(C3):
    """C3 whose bottlenecks use two ``kernel`` x ``kernel`` convolutions (the inner block of C3k2 in YOLO11 m/l/x)."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True, groups: int = 1,
                 expansion: float = 0.5, kernel: int = 3) -> None:
        super().__init__(c_in, c_out, n, shortcut, groups, expansion)
        hidden = int(c_out * expansion)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, groups, expansion=1.0, kernels=(kernel, kernel))
                                 for _ in range(n)))


@register_module("C3k2")
class C3k2(C2f):
    """C2f whose inner blocks are 3x3 bottlenecks, C3k blocks (``c3k``), or a bottleneck followed by an attention
    block (``attn``, YOLO26's last neck block) (YOLO11, YOLO26)."""

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[c_out, c3k, expansion, attn]`` -> ``(c_in, scaled c_out, number, c3k, expansion, attn)``.

        As in ultralytics' builder: in the m, l and x scales every C3k2 uses C3k inner blocks, and a model with a
        C3k2 gets the depthwise class branch in its detection head (a note for the head row)."""
        built = channel_args(row, repeats_inside=True)
        args = built.args
        if row.scale and row.scale in "mlx":
            args = [*args, *([False] * (4 - len(args)))] if len(args) < 4 else args
            args[3] = True
        row.notes[DEPTHWISE_CLS_HEAD] = True
        return RowArgs(args, built.repeats, built.c_out)

    def __init__(self, c_in: int, c_out: int, n: int = 1, c3k: bool = False, expansion: float = 0.5,
                 attn: bool = False, groups: int = 1, shortcut: bool = True) -> None:
        self._c3k, self._attn = c3k, attn
        super().__init__(c_in, c_out, n, shortcut, groups, expansion)

    def _inner(self, shortcut: bool, groups: int) -> nn.Module:
        if self._attn:
            return nn.Sequential(Bottleneck(self.c, self.c, shortcut, groups, kernels=(3, 3)),
                                 PSABlock(self.c, attn_ratio=0.5, num_heads=max(self.c // 64, 1)))
        if self._c3k:
            return C3k(self.c, self.c, 2, shortcut, groups)
        return Bottleneck(self.c, self.c, shortcut, groups, kernels=(3, 3))


class Attention(nn.Module):
    """Multi-head self-attention over the pixels of a feature map, with a depthwise 3x3 positional term on the
    values (``pe``); queries and keys have ``attn_ratio`` of the head width."""

    def __init__(self, dim: int, num_heads: int = 8, attn_ratio: float = 0.5) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim ** -0.5
        keys = self.key_dim * num_heads
        self.qkv = Conv(dim, dim + 2 * keys, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, groups=dim, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads, kd, hd = self.num_heads, self.key_dim, self.head_dim
        # no arithmetic on sizes (h * w): a trace then holds no size-to-int ops, which Core ML cannot convert
        qkv = self.qkv(x).flatten(2).unflatten(1, (heads, 2 * kd + hd))  # (b, heads, 2 kd + hd, hw)
        q, k, v = qkv.split([kd, kd, hd], dim=2)
        if exporting():  # plain products: what every export format can express
            weights = ((q.transpose(-2, -1) @ k) * self.scale).softmax(dim=-1)  # (b, heads, hw, hw)
            out = v @ weights.transpose(-2, -1)  # (b, heads, hd, hw)
        else:  # the same attention by torch's fused kernel
            out = F.scaled_dot_product_attention(q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1),
                                                 scale=self.scale).transpose(-2, -1)
        out = out.reshape(x.shape) + self.pe(v.reshape(x.shape))
        return self.proj(out)


class PSABlock(nn.Module):
    """Attention then a two-layer 1x1 feed-forward, each with a residual connection (``shortcut``)."""

    def __init__(self, c: int, attn_ratio: float = 0.5, num_heads: int = 4, shortcut: bool = True) -> None:
        super().__init__()
        self.attn = Attention(c, num_heads=num_heads, attn_ratio=attn_ratio)
        self.ffn = nn.Sequential(Conv(c, c * 2, 1), Conv(c * 2, c, 1, act=False))
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x) if self.add else self.attn(x)
        return x + self.ffn(x) if self.add else self.ffn(x)


@register_module("C2PSA")
class C2PSA(nn.Module):
    """CSP block around ``n`` attention blocks on half the channels; input and output channels agree (YOLO11)."""

    @classmethod
    def yaml_args(cls, row: Row) -> RowArgs:
        """``[c_out, ...]`` -> ``(c_in, scaled c_out, number, ...)``."""
        return channel_args(row, repeats_inside=True)

    def __init__(self, c_in: int, c_out: int, n: int = 1, expansion: float = 0.5) -> None:
        super().__init__()
        if c_in != c_out:
            raise ValueError(f"C2PSA keeps its channels ({c_in} in, {c_out} out)")
        self.c = int(c_in * expansion)
        self.cv1 = Conv(c_in, 2 * self.c, 1, 1)
        self.cv2 = Conv(2 * self.c, c_in, 1)
        self.m = nn.Sequential(*(PSABlock(self.c, attn_ratio=0.5, num_heads=max(self.c // 64, 1)) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).split((self.c, self.c), dim=1)
        return self.cv2(torch.cat((a, self.m(b)), 1))
