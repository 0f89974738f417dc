"""Self-contained, safely loadable checkpoints.

A checkpoint is a dict of tensors and plain Python types only, so it loads with
``torch.load(weights_only=True)``. Keys every checkpoint has:

    format: "yolo-ddp"      version: int          date: ISO time
    model_yaml: dict        nc: int               names: list[str]
    model: state dict of the weights to run (the EMA's when training had one), float32
    epoch: int (last completed, -1 for none)     best_fitness: float
    opt: dict of the options that made it       hyp: dict

Training adds ``train_state`` (optimizer, EMA, scaler, schedule position, RNG, sampler
position) for exact resume; inference ignores it. ``detect.py`` and ``export.py`` need
nothing but the file.
"""

from __future__ import annotations

import datetime
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from models.yolo import Model, ModelConfigError
from utils.errors import UserError

FORMAT = "yolo-ddp"
VERSION = 1


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the message names the file and why."""


def new_checkpoint(model: Model, *, state_dict: dict | None = None, epoch: int = -1, best_fitness: float = 0.0,
                   opt: dict | None = None, hyp: dict | None = None, **extra: Any) -> dict:
    """The common part of every checkpoint, from a model (not DDP-wrapped)."""
    weights = state_dict if state_dict is not None else model.state_dict()
    return {
        "format": FORMAT, "version": VERSION, "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "model_yaml": to_plain(model.yaml), "nc": int(model.nc), "names": [str(n) for n in model.names],
        "model": {k: v.detach().float().cpu().clone() if v.is_floating_point() else v.detach().cpu().clone()
                  for k, v in weights.items()},
        "epoch": int(epoch), "best_fitness": float(best_fitness),
        "opt": to_plain(opt or {}), "hyp": to_plain(hyp or {}), **extra,
    }


def to_plain(obj: Any) -> Any:
    """Paths, tuples, numpy scalars and namespaces -> plain types that weights_only loading accepts."""
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None or isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, os.PathLike):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return obj.item()
    if hasattr(obj, "__dict__"):
        return to_plain(vars(obj))
    return str(obj)


def save_checkpoint(ckpt: dict, path: str | Path) -> Path:
    """Write atomically: a temporary file in the same folder, flushed to disk, then renamed over ``path``.

    A crash at any moment leaves either the old file or the new one, never a torn file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", trusted: bool = False) -> dict:
    """Load and check a checkpoint of this project; raise CheckpointError with the reason otherwise.

    Only tensors and plain types are accepted (``weights_only=True``). ``trusted=True`` allows
    full unpickling, for files the user vouches for.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} not found")
    if path.stat().st_size == 0:
        raise CheckpointError(f"weights file {path} is empty (0 bytes)")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=not trusted)
    except pickle.UnpicklingError as e:
        reason = str(e).split("\n")[0][:200]
        raise CheckpointError(f"{path} holds Python objects that only full unpickling can load, which may run code; "
                              f"refused ({reason}). Use --trust-weights only for a file you trust") from None
    except (zipfile.BadZipFile, RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is damaged or not a PyTorch checkpoint ({str(e).splitlines()[0][:200]})") \
            from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or "model" not in ckpt or "model_yaml" not in ckpt:
        keys = sorted(ckpt)[:6] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{path} is not a checkpoint of this project (found {keys}); "
                              "train one with train.py or pass a .pt written by it")
    return ckpt


def model_from_checkpoint(ckpt: dict, source: str = "checkpoint") -> Model:
    """Rebuild the model from the YAML and weights a checkpoint holds (float32, train mode)."""
    try:
        model = Model(ckpt["model_yaml"], nc=ckpt["nc"])
        model.load_state_dict(ckpt["model"])
    except (ModelConfigError, RuntimeError, KeyError) as e:
        raise CheckpointError(f"{source}: weights do not fit the model it describes ({str(e).splitlines()[0]})") \
            from None
    model.names = list(ckpt.get("names") or model.names)
    return model


def load_model(weights: str | Path, device: str | torch.device = "cpu", fuse: bool = True,
               trusted: bool = False) -> tuple[Model, dict]:
    """(model in eval mode on ``device``, fused when asked; the checkpoint dict) from a .pt file."""
    ckpt = load_checkpoint(weights, trusted=trusted)
    model = model_from_checkpoint(ckpt, str(weights))
    model = model.to(device).eval()
    if fuse:
        model.fuse()
    return model, ckpt
