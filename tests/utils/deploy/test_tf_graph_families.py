"""Our TensorFlow translation (utils/deploy/tf_graph.py) of the YOLOv8, YOLO11 and YOLO26 families: the graph gives
the fused model's eval output (YOLO26's final top-k rows included), raw_maps gives the head's convolutions and
RawMapDecoder turns them back into the rows, the float and INT8 TFLite files convert with builtin ops only, each new
block and convolution kind matches PyTorch alone, and a layer without a translation is refused in one line.

The models are ultralytics' own n-scale files (tests/fixtures/ultralytics: random weights, randomised BatchNorm),
fused as export.py fuses them, their last class convolutions scaled so the scores cover (0, 1) and differ from cell
to cell (the files' class logits sit near -10 everywhere).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from models.blocks import C2PSA, C2f, C3k2, DWConv, PSABlock
from models.common import SPPF, Conv
from utils.deploy.formats import ExportOptions, FormatError, missing_packages
from utils.weights.checkpoint import load_model

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),  # not importorskip: tensorflow must load after triton
              pytest.mark.skipif(missing_packages((("tensorflow", "tensorflow-cpu"), ("ai_edge_litert", "x"))) != [],
                                 reason="pip install -r requirements-export.txt")]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ultralytics"
FAMILIES = ["yolov8n", "yolo11n", "yolo26n"]
RELATIVE = 1e-4  # of each output's scale (its largest magnitude): boxes and scores apart
SHAPE = (2, 96, 64)  # batch, height, width: two images, not square


@pytest.fixture(scope="module")
def tf() -> Any:
    from utils.deploy.tf_graph import import_tensorflow

    return import_tensorflow()


@pytest.fixture(scope="module")
def fused() -> dict[str, nn.Module]:
    """Each fixture file fused and in eval mode, the last convolution of each class branch with its weights x20 and
    its biases drawn from N(0, 1) (seed 0)."""
    generator = torch.Generator().manual_seed(0)
    models = {}
    for name in FAMILIES:
        model, _ = load_model(FIXTURES / f"{name}.pt", fuse=True)
        with torch.no_grad():
            for attribute in ("cv3", "one2one_cv3"):
                for branch in getattr(model.head, attribute, []):
                    branch[-1].weight.mul_(20)
                    branch[-1].bias.copy_(torch.randn(branch[-1].bias.shape, generator=generator))
        models[name] = model.float().eval()
    return models


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.rand((SHAPE[0], 3, *SHAPE[1:]), generator=torch.Generator().manual_seed(1))


def run_tf(tf: Any, model: nn.Module, images: torch.Tensor, raw_maps: bool = False) -> Any:
    from utils.deploy.tf_graph import nhwc_array, tf_module

    b, _, h, w = images.shape
    found = tf_module(tf, model, (b, h, w, 3), raw_maps=raw_maps).serve(tf.constant(nhwc_array(images)))
    return [torch.from_numpy(m.numpy()) for m in found] if raw_maps else torch.from_numpy(found.numpy())


def assert_same_rows(found: torch.Tensor, expected: torch.Tensor, end_to_end: bool) -> None:
    """Boxes and scores each within RELATIVE of their scale. End-to-end rows [x1, y1, x2, y2, score, class] are
    compared as sets per image (two near-equal scores may sort either way), with equal class indices."""
    assert found.shape == expected.shape
    if end_to_end:
        for image_found, image_expected in zip(found, expected):
            scale = torch.tensor([image_expected[:, :4].abs().max()] * 4 + [1.0], dtype=torch.float64)
            twin = torch.cdist(image_found[:, :5] / scale, image_expected[:, :5] / scale).argmin(1)
            assert torch.equal(twin.sort().values, torch.arange(len(twin)))  # a one-to-one pairing
            assert torch.equal(image_found[:, 5], image_expected[twin, 5])
            assert_same_rows(image_found[:, :5], image_expected[twin, :5], end_to_end=False)
        return
    for part in (slice(0, 4), slice(4, None)):
        scale = expected[..., part].abs().max()
        assert (found[..., part] - expected[..., part]).abs().max() <= RELATIVE * scale, part


@pytest.mark.parametrize("name", FAMILIES)
def test_translated_graph_gives_the_fused_models_eval_output(tf: Any, fused: dict[str, nn.Module],
                                                             images: torch.Tensor, name: str) -> None:
    model = fused[name]
    with torch.no_grad():
        expected = model(images)
    found = run_tf(tf, model, images)
    contract = model.head.contract
    assert found.shape[-1] == contract.columns and found.shape[0] == SHAPE[0]
    assert expected[..., 4:4 + contract.nc].std() > 0.1  # scores spread over (0, 1): the comparison means something
    if contract.end_to_end:  # YOLO26: top-k rows, k = every cell here (96 x 64 px: 96 + 24 + 6)
        assert found.shape == (2, 126, 6) and torch.equal(found[..., 4], found[..., 4].sort(1, descending=True)[0])
    assert_same_rows(found, expected, contract.end_to_end)


def head_inputs(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    captured = {}
    hook = model.head.register_forward_pre_hook(lambda module, inputs: captured.setdefault("xs", inputs[0]))
    with torch.no_grad():
        model(images)
    hook.remove()
    return captured["xs"]


@pytest.mark.parametrize("name", FAMILIES)
def test_raw_maps_are_the_heads_convolutions_and_decode_back(tf: Any, fused: dict[str, nn.Module],
                                                             images: torch.Tensor, name: str) -> None:
    from utils.deploy.head_maps import RawMapDecoder

    model = fused[name]
    head = model.head
    box_branches, cls_branches = ((head.one2one_cv2, head.one2one_cv3) if head.contract.end_to_end
                                  else (head.cv2, head.cv3))  # YOLO26 runs its one-to-one branches in eval mode
    with torch.no_grad():
        expected = [torch.cat((box(x), cls(x)), 1).permute(0, 2, 3, 1)  # NHWC, box channels then class channels
                    for box, cls, x in zip(box_branches, cls_branches, head_inputs(model, images))]
        eval_output = model(images)
    maps = run_tf(tf, model, images, raw_maps=True)
    assert [tuple(m.shape) for m in maps] == [(2, 96 // s, 64 // s, 4 * head.reg_max + head.nc) for s in (8, 16, 32)]
    for found, reference in zip(maps, expected):
        assert (found - reference).abs().max() <= RELATIVE * reference.abs().max()
    assert_same_rows(RawMapDecoder(head.export_metadata())(maps), eval_output, head.contract.end_to_end)


def tflite_outputs(content: bytes, images: torch.Tensor) -> tuple[list[torch.Tensor], Any]:
    """The file's outputs for ``images`` (largest first: P3 first for maps), and its interpreter."""
    from ai_edge_litert.interpreter import Interpreter

    from utils.deploy.tf_graph import nhwc_array

    interpreter = Interpreter(model_content=content)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], nhwc_array(images))
    interpreter.invoke()
    outputs = sorted(interpreter.get_output_details(), key=lambda d: -int(np.prod(d["shape"])))
    return [torch.from_numpy(interpreter.get_tensor(d["index"]).copy()) for d in outputs], interpreter


