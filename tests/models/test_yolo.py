"""The YAML model builder: parity with the reference YOLOv5 sizes, shapes, fusing, overrides, bad configs."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from models.yolo import Detect, Model, ModelConfigError, load_model_config

# name -> (parameters with nc=80, GFLOPs at 640 px) as the reference YOLOv5 prints them.
REFERENCE = {
    "yolov5n": (1_872_157, 4.6),
    "yolov5s": (7_235_389, 16.6),
    "yolov5m": (21_190_557, 49.2),
    "yolov5l": (46_563_709, 109.6),
    "yolov5x": (86_749_405, 206.3),
    "yolov5s-focus": (7_276_605, 17.1),
}
MODELS_DIR = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module", params=list(REFERENCE))
def zoo_model(request: pytest.FixtureRequest) -> tuple[str, Model]:
    """Each zoo model built once (pytest groups the tests by model, so one big model lives at a time)."""
    torch.manual_seed(0)
    return request.param, Model(request.param)


def test_parameter_count_matches_reference(zoo_model: tuple[str, Model]) -> None:
    name, model = zoo_model
    assert sum(p.numel() for p in model.parameters()) == REFERENCE[name][0]
    assert model.nc == 80 and len(model.names) == 80


def test_gflops_within_two_percent(zoo_model: tuple[str, Model]) -> None:
    name, model = zoo_model
    expected = REFERENCE[name][1]
    assert model.flops(640) == pytest.approx(expected, rel=0.02)


def test_train_and_eval_outputs(zoo_model: tuple[str, Model]) -> None:
    """Train mode: raw maps (b, na, ny, nx, 5 + nc); eval mode: those maps decoded to (b, n, 5 + nc)."""
    _, model = zoo_model
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        maps = model.train()(x)
        decoded = model.eval()(x)
        model.detect.train()  # the head alone in train mode: raw maps under inference-mode BatchNorm
        raw = model(x)
        model.detect.eval()
    assert [tuple(m.shape) for m in maps] == [(2, 3, 8, 8, 85), (2, 3, 4, 4, 85), (2, 3, 2, 2, 85)]
    assert decoded.shape == (2, 3 * (64 + 16 + 4), 85)
    torch.testing.assert_close(model.detect.decode(raw), decoded)


@pytest.mark.parametrize("height, width", [(320, 320), (64, 160), (320, 192)])
def test_output_shapes_and_strides(zoo_model: tuple[str, Model], height: int, width: int) -> None:
    _, model = zoo_model
    assert model.stride.tolist() == [8.0, 16.0, 32.0]
    model.eval()
    model.detect.train()  # one forward gives the raw maps; decode() gives what eval mode returns
    try:
        with torch.no_grad():
            maps = model(torch.rand(1, 3, height, width))
    finally:
        model.detect.eval()
    assert [tuple(m.shape) for m in maps] == [(1, 3, height // s, width // s, 85) for s in (8, 16, 32)]
    n_boxes = sum(3 * (height // s) * (width // s) for s in (8, 16, 32))
    assert model.detect.decode(maps).shape == (1, n_boxes, 85)


def test_eval_output_is_the_decoded_training_maps(tiny_cfg: dict) -> None:
    model = Model(tiny_cfg).eval()
    x = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        decoded = model(x)
        model.train()
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.eval()  # running statistics, as in eval mode: only the head's output format differs
        maps = model(x)
    assert torch.allclose(model.detect.decode(maps), decoded, atol=1e-5)
    # hand decode of one anchor of the stride-8 level: cell (row 2, col 5), anchor 1
    raw = maps[0][0, 1, 2, 5].sigmoid()
    anchor = model.detect.anchors[0, 1]
    cx = (raw[0] * 2 - 0.5 + 5) * 8
    cy = (raw[1] * 2 - 0.5 + 2) * 8
    wh = (raw[2:4] * 2) ** 2 * anchor
    index = 1 * (8 * 12) + 2 * 12 + 5  # (anchor, row, col) flattened over the 8x12 map
    expected = torch.cat((torch.stack((cx, cy)), wh, raw[4:]))
    assert torch.allclose(decoded[0, index], expected, atol=1e-4)
    assert ((decoded[..., 4:] >= 0) & (decoded[..., 4:] <= 1)).all()


def test_in_place_decode_equals_the_decode_of_the_maps() -> None:
    torch.manual_seed(0)
    detect = Detect(nc=3, anchors=[[10, 13, 16, 30], [30, 61, 62, 45]], ch=[4, 8])
    detect.stride.copy_(torch.tensor([8.0, 16.0]))
    xs = [torch.randn(2, 4, 6, 10), torch.randn(2, 8, 3, 5)]
    maps = detect.train()(xs)
    with torch.no_grad():
        expected = detect.decode(maps)
        fast = detect.eval()(xs)  # no autograd: decode_into
        nhwc = detect([x.contiguous(memory_format=torch.channels_last) for x in xs])
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(nhwc, expected, atol=1e-5, rtol=1e-6)
    graded = detect([x.clone().requires_grad_() for x in xs])  # autograd: the out-of-place decode
    torch.testing.assert_close(graded.detach(), expected, atol=1e-5, rtol=1e-6)
    assert graded.requires_grad


def test_fused_model_runs_channels_last_and_its_fast_paths_match_the_plain_ones(tiny_cfg: dict) -> None:
    torch.manual_seed(0)
    model = Model(tiny_cfg).fuse().eval()
    assert model.channels_last_input
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in model.parameters() if p.dim() == 4)
    x = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        fast = model(x)
    plain = model(x.clone().requires_grad_())  # autograd: modules' own convs, pools and decode
    torch.testing.assert_close(fast, plain.detach(), atol=1e-4, rtol=1e-5)


def _randomise_batchnorm(model: nn.Module, seed: int = 0) -> None:
    """Give every BatchNorm non-trivial statistics and affine terms, as a trained model has."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            c = bn.num_features
            bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.2)
            bn.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            bn.weight.copy_(torch.rand(c, generator=gen) + 0.5)
            bn.bias.copy_(torch.randn(c, generator=gen) * 0.2)


