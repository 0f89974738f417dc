"""Our own translation of a fused detector into TensorFlow (NHWC), for SavedModel and TFLite: each block of
models/common.py and models/blocks.py and each detection head becomes the same arithmetic on tf.nn ops, with the
PyTorch weights copied in (convolutions OIHW -> HWIO; depthwise ones as tf.nn.depthwise_conv2d). A layer without a
translation is refused with one line naming it.

The graph takes (b, h, w, 3) float images in [0, 1] and returns what the .pt returns in eval mode, the head's
decoded (b, n, columns) rows as its output contract lays them out: YOLOv5 (b, n, 5 + nc); YOLOv8/YOLO11 (b, n,
4 + nc) after the DFL decode; YOLO26 its final (b, k, 6) rows, top-k included (TFLite has TOPK_V2 and GATHER as
builtins). A task's heads are translated by its ``export`` part, registered here (``register_translation``): a
segmenter returns ``(rows, prototypes)`` as the .pt does, its prototypes NHWC (b, h/4, w/4, nm) and its rows
carrying the nm mask coefficients last. With ``raw_maps`` (detectors only) it stops at the head's
convolutions, one NHWC map per level, which --int8 uses so
the decode stays float outside the integer graph: (b, ny, nx, na * (5 + nc)) for YOLOv5, the box and class
branches concatenated, (b, ny, nx, 4 * reg_max + nc), for the anchor-free heads (YOLO26: its one-to-one branches);
``utils.deploy.head_maps.RawMapDecoder`` turns the latter back into the decoded rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from models.blocks import C2PSA, Attention, C2f, C3k, C3k2, DWConv, PSABlock
from models.common import C3, SPP, SPPF, Bottleneck, Concat, Conv, Focus
from models.head import Detect
from models.head_anchor_free import AnchorFreeDetect, make_anchors
from models.head_end_to_end import EndToEndDetect
from utils.deploy.formats import FormatError
from utils.tasks.registry import all_tasks

TENSORFLOW = (("tensorflow", "tensorflow-cpu"),)  # (module, pip package) the TensorFlow formats export with

Layer = Callable[[Any], Any]  # a translated block: a function of one tf tensor (or a list, for Concat and heads)
TRANSLATIONS: dict[type, Callable[[Translator, nn.Module], Layer]] = {}  # a task's heads (and their parts)


def register_translation(cls: type, translate: Callable[[Translator, nn.Module], Layer]) -> None:
    """Translate modules of exactly ``cls`` with ``translate(translator, module)`` (a task's export part calls it
    for its heads when it is imported; utils/tasks/registry.py names the module)."""
    TRANSLATIONS[cls] = translate


def load_task_translations() -> None:
    """Import every registered task's export part, so its heads' translations are registered."""
    for task in all_tasks():
        task.load("export")


class Translator:
    """Translates torch modules into functions of tf tensors, keeping the copied weights as tf.Variables."""

    # module class (exactly: a subclass may compute something else) -> the method translating it
    METHODS: dict[type, str] = {
        nn.Sequential: "sequential", Conv: "conv_block", DWConv: "conv_block", nn.Conv2d: "conv2d",
        Bottleneck: "bottleneck", C3: "c3", C3k: "c3", C2f: "c2f", C3k2: "c2f", SPPF: "sppf", SPP: "spp",
        Focus: "focus", Concat: "concat", nn.Upsample: "upsample", Attention: "attention",
        PSABlock: "psa_block", C2PSA: "c2psa", Detect: "detect", AnchorFreeDetect: "anchor_free_detect",
        EndToEndDetect: "end_to_end_detect", nn.Identity: "identity", nn.ConvTranspose2d: "conv_transpose2d"}

    def __init__(self, tf: Any, raw_maps: bool = False) -> None:
        self.tf, self.raw_maps = tf, raw_maps
        self.weights: list[Any] = []  # every tf.Variable made, so a tf.Module can track (save) them

    def constant(self, array: np.ndarray) -> Any:
        variable = self.tf.Variable(np.ascontiguousarray(array, dtype=np.float32), trainable=False)
        self.weights.append(variable)
        return variable

    def translate(self, module: nn.Module) -> Layer:
        """The function computing ``module``; FormatError naming the module when there is no translation."""
        method = self.METHODS.get(type(module))
        if method is not None:
            return getattr(self, method)(module)
        if type(module) not in TRANSLATIONS:
            raise FormatError(f"the TensorFlow export has no translation for layer {type(module).__name__} "
                              f"({type(module).__module__}); export onnx or openvino instead")
        return TRANSLATIONS[type(module)](self, module)

    def identity(self, module: nn.Identity) -> Layer:
        return lambda x: x

    def sequential(self, module: nn.Sequential) -> Layer:
        layers = [self.translate(m) for m in module]

        def run(x: Any) -> Any:
            for layer in layers:
                x = layer(x)
            return x
        return run

    def conv2d(self, conv: nn.Conv2d, bn: nn.Module | None = None) -> Layer:
        """A convolution (with an unfused BatchNorm folded in) and its bias."""
        convolve, bias = self.convolution(conv, bn)
        tf = self.tf
        return lambda x: tf.nn.bias_add(convolve(x), bias)

    def convolution(self, conv: nn.Conv2d, bn: nn.Module | None = None) -> tuple[Layer, Any]:
        """(the convolution without its bias, the bias variable), padded as PyTorch pads (symmetrically): plain,
        depthwise (one group per input channel, any channel multiplier) or grouped (a plain one per group)."""
        if conv.dilation != (1, 1) or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise FormatError(f"the TensorFlow export translates undilated zero-padded convolutions only, not {conv}")
        weight, bias = folded_weights(conv, bn)
        (ph, pw), (sh, sw), (kh, kw) = conv.padding, conv.stride, conv.kernel_size
        same = (sh, sw) == (1, 1) and (ph, pw) == (kh // 2, kw // 2) and kh % 2 == kw % 2 == 1
        padding, groups, tf = "SAME" if same else "VALID", conv.groups, self.tf
        if groups == 1:
            kernels = [self.constant(weight.permute(2, 3, 1, 0).numpy())]  # OIHW -> HWIO
        elif groups == conv.in_channels and sh == sw:  # (c_in * m, 1, kh, kw) -> (kh, kw, c_in, m)
            kernels = [self.constant(weight.view(groups, -1, kh, kw).permute(2, 3, 0, 1).numpy())]
        else:
            kernels = [self.constant(w.permute(2, 3, 1, 0).numpy()) for w in weight.chunk(groups, 0)]
        depthwise = groups > 1 and len(kernels) == 1

        def run(x: Any) -> Any:
            if not same and (ph or pw):
                x = tf.pad(x, [[0, 0], [ph, ph], [pw, pw], [0, 0]])
            if depthwise:
                return tf.nn.depthwise_conv2d(x, kernels[0], (1, sh, sw, 1), padding)
            parts = tf.split(x, groups, -1) if groups > 1 else [x]
            outs = [tf.nn.conv2d(part, kernel, (sh, sw), padding) for part, kernel in zip(parts, kernels)]
            return outs[0] if len(outs) == 1 else tf.concat(outs, -1)
        return run, self.constant(bias.numpy())

    def conv_transpose2d(self, conv: nn.ConvTranspose2d) -> Layer:
        """A transposed convolution whose kernel equals its stride (Proto's learned 2x upsample): the output cells
        do not overlap, so it is a 1x1 convolution to (k * k * c_out) channels, then depth-to-space."""
        k, stride = conv.kernel_size, conv.stride
        if k != stride or k[0] != k[1] or conv.padding != (0, 0) or conv.output_padding != (0, 0) or \
                conv.groups != 1 or conv.dilation != (1, 1):
            raise FormatError(f"the TensorFlow export translates transposed convolutions whose kernel is their "
                              f"stride only, not {conv}")
        weight = conv.weight.detach().float().cpu()  # (c_in, c_out, k, k)
        bias = conv.bias.detach().float().cpu() if conv.bias is not None else torch.zeros(conv.out_channels)
        kernel = self.constant(weight.permute(0, 2, 3, 1).reshape(1, 1, conv.in_channels, -1).numpy())
        bias = self.constant(bias.repeat(k[0] * k[1]).numpy())  # channel = (row * k + column) * c_out + o
        tf, block = self.tf, k[0]
        return lambda x: tf.nn.depth_to_space(tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "VALID"), bias), block)

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

    def c2f(self, module: C2f) -> Layer:
        """cv1's output in two halves, each inner block on the last output, all of them into cv2 (C2f, C3k2)."""
        cv1, cv2, tf = self.translate(module.cv1), self.translate(module.cv2), self.tf
        inner = [self.translate(block) for block in module.m]

        def run(x: Any) -> Any:
            y = tf.split(cv1(x), 2, -1)
            for block in inner:
                y.append(block(y[-1]))
            return cv2(tf.concat(y, -1))
        return run

    def max_pool(self, pool: nn.MaxPool2d) -> Layer:
        """A stride-1 'same' max-pool: TF's SAME padding ignores the border as PyTorch's -inf padding does."""
        k, s, p = pool.kernel_size, pool.stride, pool.padding
        if not (isinstance(k, int) and s in (1, (1, 1)) and p == k // 2 and k % 2 == 1):
            raise FormatError(f"the TensorFlow export translates stride-1 same-size max-pools only, not {pool}")
        tf = self.tf
        return lambda x: tf.nn.max_pool2d(x, k, 1, "SAME")

    def sppf(self, module: SPPF) -> Layer:
        """cv1 (with or without its SiLU), ``n`` max-pools in series, cv2 over all of them; with ``add`` the input
        added to the output (YOLO26)."""
        cv1, cv2, pool = self.translate(module.cv1), self.translate(module.cv2), self.max_pool(module.m)
        pools, add, tf = module.n, module.add, self.tf

        def run(x: Any) -> Any:
            y = [cv1(x)]
            for _ in range(pools):
                y.append(pool(y[-1]))
            out = cv2(tf.concat(y, -1))
            return x + out if add else out
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

    def attention(self, module: Attention) -> Layer:
        """Multi-head self-attention over the pixels (plain products and a softmax: TFLite's BATCH_MATMUL and
        SOFTMAX), the depthwise positional term on the values, the output projection."""
        qkv, proj = self.translate(module.qkv), self.translate(module.proj)
        if not isinstance(module.pe.act, nn.Identity):
            raise FormatError(f"the TensorFlow export translates Attention with a linear pe only, not "
                              f"{type(module.pe.act).__name__}")
        # TF 2.21's oneDNN graph rewrite fails on depthwise conv + BiasAdd + Add (logging errors at every run):
        # pe's bias is added after the sum
        pe, pe_bias = self.convolution(module.pe.conv, module.pe.bn)
        heads, kd, hd, scale, tf = module.num_heads, module.key_dim, module.head_dim, float(module.scale), self.tf

        def run(x: Any) -> Any:
            batch, h, w, c = (-1 if x.shape[0] is None else x.shape[0]), x.shape[1], x.shape[2], x.shape[3]
            # channel = head * (2 kd + hd) + d, as PyTorch's reshape of NCHW reads it
            per_head = tf.transpose(tf.reshape(qkv(x), (batch, h * w, heads, 2 * kd + hd)), (0, 2, 1, 3))
            q, k, v = tf.split(per_head, [kd, kd, hd], -1)  # (b, heads, hw, d)
            weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * scale, -1)  # (b, heads, hw, hw)
            values = as_map(tf, v, batch, h, w, c)
            return proj(tf.nn.bias_add(as_map(tf, tf.matmul(weights, v), batch, h, w, c) + pe(values), pe_bias))
        return run

    def psa_block(self, module: PSABlock) -> Layer:
        attn, ffn = self.translate(module.attn), self.translate(module.ffn)
        if not module.add:
            return lambda x: ffn(attn(x))

        def run(x: Any) -> Any:
            x = x + attn(x)
            return x + ffn(x)
        return run

    def c2psa(self, module: C2PSA) -> Layer:
        cv1, cv2, m, c, tf = (self.translate(module.cv1), self.translate(module.cv2), self.translate(module.m),
                              module.c, self.tf)

        def run(x: Any) -> Any:
            a, b = tf.split(cv1(x), [c, c], -1)
            return cv2(tf.concat([a, m(b)], -1))
        return run

    def detect(self, module: Detect, scored: int | None = None) -> Layer:
        """YOLOv5's Detect; ``scored``: how many leading columns of a row go through the sigmoid (all of them
        unless given: a Segment's mask coefficients stay raw)."""
        convs = [self.conv2d(conv) for conv in module.m]
        anchors, strides = module.anchors.float().cpu().numpy(), module.stride.float().cpu().numpy()
        na, no, tf = module.na, module.no, self.tf
        scored = no if scored is None else scored

        def decode(level: int, x: Any) -> Any:
            """PyTorch's Detect.decode of one level's map, its grid built from the (static) map size."""
            b, ny, nx = x.shape[0], x.shape[1], x.shape[2]
            raw = tf.transpose(tf.reshape(x, (-1 if b is None else b, ny, nx, na, no)), (0, 3, 1, 2, 4))
            y = tf.sigmoid(raw[..., :scored])
            xv, yv = np.meshgrid(np.arange(nx, dtype=np.float32), np.arange(ny, dtype=np.float32))
            grid = np.stack((xv, yv), -1).reshape(1, 1, ny, nx, 2)
            xy = (y[..., :2] * 2 - 0.5 + grid) * float(strides[level])
            wh = tf.square(y[..., 2:4] * 2) * anchors[level].reshape(1, na, 1, 1, 2)
            parts = [xy, wh, y[..., 4:]] + ([raw[..., scored:]] if scored < no else [])
            return tf.reshape(tf.concat(parts, -1), (-1 if b is None else b, na * ny * nx, no))

        def run(xs: list) -> Any:
            maps = [conv(x) for conv, x in zip(convs, xs)]
            if self.raw_maps:
                return maps
            return tf.concat([decode(i, x) for i, x in enumerate(maps)], 1)
        return run

    def anchor_free_detect(self, module: AnchorFreeDetect) -> Layer:
        """YOLOv8/YOLO11: the box and class branches, then the DFL decode to (b, n, 4 + nc), xywh."""
        return self.anchor_free_branches(module, module.cv2, module.cv3, xywh=True, final=None)

    def end_to_end_detect(self, module: EndToEndDetect) -> Layer:
        """YOLO26: the one-to-one branches decoded to xyxy, then its top-k selection to (b, k, 6); with
        ``end_to_end`` off, the one-to-many decode (b, n, 4 + nc) as the anchor-free head's."""
        if not module.end_to_end:
            return self.anchor_free_branches(module, module.cv2, module.cv3, xywh=True, final=None)
        return self.anchor_free_branches(module, module.one2one_cv2, module.one2one_cv3, xywh=False,
                                         final=top_rows(self.tf, module.nc, module.max_det))

    def anchor_free_branches(self, module: AnchorFreeDetect, box_branches: nn.ModuleList,
                             cls_branches: nn.ModuleList, xywh: bool, final: Layer | None) -> Layer:
        """Per level the box branch (4 * reg_max) and the class branch (nc); with ``raw_maps`` the two maps
        concatenated per level, else the decoded rows (and ``final`` of them)."""
        boxes = [self.translate(branch) for branch in box_branches]
        classes = [self.translate(branch) for branch in cls_branches]
        decode = AnchorFreeDecode(self.tf, module.nc, module.reg_max, module.stride.tolist(), xywh,
                                  dfl_bins(module))
        tf = self.tf

        def run(xs: list) -> Any:
            box_maps = [branch(x) for branch, x in zip(boxes, xs)]
            cls_maps = [branch(x) for branch, x in zip(classes, xs)]
            if self.raw_maps:
                return [tf.concat([b, c], -1) for b, c in zip(box_maps, cls_maps)]
            decoded = decode(box_maps, cls_maps)
            return decoded if final is None else final(decoded)
        return run


def folded_weights(conv: nn.Conv2d, bn: nn.Module | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight OIHW, bias) of ``conv`` in float32 on the CPU, an unfused BatchNorm after it folded in."""
    weight = conv.weight.detach().float().cpu()
    bias = conv.bias.detach().float().cpu() if conv.bias is not None else torch.zeros(conv.out_channels)
    if isinstance(bn, nn.BatchNorm2d):
        scale = bn.weight.detach().float().cpu() / torch.sqrt(bn.running_var.float().cpu() + bn.eps)
        weight = weight * scale.view(-1, 1, 1, 1)
        bias = (bias - bn.running_mean.float().cpu()) * scale + bn.bias.detach().float().cpu()
    return weight, bias


def as_map(tf: Any, rows: Any, batch: int, h: int, w: int, c: int) -> Any:
    """(b, heads, hw, d) -> the (b, h, w, heads * d) map, channel = head * d + i (PyTorch's reshape to NCHW)."""
    return tf.reshape(tf.transpose(rows, (0, 2, 1, 3)), (batch, h, w, c))


def dfl_bins(module: AnchorFreeDetect) -> np.ndarray | None:
    """The DFL's fixed bin values (its 1x1 convolution's weights, as the file holds them); None without a DFL
    (reg_max 1: the box branch gives the sides directly)."""
    if module.reg_max == 1:
        return None
    return module.dfl.conv.weight.detach().float().cpu().view(-1).numpy()


class AnchorFreeDecode:
    """The anchor-free heads' decode on NHWC maps: box sides from the DFL's expectation over ``reg_max`` bins (or
    directly), measured from each cell centre, in input pixels; sigmoid class scores. (b, n, 4 + nc), P3 first."""

    def __init__(self, tf: Any, nc: int, reg_max: int, strides: Sequence[float], xywh: bool,
                 bins: np.ndarray | None) -> None:
        self.tf, self.nc, self.reg_max, self.strides, self.xywh, self.bins = tf, nc, reg_max, strides, xywh, bins

    def __call__(self, box_maps: list, cls_maps: list) -> Any:
        points, strides, box, cls = self.sides(box_maps, cls_maps)
        top_left, bottom_right = points - box[..., :2], points + box[..., 2:]
        corners = [(top_left + bottom_right) / 2, bottom_right - top_left] if self.xywh else [top_left, bottom_right]
        return self.tf.concat([self.tf.concat(corners, -1) * strides, self.tf.sigmoid(cls)], -1)

    def sides(self, box_maps: list, maps: list, channels: int | None = None) -> tuple[Any, Any, Any, Any]:
        """Cell centres (n, 2), strides (n, 1), sides (b, n, 4) in cells, ``maps`` as rows (b, n, channels or nc)."""
        tf, reg_max = self.tf, self.reg_max
        batch = -1 if box_maps[0].shape[0] is None else box_maps[0].shape[0]
        sizes = [(int(m.shape[1]), int(m.shape[2])) for m in box_maps]  # static: the export's input size
        points, strides = (t.numpy() for t in make_anchors(sizes, self.strides))  # (n, 2), (n, 1)
        n, channels = points.shape[0], channels or self.nc
        box = tf.concat([tf.reshape(m, (batch, h * w, 4 * reg_max)) for m, (h, w) in zip(box_maps, sizes)], 1)
        rows = tf.concat([tf.reshape(m, (batch, h * w, channels)) for m, (h, w) in zip(maps, sizes)], 1)
        if self.bins is not None:  # channel = side * reg_max + bin, as the DFL reads it
            box = tf.reduce_sum(tf.nn.softmax(tf.reshape(box, (batch, n, 4, reg_max)), -1) * self.bins, -1)
        return points, strides, box, rows


def top_rows(tf: Any, nc: int, max_det: int, box_columns: int = 4) -> Layer:
    """YOLO26's selection (EndToEndDetect.select) on (b, n, box_columns + nc + e) rows: the k cells with the highest
    class score, then the k highest (cell, class) scores -> (b, k, box_columns + 2 + e) [box, score, class, a task's
    e columns], best first, k = min(max_det, n); TOPK_V2, GATHER, FLOOR_DIV, FLOOR_MOD are TFLite builtins."""
    def run(decoded: Any) -> Any:
        batch, n = (-1 if decoded.shape[0] is None else decoded.shape[0]), int(decoded.shape[1])
        k = min(max_det, n)
        boxes, scores, extra = (decoded[..., a:z] for a, z in ((0, box_columns), (box_columns, box_columns + nc),
                                                               (box_columns + nc, None)))
        cells = tf.math.top_k(tf.reduce_max(scores, -1), k).indices  # (b, k)
        scores = tf.gather(scores, cells, batch_dims=1)  # (b, k, nc)
        top, flat = tf.math.top_k(tf.reshape(scores, (batch, k * nc)), k)  # (b, k)
        cell = tf.gather(cells, flat // nc, batch_dims=1)
        rows = [tf.gather(boxes, cell, batch_dims=1), top[..., None], tf.cast(flat % nc, boxes.dtype)[..., None]]
        if int(decoded.shape[-1]) > box_columns + nc:
            rows.append(tf.gather(extra, cell, batch_dims=1))
        return tf.concat(rows, -1)
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
    load_task_translations()
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
