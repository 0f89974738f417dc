"""The YAML-defined detection Model: its blocks and head come from the open registry (models/registry.py).

A model YAML has ``nc``, the depth and width multiples (``depth_multiple``/``width_multiple``, or ultralytics'
``scales`` table of ``[depth, width, max_channels]`` per scale letter with ``scale`` naming one), whatever its head
reads (``anchors`` for YOLOv5; ``reg_max``, ``end2end`` for the anchor-free heads) and ``backbone`` / ``head`` rows
``[from, number, module, args]``. Module names are looked up in the registry; nothing in the file is ever executed.
``yolo11n.yaml`` and the like resolve to the family file (``yolo11.yaml``) with the scale from the name, as
ultralytics resolves them.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python models/yolo.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

import models.blocks  # noqa: F401  (registers the YOLOv8/YOLO11/YOLO26 blocks)
import models.head_anchor_free  # noqa: F401  (registers the YOLOv8/YOLO11 head)
import models.head_end_to_end  # noqa: F401  (registers YOLO26's head)
from models.common import C3, Conv, exporting
from models.cost import REFERENCE_SIZE, check_cost, check_settings
from models.head import Detect, check_anchor_order
from models.registry import LIMITS, ModelConfigError, Row, is_number, known_names, lookup, make_divisible
from utils.log import LOGGER
from utils.safe_yaml import YamlError, load_yaml, shown

MODELS_DIR = Path(__file__).resolve().parent
PROBE = 256  # the square input whose forward pass finds the strides
SCALED_NAME = re.compile(r"^(yolov?\d+)([nslmx])((?:-[\w]+)*)$")  # yolo11n, yolov8s, yolo26x-seg -> family + scale
HEAD_INTERFACE = ("contract", "set_strides", "init_biases", "export_metadata", "stride")  # what the last row offers
__all__ = ["Detect", "LIMITS", "Model", "ModelConfigError", "check_anchor_order", "load_model_config",
           "make_divisible", "parse_model"]


def load_model_config(cfg: str | Path | dict) -> tuple[dict, str]:
    """(config dict, source name) from a dict, a YAML path, or a bare name found in models/.

    A name such as ``yolo11n.yaml`` with no file of its own is the family file ``yolo11.yaml`` (beside it, or in
    models/) at scale ``n``; the config then records ``scale`` and the name it was asked by (``yaml_file``).
    """
    if isinstance(cfg, dict):
        return copy.deepcopy(cfg), str(cfg.get("yaml_file", "<dict>"))
    path, scale = _find_config(Path(cfg))
    if path is None:
        raise ModelConfigError(f"model config {cfg} not found (looked here and in {MODELS_DIR})")
    try:
        data = load_yaml(path)
    except YamlError as e:
        raise ModelConfigError(str(e)) from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: expected a mapping with backbone/head rows")
    if scale and isinstance(data.get("scales"), dict) and "scale" not in data:
        data["scale"] = scale
    data["yaml_file"] = f"{Path(cfg).stem}.yaml" if scale else path.name
    return data, str(path)


def _find_config(path: Path) -> tuple[Path | None, str]:
    """(the file to read, the scale letter when it is a family file found by a scaled name)."""
    for candidate in (path, MODELS_DIR / path.name, MODELS_DIR / f"{path.name}.yaml"):
        if candidate.is_file():
            return candidate, ""
    stem = path.name[:-5] if path.name.endswith(".yaml") else path.name
    match = SCALED_NAME.match(stem)
    if match:
        family = f"{match.group(1)}{match.group(3)}.yaml"
        for folder in (path.parent, MODELS_DIR):
            if (folder / family).is_file():
                return folder / family, match.group(2)
    return None, ""


def _resolve_arg(value: Any, cfg: dict, source: str) -> Any:
    """A YAML argument: ``nc`` / ``anchors`` name the config's values, ``None`` is None, the rest as written."""
    if value in ("nc", "anchors"):
        if value not in cfg:
            raise ModelConfigError(f"{source}: missing key '{value}'")
        return cfg[value]
    if value == "None":
        return None
    return value


def _check_from(f: Any, index: int, where: str) -> list[int]:
    sources = [f] if isinstance(f, int) else f
    if not isinstance(sources, list) or not sources or not all(isinstance(j, int) for j in sources):
        raise ModelConfigError(f"{where}: 'from' must be an int or a list of ints, got {f!r}")
    for j in sources:
        absolute = j if j >= 0 else index + j
        if j == -1 and len(sources) == 1:
            continue  # the previous row's output (the image for row 0)
        if j >= index or absolute < 0 or (j == -1 and index == 0):
            raise ModelConfigError(f"{where}: 'from' index {j} points {'forward' if j >= index else 'out of range'}"
                                   f" (row {index} may only use earlier rows)")
    return sources


