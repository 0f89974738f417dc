"""Ultralytics release files (``yolov8n.pt`` ... ``yolo11x.pt``, ``yolo26n.pt`` ...) read without running pickled code.

Such a file is a torch zip pickle of a dict whose ``model`` (or ``ema``) is a whole
``ultralytics.nn.tasks.DetectionModel`` in fp16, with its model YAML as a dict (``yaml``), class ``names`` and the
training ``args``. It is read by the same restricted unpickler as YOLOv5's release files
(:mod:`utils.weights.release_reader`): every class of ``ultralytics.*`` or ``torch.nn.modules.*`` becomes an inert
record, tensors are checked views of the file's storages, anything else is refused before it is resolved. From the
records we take the flat state dict and the YAML dict, check that the YAML builds exactly the stored tensors (on the
meta device), build our own Model from it through the open registry, compare the module tree (classes, children and
the settings no tensor shape shows), load every tensor strictly, and return a checkpoint of this project.
Models of the other tasks (``SegmentationModel``, ``ClassificationModel``, ``OBBModel``, ...) are read the same way,
from the class tables each task adds (its ``releases`` part, utils/tasks/<task>/releases.py); their checkpoints
record the task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.yolo import Model, ModelConfigError
from utils.weights.checkpoint import CheckpointError, new_checkpoint
from utils.weights.release_reader import (
    RECORD_CONVERTERS,
    Record,
    _child,
    _children,
    _comparable,
    _FormatError,
    _plain,
    flat_state,
    load_exact,
    read_records,
    release_classes,
    release_names,
)
from utils.weights.untrusted import UntrustedFileError, check_config_against_state

ULTRALYTICS_SOURCE = "ultralytics-release"
MODEL_CLASSES = ("ultralytics.nn.tasks.DetectionModel",)  # and each task's (utils/tasks/<task>/releases.py)
MARKER = "ultralytics."  # globals that make a file an ultralytics pickle
HEAD_CLASSES = ("ultralytics.nn.modules.head.Detect",)

# Settings that change the output without changing any tensor's shape, compared module by module (our class names).
SETTINGS = {
    "Conv2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"),
    "MaxPool2d": ("kernel_size", "stride", "padding", "dilation", "ceil_mode"),
    "ConvTranspose2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "output_padding",
                        "dilation", "groups"),
    "Upsample": ("scale_factor", "mode"),
    "BatchNorm2d": ("eps",),
    "Bottleneck": ("add",),
    "Concat": ("d",),
    "SPPF": ("n", "add"),
    "C2f": ("c",), "C3k2": ("c",), "C2PSA": ("c",),
    "Attention": ("num_heads", "head_dim", "key_dim", "scale"),
    "PSABlock": ("add",),
    "DFL": ("c1",),
    "AnchorFreeDetect": ("nc", "nl", "reg_max", "no"),
    "EndToEndDetect": ("nc", "nl", "reg_max", "no"),
}
ALIASES = {"DetectionModel": ("Model",), "Detect": ("AnchorFreeDetect", "EndToEndDetect")}


def classes() -> dict:
    """This reader's class tables joined with every task's (release_reader.release_classes)."""
    return release_classes("ultralytics", MODEL_CLASSES, SETTINGS, ALIASES, HEAD_CLASSES)


def is_ultralytics_model(raw: Any) -> bool:
    """True when the unpickled top level holds a pickled ultralytics model (under ``model`` or ``ema``)."""
    return isinstance(raw, dict) and any(isinstance(raw.get(k), Record) and raw[k].global_name.startswith(MARKER)
                                         for k in ("model", "ema"))


def load_ultralytics_checkpoint(path: str | Path) -> dict:
    """Read an ultralytics release file safely and return it as a checkpoint of this project (float32)."""
    return convert_records(read_records(path), path)


def convert_records(raw: Any, path: str | Path = "<records>") -> dict:
    """The checkpoint of this project for what ``read_records`` returned; CheckpointError when it does not map."""
    try:
        record = model_record(raw)
        model = release_model(record)
    except (_FormatError, UntrustedFileError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    except ModelConfigError as e:
        raise CheckpointError(f"{path}: the model it describes cannot be built here ({e})") from None
    info = {"model_class": record.global_name, "version": _plain(raw.get("version")), "date": _plain(raw.get("date")),
            "args": _plain(record.attrs.get("args") or raw.get("train_args") or {})}
    return new_checkpoint(model, epoch=-1, source=ULTRALYTICS_SOURCE, release=info)


def model_record(raw: Any) -> Record:
    """The pickled model (its EMA when the file has one, as ultralytics loads it)."""
    if not isinstance(raw, dict):
        raise _FormatError(f"expected a dict with a 'model' entry, found a {type(raw).__name__}")
    record = raw.get("ema") if isinstance(raw.get("ema"), Record) else raw.get("model")
    if not isinstance(record, Record):
        raise _FormatError(f"no pickled model under 'model' or 'ema' (keys: {sorted(map(str, raw))[:8]})")
    models = classes()["models"]
    if record.global_name not in models:
        raise _FormatError(f"holds a {record.global_name}; only ultralytics models ({', '.join(models)}) can be "
                           "loaded")
    return record


def release_model(record: Record) -> Model:
    """Our Model built from the record's ``yaml``, checked module by module, holding every tensor of the file."""
    state = flat_state(record)
    layers = _child(record, "model")
    head_index = list(_children(layers))[-1]
    head = _children(layers)[head_index]
    heads = classes()["heads"]
    if head.global_name not in heads:
        raise _FormatError(f"the last layer is a {head.global_name}, not a head of {', '.join(heads)}")
    stride = None  # a head without strides in the file (a classifier's) keeps those its yaml builds
    if head.global_name not in classes()["strideless"]:
        stride = head.attrs.get("stride", record.attrs.get("stride"))
        if not isinstance(stride, torch.Tensor) or stride.dim() != 1 or not 1 <= stride.numel() <= 8:
            raise _FormatError(f"the head ({head.global_name}) has no strides")
        stride = stride.detach().float()
        state[f"model.{head_index}.stride"] = stride  # a buffer of our heads, a plain attribute of theirs
    cfg, ch = release_config(record, head)
    check_config_against_state(cfg, state, ch=ch)  # before building: the yaml makes exactly these tensors
    model = Model(cfg, ch=ch)
    if stride is not None and not torch.equal(model.stride.float(), stride):
        raise _FormatError(f"strides {stride.tolist()} in the file but {model.stride.tolist()} for its yaml")
    check_structure(record, model)
    load_exact(model, state)
    model.names = release_names(record, model.nc)
    return model