@pytest.mark.parametrize("name", ["yolov5n", "yolov5s-focus"])
def test_fused_equals_unfused(name: str) -> None:
    torch.manual_seed(0)
    model = Model(name)
    with torch.no_grad():
        for _ in range(2):  # a couple of train-mode passes move the running stats too
            model.train()(torch.rand(2, 3, 64, 64))
    _randomise_batchnorm(model)
    model.eval()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        unfused = model(x)
        fused_model = copy.deepcopy(model).fuse()
        fused = fused_model(x)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused_model.modules())
    assert sum(p.numel() for p in fused_model.parameters()) < sum(p.numel() for p in model.parameters())
    torch.testing.assert_close(fused, unfused, atol=1e-4, rtol=1e-5)
    # the statistics matter: resetting them changes the unfused output
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.reset_running_stats()
    with torch.no_grad():
        assert (model(x) - unfused).abs().max() > 1e-2


def test_fused_model_runs_under_cpu_autocast_as_validation_in_mixed_precision_does(tiny_cfg: dict) -> None:
    """Validation during bf16 training runs the fused model under autocast: its fast paths (packed convolutions,
    products written into the output) step aside and it gives the unfused model's bf16 result."""
    torch.manual_seed(0)
    model = Model(tiny_cfg).eval()
    fused = copy.deepcopy(model).fuse()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused(x.contiguous(memory_format=torch.channels_last))
        plain = model(x)
    with torch.no_grad():
        exact = model(x)
    assert out.dtype == plain.dtype == torch.bfloat16 and out.shape == exact.shape
    scale = exact.abs().amax(dim=(0, 1))  # per output column: pixels for the boxes, probabilities for the scores
    assert ((out.float() - exact).abs().amax(dim=(0, 1)) <= 0.05 * scale + 1e-2).all()
    assert ((plain.float() - exact).abs().amax(dim=(0, 1)) <= 0.05 * scale + 1e-2).all()


def test_nc_override(tiny_cfg: dict) -> None:
    model = Model(tiny_cfg, nc=7)
    assert model.nc == 7 and model.detect.no == 12 and model.yaml["nc"] == 7
    assert model.names == [str(i) for i in range(7)]
    with torch.no_grad():
        out = model.eval()(torch.rand(1, 3, 64, 64))
    assert out.shape[-1] == 12
    assert tiny_cfg["nc"] == 3  # the caller's dict is left alone


def test_anchors_override_changes_anchor_count(tiny_cfg: dict) -> None:
    anchors = [[5, 6, 8, 14, 15, 11, 12, 20], [30, 61, 62, 45, 59, 119, 70, 80],
               [116, 90, 156, 198, 373, 326, 200, 250]]
    model = Model(tiny_cfg, anchors=anchors)
    assert model.detect.na == 4
    assert model.detect.anchors.shape == (3, 4, 2)
    assert model.detect.anchors[0, 0].tolist() == [5.0, 6.0]  # pixels, not divided by the stride
    with torch.no_grad():
        maps = model.train()(torch.rand(1, 3, 64, 64))
        decoded = model.eval()(torch.rand(1, 3, 64, 64))
    assert [tuple(m.shape) for m in maps] == [(1, 4, 8, 8, 8), (1, 4, 4, 4, 8), (1, 4, 2, 2, 8)]
    assert decoded.shape == (1, 4 * (64 + 16 + 4), 8)