def _check_top_level(cfg: dict, source: str) -> None:
    for key in ("nc", "backbone", "head"):
        if key not in cfg:
            raise ModelConfigError(f"{source}: missing key '{key}'")
    nc = cfg["nc"]
    if not isinstance(nc, int) or isinstance(nc, bool) or not 1 <= nc <= LIMITS["classes"]:
        raise ModelConfigError(f"{source}: nc must be an integer in 1..{LIMITS['classes']}, got {shown(nc)}")
    for section in ("backbone", "head"):
        if not isinstance(cfg[section], list) or not cfg[section]:
            raise ModelConfigError(f"{source}: '{section}' must be a list of [from, number, module, args] rows")
    if len(cfg["backbone"]) + len(cfg["head"]) > LIMITS["rows"]:
        raise ModelConfigError(f"{source}: more than {LIMITS['rows']} rows")


def _multiples(cfg: dict, source: str) -> tuple[float, float, float, str]:
    """(depth, width, max channels, scale letter): from ``scales`` and ``scale`` when the config has a scales table
    (the first scale, with a warning, when it names none), else from ``depth_multiple``/``width_multiple``."""
    scales = cfg.get("scales")
    if scales is None:
        values = (cfg.get("depth_multiple", 1.0), cfg.get("width_multiple", 1.0), math.inf)
        names, scale = ("depth_multiple", "width_multiple"), ""
    else:
        if not isinstance(scales, dict) or not scales or len(scales) > 16:
            raise ModelConfigError(f"{source}: scales must map scale letters to [depth, width, max_channels]")
        scale = cfg.get("scale") or next(iter(scales))
        if not cfg.get("scale"):
            LOGGER.warning(f"WARNING: {source}: no model scale given (a name such as yolo11n.yaml gives one); "
                           f"using scale '{scale}'")
        values = scales.get(scale)
        if not (isinstance(values, list) and len(values) == 3):
            raise ModelConfigError(f"{source}: scale {shown(scale)} is not one of {sorted(map(str, scales))} "
                                   "with [depth, width, max_channels]")
        names = ("depth", "width")
    for name, value in zip(names, values[:2]):
        if not (is_number(value) and 0 < value <= LIMITS["multiple"]):
            raise ModelConfigError(f"{source}: {name} must be a number in (0, {LIMITS['multiple']}], got "
                                   f"{shown(value)}")
    max_channels = values[2]
    if not (is_number(max_channels) or max_channels == math.inf) or max_channels < 8:
        raise ModelConfigError(f"{source}: max_channels must be a number of at least 8, got {shown(max_channels)}")
    return float(values[0]), float(values[1]), max_channels, str(scale)


def _build_row(i: int, row: Any, section: str, cfg: dict, ctx: dict, channels: list[int], source: str) -> tuple:
    """One row -> (block, sources, output channels, table line)."""
    where = f"{source}: row {i} ({section})"
    if not (isinstance(row, list) and len(row) == 4):
        raise ModelConfigError(f"{where}: expected [from, number, module, args], got {shown(row)}")
    f, n, name, args = row
    sources = _check_from(f, i, where)
    args = [_resolve_arg(a, cfg, source) for a in (args if isinstance(args, list) else [args])]
    entry = lookup(name, cfg, args)
    if entry is None:
        raise ModelConfigError(f"{where}: unknown module {shown(name)} (known: {', '.join(known_names())})")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ModelConfigError(f"{where}: number must be a positive integer, got {shown(n)}")
    if n > LIMITS["repeats"]:
        raise ModelConfigError(f"{where}: number {n} is more than {LIMITS['repeats']} repeats")
    n = max(round(n * ctx["depth"]), 1) if n > 1 else n
    spec_row = Row(name, i, where, args, n, [channels[j] for j in sources], cfg, ctx["width"], ctx["max_channels"],
                   ctx["scale"], ctx["notes"])
    args, n, c_out = entry.spec(spec_row)
    if max(n, spec_row.repeats) > LIMITS["repeats"] or c_out > LIMITS["channels"]:
        raise ModelConfigError(f"{where}: {c_out} channels x {n} repeats after scaling by depth {ctx['depth']} and "
                               f"width {ctx['width']} exceed {LIMITS['channels']} channels or {LIMITS['repeats']} "
                               "repeats")
    try:
        inspect.signature(entry.cls).bind(*args)
        block = nn.Sequential(*(entry.cls(*args) for _ in range(n))) if n > 1 else entry.cls(*args)
    except (TypeError, ValueError, IndexError, RuntimeError, ArithmeticError) as e:  # inf expansions overflow
        raise ModelConfigError(f"{where}: {name}{shown(args)} is not valid: {e}") from None
    check_settings(block, where)
    block.i, block.f, block.type = i, f, entry.table_name  # per-instance wiring, read by Model.forward
    params = sum(p.numel() for p in block.parameters())
    line = f"{i:>3}{str(f):>18}{n:>3}{params:>10}  {entry.table_name + ' ':<40}{str(args):<30}"
    return block, sources, c_out, line


