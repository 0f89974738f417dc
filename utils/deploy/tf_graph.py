"""Our own translation of a fused detector into TensorFlow (NHWC), for SavedModel and TFLite: each block of
models/common.py and the Detect head becomes the same arithmetic on tf.nn ops, with the PyTorch weights copied in
(convolutions OIHW -> HWIO). A layer without a translation is refused with one line naming it.

The graph takes (b, h, w, 3) float images in [0, 1] and returns what the .pt returns, (b, n, 5 + nc) decoded boxes;
with ``raw_maps`` it stops at the head's convolutions (one (b, ny, nx, na * no) map per level), which --int8 uses
so the box decoding stays float outside the integer graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from models.common import C3, SPP, SPPF, Bottleneck, Concat, Conv, Focus
from models.head import Detect
from utils.deploy.formats import FormatError

TENSORFLOW = (("tensorflow", "tensorflow-cpu"),)  # (module, pip package) the TensorFlow formats export with

Layer = Callable[[Any], Any]  # a translated block: a function of one tf tensor (or a list, for Concat/Detect)


class Translator:
    """Translates torch modules into functions of tf tensors, keeping the copied weights as tf.Variables."""

    def __init__(self, tf: Any, raw_maps: bool = False) -> None:
        self.tf, self.raw_maps = tf, raw_maps
        self.weights: list[Any] = []  # every tf.Variable made, so a tf.Module can track (save) them

    def constant(self, array: np.ndarray) -> Any:
        variable = self.tf.Variable(np.ascontiguousarray(array, dtype=np.float32), trainable=False)
        self.weights.append(variable)
        return variable

    def translate(self, module: nn.Module) -> Layer:
        """The function computing ``module``; FormatError naming the module when there is no translation."""
        for kind, method in ((nn.Sequential, self.sequential), (Conv, self.conv_block), (nn.Conv2d, self.conv2d),
                             (Bottleneck, self.bottleneck), (C3, self.c3), (SPPF, self.sppf), (SPP, self.spp),
                             (Focus, self.focus), (Concat, self.concat), (nn.Upsample, self.upsample),
                             (Detect, self.detect), (nn.Identity, lambda m: lambda x: x)):
            if type(module) is kind:
                return method(module)
        raise FormatError(f"the TensorFlow export has no translation for layer {type(module).__name__} "
                          f"({type(module).__module__}); export onnx or openvino instead")

    def sequential(self, module: nn.Sequential) -> Layer:
        layers = [self.translate(m) for m in module]

        def run(x: Any) -> Any:
            for layer in layers:
                x = layer(x)
            return x
        return run

    def conv2d(self, conv: nn.Conv2d, bn: nn.Module | None = None) -> Layer:
        """A convolution (with an unfused BatchNorm folded in), padded as PyTorch pads (symmetrically)."""
        if conv.groups != 1 or conv.dilation != (1, 1) or conv.padding_mode != "zeros" or isinstance(conv.padding,
                                                                                                      str):
            raise FormatError(f"the TensorFlow export translates plain convolutions only, not {conv}")
        weight = conv.weight.detach().float().cpu()
        bias = conv.bias.detach().float().cpu() if conv.bias is not None else torch.zeros(conv.out_channels)
        if isinstance(bn, nn.BatchNorm2d):
            scale = bn.weight.detach().float().cpu() / torch.sqrt(bn.running_var.float().cpu() + bn.eps)
            weight = weight * scale.view(-1, 1, 1, 1)
            bias = (bias - bn.running_mean.float().cpu()) * scale + bn.bias.detach().float().cpu()
        kernel = self.constant(weight.permute(2, 3, 1, 0).numpy())  # OIHW -> HWIO
        bias_var = self.constant(bias.numpy())
        (ph, pw), (sh, sw), (kh, kw) = conv.padding, conv.stride, conv.kernel_size
        same = (sh, sw) == (1, 1) and (ph, pw) == (kh // 2, kw // 2) and kh % 2 == kw % 2 == 1
        padding = "SAME" if same else "VALID"
        tf = self.tf

        def run(x: Any) -> Any:
            if not same and (ph or pw):
                x = tf.pad(x, [[0, 0], [ph, ph], [pw, pw], [0, 0]])
            return tf.nn.bias_add(tf.nn.conv2d(x, kernel, (sh, sw), padding), bias_var)
        return run

    def conv_block(self, module: Conv) -> Layer:
        conv = self.conv2d(module.conv, module.bn)
        if isinstance(module.act, nn.Identity):
            return conv
        if not isinstance(module.act, nn.SiLU):
            raise FormatError(f"the TensorFlow export has no translation for activation {type(module.act).__name__}")
        tf = self.tf
        return lambda x: silu(tf, conv(x))

    def bottleneck(self, module: Bottleneck) -> Layer:
        cv1, cv2 = self.translate(module.cv1), self.translate(module.cv2)
        return (lambda x: x + cv2(cv1(x))) if module.add else (lambda x: cv2(cv1(x)))

    def c3(self, module: C3) -> Layer:
        cv1, cv2, cv3, m = (self.translate(x) for x in (module.cv1, module.cv2, module.cv3, module.m))
        tf = self.tf
        return lambda x: cv3(tf.concat([m(cv1(x)), cv2(x)], -1))

    def max_pool(self, pool: nn.MaxPool2d) -> Layer:
        """A stride-1 'same' max-pool: TF's SAME padding ignores the border as PyTorch's -inf padding does."""
        k, s, p = pool.kernel_size, pool.stride, pool.padding
        if not (isinstance(k, int) and s in (1, (1, 1)) and p == k // 2 and k % 2 == 1):
            raise FormatError(f"the TensorFlow export translates stride-1 same-size max-pools only, not {pool}")
        tf = self.tf
        return lambda x: tf.nn.max_pool2d(x, k, 1, "SAME")

    def sppf(self, module: SPPF) -> Layer:
        cv1, cv2, pool = self.translate(module.cv1), self.translate(module.cv2), self.max_pool(module.m)
        tf = self.tf

        def run(x: Any) -> Any:
            x = cv1(x)
            y1 = pool(x)
            y2 = pool(y1)
            return cv2(tf.concat([x, y1, y2, pool(y2)], -1))
        return run

    def spp(self, module: SPP) -> Layer:
        cv1, cv2, pools = self.translate(module.cv1), self.translate(module.cv2), [self.max_pool(m) for m in module.m]
        tf = self.tf

        def run(x: Any) -> Any:
            x = cv1(x)
            return cv2(tf.concat([x] + [pool(x) for pool in pools], -1))
        return run

    def focus(self, module: Focus) -> Layer:
        conv, tf = self.translate(module.conv), self.tf  # PyTorch's (row, column) offsets: (0,0) (1,0) (0,1) (1,1)
        return lambda x: conv(tf.concat([x[:, ::2, ::2], x[:, 1::2, ::2], x[:, ::2, 1::2], x[:, 1::2, 1::2]], -1))

    def concat(self, module: Concat) -> Layer:
        if module.d not in (1, -3):
            raise FormatError(f"the TensorFlow export translates channel concatenation only, not Concat({module.d})")
        tf = self.tf
        return lambda xs: tf.concat(list(xs), -1)

    def upsample(self, module: nn.Upsample) -> Layer:
        scale = module.scale_factor
        scale = scale[0] if isinstance(scale, tuple) and len(set(scale)) == 1 else scale
        if module.mode != "nearest" or module.size is not None or not scale or float(scale) != int(scale):
            raise FormatError(f"the TensorFlow export translates nearest upsampling by an integer factor only, "
                              f"not {module}")
        tf, factor = self.tf, int(scale)
        return lambda x: tf.image.resize(x, (x.shape[1] * factor, x.shape[2] * factor), "nearest")

    def detect(self, module: Detect) -> Layer:
        convs = [self.conv2d(conv) for conv in module.m]
        anchors, strides = module.anchors.float().cpu().numpy(), module.stride.float().cpu().numpy()
        na, no, tf = module.na, module.no, self.tf

        def decode(level: int, x: Any) -> Any:
            """PyTorch's Detect.decode of one level's map, its grid built from the (static) map size."""
            b, ny, nx = x.shape[0], x.shape[1], x.shape[2]
            y = tf.sigmoid(tf.transpose(tf.reshape(x, (-1 if b is None else b, ny, nx, na, no)), (0, 3, 1, 2, 4)))
            xv, yv = np.meshgrid(np.arange(nx, dtype=np.float32), np.arange(ny, dtype=np.float32))
            grid = np.stack((xv, yv), -1).reshape(1, 1, ny, nx, 2)
            xy = (y[..., :2] * 2 - 0.5 + grid) * float(strides[level])
            wh = tf.square(y[..., 2:4] * 2) * anchors[level].reshape(1, na, 1, 1, 2)
            return tf.reshape(tf.concat([xy, wh, y[..., 4:]], -1), (-1 if b is None else b, na * ny * nx, no))

        def run(xs: list) -> Any:
            maps = [conv(x) for conv, x in zip(convs, xs)]
            if self.raw_maps:
                return maps
            return tf.concat([decode(i, x) for i, x in enumerate(maps)], 1)
        return run


def silu(tf: Any, x: Any) -> Any:
    """x * sigmoid(x) as two plain ops: tf.nn.silu carries a custom gradient that every SavedModel save traces
    (seconds per export) and every load warns about."""
    return x * tf.sigmoid(x)


def translate_model(tf: Any, model: nn.Module, raw_maps: bool = False) -> tuple[Layer, list[Any]]:
    """The whole detector (models/yolo.py's Model: layers wired by their ``f`` and ``save``) as one function of
    (b, h, w, 3) images, and the tf.Variables holding its weights."""
    if not hasattr(model, "model") or not hasattr(model, "save"):
        raise FormatError(f"the TensorFlow export translates models/yolo.py detectors, not {type(model).__name__}")
    translator = Translator(tf, raw_maps)
    layers = [(block.f, block.i, translator.translate(block)) for block in model.model]
    keep = set(model.save)

    def run(x: Any) -> Any:
        outputs: list = []
        for source, index, layer in layers:
            if source != -1:
                x = outputs[source] if isinstance(source, int) else [x if j == -1 else outputs[j] for j in source]
            x = layer(x)
            outputs.append(x if index in keep else None)
        return x
    return run, translator.weights


def tf_module(tf: Any, model: nn.Module, input_shape: tuple[int, int, int, int], raw_maps: bool = False) -> Any:
    """A tf.Module whose ``serve`` (a tf.function of one (b, h, w, 3) float32 input named ``images``) runs the
    translated ``model``; its variables are tracked, so tf.saved_model.save keeps them."""
    forward, weights = translate_model(tf, model, raw_maps)
    module = tf.Module()
    module.weights = weights
    spec = tf.TensorSpec(input_shape, tf.float32, name="images")
    module.serve = tf.function(lambda images: forward(images), input_signature=[spec], autograph=False)
    return module


def import_tensorflow() -> Any:
    """tensorflow, imported here (it takes seconds) with its C++ start-up notices kept quiet. Triton (which torch
    loads lazily, e.g. when torchvision is imported) is loaded first: its native library crashes the process
    (segmentation fault) when it loads after TensorFlow's."""
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def nhwc_array(images: torch.Tensor) -> np.ndarray:
    """A (b, 3, h, w) torch batch as the (b, h, w, 3) float32 array the TensorFlow files take."""
    return np.ascontiguousarray(images.detach().cpu().float().permute(0, 2, 3, 1).numpy())