@pytest.mark.slow
def test_tflite_float_keeps_the_top_k_and_int8_ends_at_the_maps(tf: Any, fused: dict[str, nn.Module],
                                                                 images: torch.Tensor) -> None:
    from utils.deploy.head_maps import RawMapDecoder
    from utils.deploy.tf_graph import tf_module
    from utils.deploy.tflite import convert

    one = images[:1]
    # YOLO26 float: TOPK_V2 and GATHER are TFLite builtins, so the file returns the final rows itself
    model = fused["yolo26n"]
    content = convert(tf, tf_module(tf, model, (1, 96, 64, 3)), ExportOptions(), None)
    (rows,), _ = tflite_outputs(content, one)
    with torch.no_grad():
        assert_same_rows(rows, model(one), end_to_end=True)
    # YOLO11 INT8 (attention included): every op integer, the maps out, the decode in float by RawMapDecoder
    model = fused["yolo11n"]
    calibration = [torch.rand((1, 3, 96, 64), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    content = convert(tf, tf_module(tf, model, (1, 96, 64, 3), raw_maps=True), ExportOptions(int8=True),
                      lambda: calibration)
    maps, interpreter = tflite_outputs(content, one)
    assert [tuple(m.shape) for m in maps] == [(1, 96 // s, 64 // s, 64 + 80) for s in (8, 16, 32)]
    float_maps = run_tf(tf, model, one, raw_maps=True)
    for found, reference in zip(maps, float_maps):  # 8-bit steps: within a few percent of each map's range
        assert (found - reference).abs().max() <= 0.05 * (reference.max() - reference.min())
    kinds = {d["dtype"] for d in interpreter.get_tensor_details()}
    assert np.int8 in kinds and np.float16 not in kinds
    floats = [d for d in interpreter.get_tensor_details() if d["dtype"] == np.float32 and len(d["shape"]) == 4]
    assert len(floats) <= 1 + len(maps)  # the float image in and the dequantized maps out: nothing float inside
    decoded = RawMapDecoder(model.head.export_metadata())(maps)
    assert decoded.shape == (1, 126, 84) and decoded[..., 4:].min() >= 0 and decoded[..., 4:].max() <= 1


def randomised(module: nn.Module, seed: int) -> nn.Module:
    """``module`` in eval mode with random BatchNorm statistics and affine parameters (unfused: the BN is folded by
    the translation)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in module.modules():
            if isinstance(bn, nn.BatchNorm2d):
                for tensor, low, high in ((bn.weight, 0.5, 1.5), (bn.bias, -0.5, 0.5), (bn.running_mean, -0.5, 0.5),
                                          (bn.running_var, 0.5, 2.0)):
                    tensor.copy_(torch.rand(tensor.shape, generator=generator) * (high - low) + low)
    return module.eval()


BLOCKS = {
    "depthwise x2 channels, stride 2": lambda: DWConv(8, 16, 3, 2),
    "grouped": lambda: Conv(8, 12, 3, 1, groups=4),
    "C2f two inner blocks": lambda: C2f(16, 24, 2, True),
    "C3k2 with C3k": lambda: C3k2(16, 16, 1, True),
    "C3k2 with attention": lambda: C3k2(32, 32, 1, True, 0.5, True),
    "C2PSA two heads": lambda: C2PSA(256, 256, 1),
    "PSABlock without shortcut": lambda: PSABlock(64, 0.5, 2, shortcut=False),
    "SPPF two pools, linear cv1, shortcut": lambda: SPPF(16, 16, 5, 2, True),
    "SPPF as YOLOv5's": lambda: SPPF(16, 8, 5),
}


@pytest.mark.parametrize("block", BLOCKS)
def test_each_block_alone_equals_pytorch(tf: Any, block: str) -> None:
    from utils.deploy.tf_graph import Translator, nhwc_array

    torch.manual_seed(0)
    module = randomised(BLOCKS[block](), seed=2)
    c_in = next(m for m in module.modules() if isinstance(m, nn.Conv2d)).in_channels
    x = torch.rand(2, c_in, 8, 6)
    with torch.no_grad():
        expected = module(x).permute(0, 2, 3, 1)
    found = torch.from_numpy(Translator(tf).translate(module)(tf.constant(nhwc_array(x))).numpy())
    assert found.shape == expected.shape
    assert (found - expected).abs().max() <= RELATIVE * expected.abs().max()


def test_a_layer_without_translation_is_refused_in_one_line(tf: Any, fused: dict[str, nn.Module]) -> None:
    from utils.deploy.tf_graph import translate_model

    model = copy.deepcopy(fused["yolo11n"])
    model.model[2].m[0] = nn.GELU()  # a block inside a C3k2
    with pytest.raises(FormatError, match=r"no translation for layer GELU \(torch.nn.modules.activation\); "
                                          "export onnx or openvino instead") as info:
        translate_model(tf, model)
    assert "\n" not in str(info.value)
    model = copy.deepcopy(fused["yolo11n"])
    model.model[10].m[0].ffn[0].act = nn.ReLU()  # an activation inside C2PSA's attention block
    with pytest.raises(FormatError, match="no translation for activation ReLU"):
        translate_model(tf, model)
    model = copy.deepcopy(fused["yolo26n"])
    model.head.one2one_cv3[0][0][0].conv.dilation = (2, 2)  # the depthwise convolution of YOLO26's class branch
    with pytest.raises(FormatError, match="undilated zero-padded convolutions only") as info:
        translate_model(tf, model)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(contract={"layout": "xywh_obj_cls", "nc": 80, "nm": 0}), "anchor-free detection heads only"),
    (lambda m: m.update(stride=[8, 16, 1e9]), "stride must be"),
    (lambda m: m.update(stride="8,16,32"), "stride must be"),
    (lambda m: m.update(reg_max=10**6), "reg_max"),
    (lambda m: m.update(contract={"layout": "boxes"}), "output layout 'boxes' is not one of"),
    (lambda m: m.pop("contract"), "no output contract recorded"),
    (lambda m: m.clear(), "no output contract recorded"),
])
def test_raw_map_decoder_refuses_bad_metadata_in_one_line(fused: dict[str, nn.Module], edit, message: str) -> None:
    from utils.deploy.head_maps import RawMapDecoder

    meta = fused["yolo26n"].head.export_metadata()
    edit(meta)
    with pytest.raises(FormatError, match=message) as info:
        RawMapDecoder(meta, "best-int8.tflite")
    assert str(info.value).startswith("best-int8.tflite") and "\n" not in str(info.value)
    with pytest.raises(FormatError, match="best-int8.tflite returns head maps but carries no head metadata"):
        RawMapDecoder(None, "best-int8.tflite")
    decoder = RawMapDecoder(fused["yolo26n"].head.export_metadata())
    with pytest.raises(FormatError, match=r"expected 3 maps of \(b, ny, nx, 84\)"):
        decoder([torch.zeros(1, 8, 8, 84), torch.zeros(1, 4, 4, 85), torch.zeros(1, 2, 2, 84)])


# ------------------------------------------------------------------------------------------ segmenters
def test_segmenters_translate_to_rows_and_prototypes(tf: Any, images: torch.Tensor, tiny_seg_weights: Path) -> None:
    """yolo11n-seg (the ultralytics fixture: the learned 2x upsample as 1x1 convolution + depth-to-space, cv4) and
    the tiny yolov5n-seg (nearest upsample, raw coefficients after the sigmoid columns): the graph returns the fused
    model's rows, coefficients included, and its prototypes (NHWC); no raw-map form."""
    from utils.deploy.tf_graph import nhwc_array, tf_module

    b, _, h, w = images.shape
    for path in (FIXTURES / "yolo11n-seg.pt", tiny_seg_weights):
        model = load_model(path, fuse=True)[0].float().eval()
        with torch.no_grad():
            rows, protos = model(images)
        found_rows, found_protos = tf_module(tf, model, (b, h, w, 3)).serve(tf.constant(nhwc_array(images)))
        found_rows, found_protos = torch.from_numpy(found_rows.numpy()), torch.from_numpy(found_protos.numpy())
        assert found_protos.shape == (b, h // 4, w // 4, 32) and found_rows.shape == rows.shape
        nm_start = rows.shape[-1] - 32
        assert_same_rows(found_rows[..., :nm_start], rows[..., :nm_start], end_to_end=False)
        for found, expected in ((found_rows[..., nm_start:], rows[..., nm_start:]),
                                (found_protos.permute(0, 3, 1, 2), protos)):
            assert (found - expected).abs().max() <= RELATIVE * expected.abs().max()
        with pytest.raises(FormatError, match="segmenter has no raw-map"):
            tf_module(tf, model, (b, h, w, 3), raw_maps=True)