def parse_model(cfg: dict, ch: int, source: str = "<dict>") -> tuple[nn.Sequential, list[int], list[str]]:
    """Build the layers of ``cfg``; returns (layers, indices whose outputs are kept, table rows)."""
    _check_top_level(cfg, source)
    depth, width, max_channels, scale = _multiples(cfg, source)
    ctx = {"depth": depth, "width": width, "max_channels": max_channels, "scale": scale, "notes": {}}
    rows = [("backbone", r) for r in cfg["backbone"]] + [("head", r) for r in cfg["head"]]
    channels, layers, save, table = [ch], [], [], []
    for i, (section, row) in enumerate(rows):
        block, sources, c_out, line = _build_row(i, row, section, cfg, ctx, channels, source)
        table.append(line)
        save.extend(j % i for j in sources if j != -1)
        layers.append(block)
        channels = [c_out] if i == 0 else [*channels, c_out]
    if not all(hasattr(layers[-1], name) for name in HEAD_INTERFACE):
        raise ModelConfigError(f"{source}: the last head row must be a detection head (Detect)")
    return nn.Sequential(*layers), sorted(set(save)), table


def check_build_size(cfg: dict, ch: int, source: str, img_size: int | None = None) -> None:
    """ModelConfigError (one line) when ``cfg`` would hold more than LIMITS' parameters or cost more than their
    limits for one image of ``img_size`` px (at least models.cost.REFERENCE_SIZE): built and traced on the meta
    device (no memory, no arithmetic); a config that passed is remembered."""
    size = max(int(img_size or 0), REFERENCE_SIZE)
    try:
        key = json.dumps([cfg, ch, size], sort_keys=True)
    except (TypeError, ValueError):
        key = None  # not plain data: checked every time
    if key is not None and key in _CHECKED:
        return
    with torch.device("meta"):
        layers, save, _ = parse_model(copy.deepcopy(cfg), ch, source)
    check_cost(layers.train(), lambda x: run_rows(layers, save, x), ch, size, source)
    if key is not None:
        _CHECKED[key] = None
        while len(_CHECKED) > 64:
            _CHECKED.pop(next(iter(_CHECKED)))


_CHECKED: dict[str, None] = {}  # configs that passed check_build_size (insertion order: oldest first)


def run_rows(layers: nn.Sequential, save: Sequence[int], x: Any) -> Any:
    """The rows in order, each fed from its ``from`` rows; the outputs of rows in ``save`` kept for later rows."""
    outputs: list[Any] = []
    for layer in layers:
        if layer.f != -1:
            x = outputs[layer.f] if isinstance(layer.f, int) else [x if j == -1 else outputs[j] for j in layer.f]
        x = layer(x)
        outputs.append(x if layer.i in save else None)
    return x