def test_anchors_listed_large_first_are_reordered(tiny_cfg: dict) -> None:
    tiny_cfg["anchors"] = tiny_cfg["anchors"][::-1]
    model = Model(tiny_cfg)
    assert model.detect.anchors[0].tolist() == [[10, 13], [16, 30], [33, 23]]
    assert model.detect.anchors[2].tolist() == [[116, 90], [156, 198], [373, 326]]


def test_bias_priors(tiny_cfg: dict) -> None:
    """Objectness starts near 8 objects per 640 px image, classes near 0.6 / nc."""
    model = Model(tiny_cfg)
    with torch.no_grad():
        out = model.eval()(torch.zeros(1, 3, 64, 64))
    assert out[..., 4].max() < 0.05
    # the bias log(0.6 / (nc - 0.99)) gives sigmoid = 0.6 / 2.6 = 0.2299 for 3 classes
    assert out[..., 5:].mean().item() == pytest.approx(0.2299, abs=0.05)


def test_config_by_name_path_and_dict_agree(tiny_cfg_file: Path) -> None:
    by_name, source = load_model_config("yolov5n")
    by_path, _ = load_model_config(MODELS_DIR / "yolov5n.yaml")
    assert by_name == by_path and source == str(MODELS_DIR / "yolov5n.yaml")
    assert by_name["nc"] == 80 and len(by_name["backbone"]) == 10 and len(by_name["head"]) == 15
    from_file = Model(tiny_cfg_file)
    assert from_file.nc == 3 and from_file.yaml["width_multiple"] == 0.125
    from_dict = Model(yaml.safe_load(tiny_cfg_file.read_text()))
    assert sum(p.numel() for p in from_dict.parameters()) == sum(p.numel() for p in from_file.parameters())


def test_info_table_and_summary(tiny_cfg: dict) -> None:
    model = Model(tiny_cfg)
    n_rows = len(tiny_cfg["backbone"]) + len(tiny_cfg["head"])
    lines = model.info(640).splitlines()
    assert lines[0].split() == ["from", "n", "params", "module", "arguments"]
    assert len(lines) == n_rows + 2
    first = lines[1].split()
    assert first[:4] == ["0", "-1", "1", str(sum(p.numel() for p in model.model[0].parameters()))]
    assert first[4] == "models.common.Conv"
    assert lines[-2].split()[1:4] == ["[17,", "20,", "23]"] and "models.yolo.Detect" in lines[-2]
    row_params = sum(int(line[24:34]) for line in lines[1:-1])
    n_params = sum(p.numel() for p in model.parameters())
    assert row_params == n_params
    summary = re.fullmatch(r"Model summary: (\d+) layers, (\d+) parameters, (\d+) gradients, ([\d.]+) GFLOPs",
                           lines[-1])
    assert summary, lines[-1]
    assert int(summary[2]) == n_params == int(summary[3])
    assert float(summary[4]) == pytest.approx(model.flops(640), abs=0.05)
    assert model.info(640, verbose=False) == lines[-1]


def test_deepcopy_is_independent(tiny_cfg: dict) -> None:
    model = Model(tiny_cfg).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model(x)  # fills the grid cache
        clone = copy.deepcopy(model)
        assert torch.equal(clone(x), before)
        clone.detect.anchors.mul_(2)
        clone.detect.clear_grid_cache()
        next(clone.parameters()).add_(1)
        assert torch.equal(model(x), before)
        assert not torch.equal(clone(x), before)
    assert clone.detect.anchors.data_ptr() != model.detect.anchors.data_ptr()


def test_state_dict_round_trip_restores_anchors_and_stride(tiny_cfg: dict) -> None:
    torch.manual_seed(1)
    source = Model(tiny_cfg)
    _randomise_batchnorm(source, seed=1)
    with torch.no_grad():
        source.detect.anchors.mul_(1.5)  # as autoanchor would
    source.detect.clear_grid_cache()
    state = source.state_dict()
    assert "model.24.anchors" in state and "model.24.stride" in state
    torch.manual_seed(2)
    target = Model(tiny_cfg).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        target(x)  # a cached grid from the old anchors must not survive the load
        target.load_state_dict(state)
        assert torch.equal(target.detect.anchors, source.detect.anchors)
        assert torch.equal(target.stride, source.stride)
        torch.testing.assert_close(target(x), source.eval()(x))


def test_to_float64_runs(tiny_cfg: dict) -> None:
    model = Model(tiny_cfg).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        single = model(x)
        model.to(torch.float64)
        double = model(x.double())
    assert model.detect.anchors.dtype == torch.float64 and model.stride.dtype == torch.float64
    assert double.dtype == torch.float64
    torch.testing.assert_close(double.float(), single, atol=1e-3, rtol=1e-4)


