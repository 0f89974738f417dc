"""``python models/yolo.py``: build a model from its YAML and print its layer table, size and GFLOPs; with
``--profile`` / ``--line-profile`` the time (and GFLOPs) of every layer. The script is models/yolo.py's entry
point; its flags and the profile live here."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from models.yolo import Model, _batch_norm_flops


def parse_opt(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Flags of ``python models/yolo.py`` (build a model from its YAML; print its layers, size and speed)."""
    p = argparse.ArgumentParser(prog="python models/yolo.py", description=parse_opt.__doc__)
    p.add_argument("--cfg", default="yolov5s.yaml", help="model YAML: a path or a name in models/")
    p.add_argument("--batch-size", type=int, default=1, help="images per forward pass (for --profile)")
    p.add_argument("--img-size", "--img", "--imgsz", type=int, default=640, help="square input size in pixels")
    p.add_argument("--device", default="", help="cuda device (0 or 0,1) or cpu")
    p.add_argument("--profile", action="store_true", help="time each layer and the whole forward pass on --device")
    p.add_argument("--line-profile", action="store_true", help="per-layer table: ms, GFLOPs and parameters")
    p.add_argument("--runs", type=int, default=5, help="timed forward passes per measurement")
    return p.parse_args(argv)


def layer_profile(model: Model, images: torch.Tensor, runs: int = 5,
                  flops: bool = True) -> list[tuple[int, float, float, int, str]]:
    """(index, ms, GFLOPs or nan, parameters, module) for each layer of one eval-mode forward pass over ``images``."""
    rows, outputs, x = [], [], images
    for layer in model.model:
        if layer.f != -1:  # the same routing as Model.forward
            x = outputs[layer.f] if isinstance(layer.f, int) else [x if j == -1 else outputs[j] for j in layer.f]
        ms = _time_ms(layer, x, runs)
        gflops = _gflops(layer, x) if flops else math.nan
        rows.append((layer.i, ms, gflops, sum(p.numel() for p in layer.parameters()), layer.type))
        x = layer(x)
        outputs.append(x if layer.i in model.save else None)
    return rows


@torch.no_grad()
def _time_ms(fn: Any, x: Any, runs: int) -> float:
    """Mean milliseconds of ``fn(x)`` after one warm-up call, synchronising CUDA around the timed calls."""
    device = (x[0] if isinstance(x, list) else x).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn(x)
    sync()
    start = time.perf_counter()
    for _ in range(max(runs, 1)):
        fn(x)
    sync()
    return (time.perf_counter() - start) / max(runs, 1) * 1e3


@torch.no_grad()
def _gflops(fn: Any, x: Any) -> float:
    """GFLOPs of ``fn(x)``, counted as Model.flops counts them (2 per multiply-add, 4 per BatchNorm element)."""
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    counter = FlopCounterMode(display=False, custom_mapping={
        aten.native_batch_norm: _batch_norm_flops, aten._native_batch_norm_legit_no_training: _batch_norm_flops})
    with counter:
        fn(x)
    return counter.get_total_flops() / 1e9


def main(opt: argparse.Namespace) -> None:
    """Print the layer table and the size of ``--cfg``; with --profile / --line-profile, per-layer speed."""
    from utils.device import select_device

    device = select_device(opt.device)
    model = Model(opt.cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_grads = sum(p.numel() for p in model.parameters() if p.requires_grad)
    gflops = model.flops(opt.img_size)
    print(f"{'':>3}{'from':>18}{'n':>3}{'params':>10}  {'module':<40}{'arguments':<30}")  # as Model.info prints it
    print("\n".join(model._table))
    name = Path(model.yaml.get("yaml_file") or model.yaml_source).stem  # yolo11n, not the family file's yolo11
    print(f"{name} summary: {len(list(model.modules()))} layers, {n_params:,} parameters, "
          f"{n_grads:,} gradients, {gflops:.{1 if gflops >= 1 else 3}f} GFLOPs at {opt.img_size}x{opt.img_size}")
    if not (opt.profile or opt.line_profile):
        return
    model.eval()
    images = torch.rand(opt.batch_size, model.input_channels, opt.img_size, opt.img_size, device=device)
    rows = layer_profile(model, images, opt.runs, flops=opt.line_profile)
    print(f"\nper-layer profile on {device}, batch {opt.batch_size}, {opt.img_size}x{opt.img_size}, "
          f"mean of {opt.runs} runs")
    flops_head = f"{'GFLOPs':>10}" if opt.line_profile else ""
    print(f"{'':>3}{'time (ms)':>11}{flops_head}{'params':>11}  module")
    for i, ms, layer_gflops, params, module in rows:
        print(f"{i:>3}{ms:>11.2f}{f'{layer_gflops:>10.3f}' if opt.line_profile else ''}{params:>11}  {module}")
    total_flops = f"{sum(r[2] for r in rows):>10.3f}" if opt.line_profile else ""
    print(f"{'':>3}{sum(r[1] for r in rows):>11.2f}{total_flops}{n_params:>11}  total")
    print(f"forward pass: {_time_ms(model, images, opt.runs):.2f} ms on {device}")
