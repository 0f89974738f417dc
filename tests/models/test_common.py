"""The building blocks: shapes, BatchNorm folding, residuals, SPP/SPPF equivalence, Focus's space-to-depth."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from models.common import (
    C3,
    SPP,
    SPPF,
    Bottleneck,
    Concat,
    Conv,
    Focus,
    activate,
    apply_conv,
    autopad,
    max_pool_same,
    packed_conv,
    pixel_rows,
)


def _randomise_batchnorm(module: nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in (m for m in module.modules() if isinstance(m, nn.BatchNorm2d)):
            c = bn.num_features
            bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.3)
            bn.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            bn.weight.copy_(torch.rand(c, generator=gen) + 0.5)
            bn.bias.copy_(torch.randn(c, generator=gen) * 0.3)


def test_autopad() -> None:
    assert autopad(1) == 0 and autopad(3) == 1 and autopad(6) == 3
    assert autopad(3, 0) == 0
    assert autopad([3, 5]) == [1, 2]


@pytest.mark.parametrize("kernel, stride, size, expected", [(1, 1, 16, 16), (3, 1, 16, 16), (3, 2, 16, 8),
                                                            (6, 2, 64, 32)])
def test_conv_output_size(kernel: int, stride: int, size: int, expected: int) -> None:
    padding = 2 if kernel == 6 else None  # the 6x6 stem of the current YOLOv5 uses padding 2
    conv = Conv(3, 8, kernel, stride, padding)
    assert conv(torch.rand(1, 3, size, size)).shape == (1, 8, expected, expected)
    assert conv.conv.bias is None and isinstance(conv.act, nn.SiLU)


def test_conv_is_conv_bn_silu() -> None:
    conv = Conv(4, 6, 3).eval()
    _randomise_batchnorm(conv)
    x = torch.rand(2, 4, 8, 8)
    with torch.no_grad():
        expected = nn.functional.silu(conv.bn(conv.conv(x)))
        assert torch.equal(conv(x), expected)
    linear = Conv(4, 6, 1, act=False).eval()
    _randomise_batchnorm(linear)
    assert isinstance(linear.act, nn.Identity)
    with torch.no_grad():
        assert linear(x).min() < 0  # no activation clips the output


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_fuse_matches(groups: int) -> None:
    conv = Conv(4, 6, 3, 2, groups=groups).eval()
    _randomise_batchnorm(conv)
    x = torch.rand(2, 4, 9, 9)
    with torch.no_grad():
        before = conv(x)
        conv.fuse()
        after = conv(x)
    assert isinstance(conv.bn, nn.Identity) and conv.conv.bias is not None and conv.conv.groups == groups
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    conv.fuse()  # a second fuse changes nothing
    with torch.no_grad():
        assert torch.equal(conv(x), after)


def test_bottleneck_residual() -> None:
    block = Bottleneck(8, 8).eval()
    x = torch.rand(1, 8, 8, 8)
    with torch.no_grad():
        assert block.add
        assert torch.allclose(block(x), x + block.cv2(block.cv1(x)))
    no_shortcut = Bottleneck(8, 8, shortcut=False)
    widening = Bottleneck(8, 16)
    assert not no_shortcut.add and not widening.add
    assert widening(x).shape == (1, 16, 8, 8)


def test_c3_shapes_and_depth() -> None:
    block = C3(16, 32, n=3, shortcut=False)
    assert len(block.m) == 3 and all(not b.add for b in block.m)
    assert block.cv1.conv.out_channels == 16 and block.cv3.conv.in_channels == 32
    assert block(torch.rand(2, 16, 8, 8)).shape == (2, 32, 8, 8)


def test_sppf_equals_spp_with_the_same_weights() -> None:
    """Three chained 5x5 max-pools see the same windows as parallel 5, 9 and 13 pools."""
    torch.manual_seed(0)
    spp = SPP(16, 24, (5, 9, 13)).eval()
    sppf = SPPF(16, 24, 5).eval()
    _randomise_batchnorm(spp)
    sppf.load_state_dict(spp.state_dict())
    x = torch.randn(2, 16, 20, 20)
    with torch.no_grad():
        torch.testing.assert_close(sppf(x), spp(x))
    assert sum(p.numel() for p in spp.parameters()) == sum(p.numel() for p in sppf.parameters())


def test_focus_space_to_depth() -> None:
    focus = Focus(2, 8, 3)
    seen: list[torch.Tensor] = []
    focus.conv.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    x = torch.arange(2 * 4 * 6, dtype=torch.float32).view(1, 2, 4, 6)
    assert focus(x).shape == (1, 8, 2, 3)
    stacked = seen[0]
    assert stacked.shape == (1, 8, 2, 3)
    # channel blocks: (even row, even col), (odd row, even col), (even row, odd col), (odd row, odd col)
    for block, (dy, dx) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        assert torch.equal(stacked[0, 2 * block:2 * block + 2], x[0, :, dy::2, dx::2])


def test_concat() -> None:
    a, b = torch.rand(1, 2, 4, 4), torch.rand(1, 3, 4, 4)
    assert torch.equal(Concat()([a, b]), torch.cat((a, b), 1))
    assert Concat(3)([a, a]).shape == (1, 2, 4, 8)


@pytest.mark.parametrize("kernel", [3, 5, 9, 13])
def test_separable_max_pool_equals_max_pool2d(kernel: int) -> None:
    x = torch.randn(2, 3, 7, 11) - 5  # all negative: the padding must never win
    assert torch.equal(max_pool_same(x, kernel), nn.MaxPool2d(kernel, 1, kernel // 2)(x))


@pytest.mark.parametrize("block", [SPPF(8, 8), SPP(8, 8)])
def test_pooling_blocks_without_autograd_equal_the_autograd_path(block: nn.Module) -> None:
    x = torch.randn(1, 8, 12, 10)
    with torch.no_grad():
        fast = block.eval()(x)
    slow = block(x.clone().requires_grad_())  # autograd: the nn.MaxPool2d modules run
    slow.sum().backward()
    torch.testing.assert_close(fast, slow.detach(), atol=1e-6, rtol=1e-6)


def test_pointwise_conv_of_a_channels_last_tensor_is_a_matrix_product() -> None:
    conv = nn.Conv2d(6, 5, 1)
    x = torch.randn(2, 6, 4, 7)
    nhwc = x.contiguous(memory_format=torch.channels_last)
    out = apply_conv(conv, nhwc)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    torch.testing.assert_close(out, conv(x), atol=1e-5, rtol=1e-5)
    (out.sum()).backward()  # still differentiable
    assert conv.weight.grad is not None and conv.weight.grad.shape == conv.weight.shape
    three = nn.Conv2d(6, 5, 3, padding=1)  # other kernels: the module itself
    torch.testing.assert_close(apply_conv(three, nhwc), three(x), atol=1e-5, rtol=1e-5)


def test_pixel_rows_accepts_channels_last_tensors_and_their_channel_slices_only() -> None:
    x = torch.randn(2, 6, 4, 7)
    nhwc = x.contiguous(memory_format=torch.channels_last)
    assert pixel_rows(nhwc) and pixel_rows(nhwc[:, :4])
    assert not pixel_rows(x) and not pixel_rows(nhwc[..., ::2]) and not pixel_rows(nhwc[:, :, 1:])
    conv = nn.Conv2d(4, 3, 1)
    torch.testing.assert_close(apply_conv(conv, nhwc[:, :4]), conv(x[:, :4]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shortcut", [True, False])
def test_fused_c3_runs_cv1_and_cv2_as_one_product_with_the_same_output(shortcut: bool) -> None:
    torch.manual_seed(0)
    block = C3(8, 12, n=2, shortcut=shortcut).eval()
    for m in block.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 8, 6, 5).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = block(x)
        for m in block.modules():
            if isinstance(m, Conv):
                m.fuse()
        block.merge()
        assert block.merged_weight.shape == (12, 8) and "merged_weight" not in block.state_dict()
        merged = block(x)
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=1e-5)
    block.merged_weight.mul_(0)  # the product that ran is the merged one: zeroing it changes the output
    with torch.no_grad():
        assert not torch.allclose(block(x), expected, atol=1e-3)
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)  # with autograd: the plain path


@pytest.mark.parametrize(("kernel", "stride", "act"), [(3, 1, True), (3, 2, False), (6, 2, True)])
def test_fused_conv_without_autograd_runs_onednn_with_a_packed_weight_and_the_same_output(
        kernel: int, stride: int, act: bool) -> None:
    torch.manual_seed(0)
    block = Conv(4, 6, kernel, stride, act=act).eval()
    _randomise_batchnorm(block)
    block.fuse()
    x = torch.randn(2, 4, 12, 10).contiguous(memory_format=torch.channels_last)
    conv = block.conv

    def plain() -> torch.Tensor:
        y = nn.functional.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding)
        return nn.functional.silu(y) if act else y

    with torch.no_grad():
        assert packed_conv(conv, block.act, x) is not None  # the fast path is the one that runs
        torch.testing.assert_close(block(x), plain(), atol=1e-5, rtol=1e-5)
        conv.weight.mul_(-0.5)  # changed in place (as load_state_dict does): the packed copy is refreshed
        torch.testing.assert_close(block(x), plain(), atol=1e-5, rtol=1e-5)
        assert packed_conv(conv, block.act, x.contiguous()) is None  # NCHW input: the module
        assert packed_conv(conv, nn.ReLU(), x) is None
        with FlopCounterMode(display=False) as counter:  # a dispatch mode sees the aten convolution
            out = block(x)
        assert counter.get_total_flops() == 2 * out.numel() * 4 * kernel * kernel
    assert packed_conv(conv, block.act, x) is None  # autograd: the module
    pointwise = Conv(4, 6, 1).eval()
    pointwise.fuse()
    with torch.no_grad():
        assert packed_conv(pointwise.conv, pointwise.act, x) is None  # 1x1: a matrix product instead


@pytest.mark.parametrize("shortcut", [True, False])
def test_bottleneck_update_in_place_equals_its_forward(shortcut: bool) -> None:
    torch.manual_seed(0)
    block = Bottleneck(6, 6, shortcut=shortcut).eval()
    _randomise_batchnorm(block)
    for m in block.modules():
        if isinstance(m, Conv):
            m.fuse()
    buffer = torch.randn(1, 5, 7, 10)  # (b, h, w, c)
    x = buffer[..., :6].permute(0, 3, 1, 2)  # a channel slice of a larger channels_last buffer
    assert pixel_rows(x)
    with torch.no_grad():
        expected = block(x.clone())
        rest = buffer[..., 6:].clone()
        block.update_(x)
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(buffer[..., 6:], rest)  # the rest of the buffer is untouched


def test_activate_runs_an_in_place_silu_out_of_place_under_autograd_with_the_same_values() -> None:
    act = nn.SiLU(inplace=True)
    x = torch.randn(2, 4, 5, 5)
    leaf = x.clone().requires_grad_()
    y = activate(act, leaf * 1)  # a non-leaf, as a BatchNorm's output
    assert torch.equal(y, nn.functional.silu(x))
    y.sum().backward()
    reference = x.clone().requires_grad_()
    act(reference * 1).sum().backward()  # the in-place module itself
    assert torch.equal(leaf.grad, reference.grad)
    with torch.no_grad():  # inference keeps the in-place module: the input is overwritten
        z = x.clone()
        assert activate(act, z) is z and torch.equal(z, nn.functional.silu(x))