class Model(nn.Module):
    """A detection model built from a YAML config (path, bare name in models/, or dict)."""

    def __init__(self, cfg: str | Path | dict = "yolov5s.yaml", ch: int = 3, nc: int | None = None,
                 anchors: list | None = None, img_size: int | None = None) -> None:
        super().__init__()
        self.yaml, self.yaml_source = load_model_config(cfg)
        if nc is not None:
            self.yaml["nc"] = int(nc)
        if anchors is not None:
            self.yaml["anchors"] = anchors
        self.input_channels = ch
        self.channels_last_input = False  # set by fuse() on the CPU
        check_build_size(self.yaml, ch, self.yaml_source, img_size)  # img_size: the run's, when it is known
        self.model, self.save, self._table = parse_model(copy.deepcopy(self.yaml), ch, self.yaml_source)
        self.names = [str(i) for i in range(self.yaml["nc"])]
        self.head.set_strides(self._dry_run_strides(probe=PROBE))
        self._init_weights()
        self.head.init_biases()

    def _dry_run_strides(self, probe: int) -> torch.Tensor:
        """The stride of each head input: one train-mode pass over a ``probe`` x ``probe`` image, the head's input
        heights seen by a hook."""
        heights: list[int] = []

        def record(module: nn.Module, inputs: tuple) -> None:
            maps = inputs[0] if isinstance(inputs[0], (list, tuple)) else [inputs[0]]
            heights.extend(int(m.shape[-2]) for m in maps)

        hook = self.head.register_forward_pre_hook(record)
        try:
            with torch.no_grad():
                self._forward_raw(torch.zeros(1, self.input_channels, probe, probe))
        except ModelConfigError:
            raise
        except (RuntimeError, TypeError, ValueError, IndexError) as e:
            raise ModelConfigError(f"{self.yaml_source}: the rows do not fit together "
                                   f"({str(e).splitlines()[0]})") from None
        finally:
            hook.remove()
        return torch.tensor([probe / h for h in heights])

    @property
    def head(self) -> nn.Module:
        """The last row: the head that owns the output contract, the decode and the bias priors."""
        return self.model[-1]

    @property
    def detect(self) -> nn.Module:
        """The head (its older name, from when YOLOv5's Detect was the only one)."""
        return self.model[-1]

    @property
    def stride(self) -> torch.Tensor:
        return self.head.stride

    @property
    def nc(self) -> int:
        return self.head.nc

    def forward(self, x: torch.Tensor) -> Any:
        if self.channels_last_input and x.dim() == 4 and x.device.type == "cpu" and not exporting():
            x = x.contiguous(memory_format=torch.channels_last)
        return run_rows(self.model, self.save, x)

    def _forward_raw(self, x: torch.Tensor) -> Any:
        was_training = self.training
        self.train()
        try:
            return self.forward(x)
        finally:
            self.train(was_training)

    def _init_weights(self) -> None:
        eps, momentum = getattr(self.head, "batchnorm", (1e-3, 0.03))  # a head may keep PyTorch's (a classifier)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps, m.momentum = eps, momentum
            elif isinstance(m, nn.SiLU):
                m.inplace = True

    def fuse(self) -> Model:
        """Fold every Conv's BatchNorm into its convolution (for inference). On the CPU the weights and, from then
        on, each input image also go channels_last: oneDNN's convolutions skip a layout reorder per layer and the
        1x1 convolutions become plain matrix products (measured: README, Performance)."""
        for m in self.modules():
            if isinstance(m, (Conv,)):
                m.fuse()
        for m in self.modules():
            if isinstance(m, C3):
                m.merge()
        if all(p.device.type == "cpu" for p in self.parameters()):
            self.to(memory_format=torch.channels_last)
            self.channels_last_input = True
        return self

    def flops(self, img_size: int = 640) -> float:
        """GFLOPs of one forward pass at ``img_size`` (counted at a small size, scaled by area).

        Convolutions count 2 FLOPs per multiply-add (torch.utils.flop_counter's rule); an
        un-fused BatchNorm counts 4 per element (subtract mean, divide by std, scale, shift).
        """
        from torch.utils.flop_counter import FlopCounterMode

        aten = torch.ops.aten
        bn_rule = {aten.native_batch_norm: _batch_norm_flops,
                   aten._native_batch_norm_legit_no_training: _batch_norm_flops}
        probe = int(max(self.stride.max().item(), 32) * 4)
        model = copy.deepcopy(self).eval()
        counter = FlopCounterMode(display=False, custom_mapping=bn_rule)
        with torch.no_grad(), counter:
            model(torch.zeros(1, self.input_channels, probe, probe, device=next(model.parameters()).device))
        return counter.get_total_flops() / 1e9 * (img_size / probe) ** 2

    def info(self, img_size: int = 640, verbose: bool = True) -> str:
        """Layer table (from, n, params, module, arguments) and ``N layers, P parameters, G GFLOPs``."""
        n_params = sum(p.numel() for p in self.parameters())
        n_grads = sum(p.numel() for p in self.parameters() if p.requires_grad)
        summary = (f"Model summary: {len(list(self.modules()))} layers, {n_params} parameters, {n_grads} gradients, "
                   f"{self.flops(img_size):.1f} GFLOPs")
        header = f"{'':>3}{'from':>18}{'n':>3}{'params':>10}  {'module':<40}{'arguments':<30}"
        return "\n".join([header, *self._table, summary]) if verbose else summary


def _batch_norm_flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    shape = out_shape[0] if isinstance(out_shape[0], (tuple, list, torch.Size)) else out_shape
    return 4 * math.prod(shape)


if __name__ == "__main__":
    from models.layer_profile import main, parse_opt
    from utils.cli import run_script

    sys.exit(run_script(main, parse_opt(), "yolo"))