def release_config(record: Record, head: Record) -> tuple[dict, int]:
    """(the model YAML dict of the file with its class count and bare file name, its input channels)."""
    cfg = record.attrs.get("yaml")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("backbone"), list) or not isinstance(cfg.get("head"), list):
        raise _FormatError(f"the {record.global_name} has no model yaml (backbone/head rows)")
    cfg = _plain(cfg)
    if isinstance(head.attrs.get("nc"), int):
        cfg["nc"] = head.attrs["nc"]
    ch = cfg.pop("channels", cfg.pop("ch", 3))
    if not isinstance(ch, int) or isinstance(ch, bool) or not 1 <= ch <= 64:
        raise _FormatError(f"the yaml's input channels {str(ch)[:40]!r} must be an integer in 1..64")
    cfg["yaml_file"] = Path(str(cfg.get("yaml_file") or "ultralytics-release.yaml")).name[:100]
    return cfg, ch


def check_structure(record: Record, module: nn.Module, where: str = "model") -> None:
    """Same classes, same children and the same shape-free settings (strides, padding, pooling, shortcuts,
    attention heads) everywhere."""
    ours, theirs_name, tables = type(module).__name__, record.class_name, classes()
    if ours not in tables["aliases"].get(theirs_name, (theirs_name,)):
        raise _FormatError(f"{where} is a {record.global_name} in the file but a {ours} in the model its yaml builds")
    for setting in tables["settings"].get(ours, ()):
        if setting in record.attrs and _comparable(record.attrs[setting]) != _comparable(getattr(module, setting)):
            raise _FormatError(f"{where}.{setting} is {repr(record.attrs[setting])[:40]} in the file but "
                               f"{getattr(module, setting)!r} in the model its yaml builds")
    theirs, mine = _children(record), dict(module.named_children())
    if list(theirs) != list(mine):
        raise _FormatError(f"{where} has children {list(theirs)[:12]} in the file but {list(mine)[:12]} in the model")
    for name, child in theirs.items():
        check_structure(child, mine[name], f"{where}.{name}")


RECORD_CONVERTERS.append((is_ultralytics_model, convert_records))