def _set_row(section: str, index: int, row: list) -> Callable[[dict], None]:
    def edit(cfg: dict) -> None:
        cfg[section][index] = row
    return edit


def _drop(key: str) -> Callable[[dict], None]:
    def edit(cfg: dict) -> None:
        del cfg[key]
    return edit


BAD_CONFIGS = {
    "unknown module": (_set_row("backbone", 1, [-1, 1, "Conv9", [128, 3, 2]]), r"row 1 .*unknown module 'Conv9'"),
    "too many args": (_set_row("backbone", 1, [-1, 1, "Conv", [128, 3, 2, 1, 1, True, 5]]),
                      r"row 1 .*not valid: too many positional arguments"),
    "no args": (_set_row("backbone", 3, [-1, 1, "Conv", []]), r"row 3 .*output channels"),
    "channels not a number": (_set_row("backbone", 3, [-1, 1, "Conv", ["wide", 3, 2]]), r"row 3 .*output channels"),
    "row of three": (_set_row("backbone", 2, [-1, 1, "C3"]), r"row 2 .*expected \[from, number, module, args\]"),
    "from forward": (_set_row("head", 2, [[-1, 20], 1, "Concat", [1]]), r"row 12 .*index 20 points forward"),
    "from out of range": (_set_row("head", 2, [[-1, -40], 1, "Concat", [1]]), r"row 12 .*-40 points out of range"),
    "from forward int": (_set_row("backbone", 1, [3, 1, "Conv", [128, 3, 2]]), r"row 1 .*index 3 points forward"),
    "from not int": (_set_row("backbone", 1, ["x", 1, "Conv", [128, 3, 2]]), r"row 1 .*'from' must be an int"),
    "bad number": (_set_row("backbone", 2, [-1, 0, "C3", [128]]), r"row 2 .*number must be a positive integer"),
    "anchor levels": (_set_row("head", 14, [[17, 20], 1, "Detect", ["nc", "anchors"]]),
                      r"row 24 .*2 inputs but 3 anchor levels"),
    "missing backbone": (_drop("backbone"), r"missing key 'backbone'"),
    "missing head": (_drop("head"), r"missing key 'head'"),
    "missing nc": (_drop("nc"), r"missing key 'nc'"),
    "missing anchors": (_drop("anchors"), r"missing key 'anchors'"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_names_file_and_row(case: str, tiny_cfg: dict, tmp_path: Path) -> None:
    edit, pattern = BAD_CONFIGS[case]
    edit(tiny_cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(tiny_cfg, sort_keys=False))
    with pytest.raises(ModelConfigError) as info:
        Model(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert re.search(pattern, message), message


def test_unreadable_configs(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="not found"):
        Model(tmp_path / "nowhere.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("nc: [1, 2\nbackbone: {")
    with pytest.raises(ModelConfigError, match=f"{re.escape(str(broken))}: not valid YAML"):
        Model(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ModelConfigError, match="expected a mapping"):
        Model(listing)


def test_yaml_is_never_executed(tiny_cfg: dict) -> None:
    tiny_cfg["backbone"][1] = [-1, 1, "__import__('os').system('false') or Conv", [128, 3, 2]]
    with pytest.raises(ModelConfigError, match="unknown module"):
        Model(tiny_cfg)


def test_detect_buffers_follow_the_instance(tiny_cfg: dict) -> None:
    a, b = Model(tiny_cfg), Model(tiny_cfg, nc=5)
    assert isinstance(a.detect, Detect)
    buffers = dict(a.detect.named_buffers())
    assert set(buffers) == {"anchors", "stride"}
    with torch.no_grad():
        a.detect.anchors.zero_()
    assert b.detect.anchors.abs().sum() > 0


def test_configs_that_would_take_gigabytes_are_refused_before_any_memory(tiny_cfg: dict, tmp_path: Path) -> None:
    """A few hundred bytes of YAML: stacked Upsample rows (64x the pixels each) or a huge kernel; refused from the
    meta device's shapes, so nothing is allocated (issue 31: every YAML read is bounded)."""
    upsample = [-1, 1, "nn.Upsample", [None, 8, "nearest"]]
    cases = {"upsample": {**tiny_cfg, "backbone": [[-1, 1, "Conv", [16, 3, 2]], upsample, upsample, upsample,
                                                   *tiny_cfg["backbone"][1:]]},
             "kernel": {**tiny_cfg, "backbone": [[-1, 1, "Conv", [8192, 63, 1]], *tiny_cfg["backbone"][1:]]}}
    for name, cfg in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        assert path.stat().st_size < 3000
        with pytest.raises(ModelConfigError, match="more than") as info:
            Model(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)
