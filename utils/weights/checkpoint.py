"""Self-contained, safely loadable checkpoints.

A checkpoint is a dict of tensors and plain Python types only, so it loads with
``torch.load(weights_only=True)``. Keys every checkpoint has:

    format: "yolo-ddp"      version: int          date: ISO time
    model_yaml: dict        nc: int               names: list[str]
    family: str ("yolov5", "yolov8", "yolo11", "yolo26")    task: str ("detect")    (as the model's head names them;
                            a checkpoint without them is from before they were recorded: YOLOv5 detect)
    model: state dict of the weights to run (the EMA's when training had one), float32
    epoch: int (last completed, -1 for none)     best_fitness: float
    opt: dict of the options that made it       hyp: dict

Training adds ``train_state`` (optimizer, EMA, scaler, schedule position, RNG, sampler
position) for exact resume; inference ignores it. ``detect.py`` and ``export.py`` need
nothing but the file.

Safety: files are written to a temporary name, flushed, verified and renamed, so a crash leaves
the previous file whole; ``last.pt`` is written before ``best.pt`` is replaced by a link or copy of
it, so the two never disappear together. Loading checks the zip structure and every member's
CRC32 first (``torch.load`` alone accepts flipped bits in tensor data) and names the damaged file.
Files from strangers (:mod:`utils.weights.untrusted`): compressed or oversized zip members are refused before
anything is read, every loaded tensor must be a plain view inside its storage within a budget tied to the file's
size, and the model config must build exactly the stored tensors (checked on the meta device) before it is built.
"""

from __future__ import annotations

import datetime
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from models.yolo import Model, ModelConfigError
from utils.atomic_files import fsync_dir, remove_dead_writers_files
from utils.errors import UserError
from utils.log import LOGGER
from utils.tasks.registry import BASE_TASK
from utils.weights.downloads import check_not_url
from utils.weights.untrusted import (
    UntrustedFileError,
    check_config_against_state,
    check_loaded_tensors,
    check_zip_members,
)

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
        "family": str(model.head.family), "task": str(model.head.task),
        "model": {k: v.detach().float().cpu().clone() if v.is_floating_point() else v.detach().cpu().clone()
                  for k, v in weights.items()},
        "epoch": int(epoch), "best_fitness": float(best_fitness),
        "opt": to_plain(opt or {}), "hyp": to_plain(hyp or {}), **extra,
    }


def trained_img_size(ckpt: dict) -> int | None:
    """The image size a checkpoint of this project was trained at (its options' ``img_size``); None for files that
    do not record it (the official release files, trained at 640)."""
    size = (ckpt.get("opt") or {}).get("img_size") if isinstance(ckpt.get("opt"), dict) else None
    size = size[0] if isinstance(size, list) and size else size
    return size if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 16384 else None


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
    """Write atomically: a temporary file in the same folder, flushed to disk, verified, then renamed
    over ``path``. A crash at any moment leaves either the old file or the new one, never a torn file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        verify_checkpoint(tmp)  # never let a bad write replace a good file
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:  # a full disk, a quota, a lost mount: the previous file stays as it was
        raise CheckpointError(f"cannot write {path} ({e.strerror or e}); the previous {path.name} is unchanged. "
                              "Free space or fix the folder, then resume from it") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def save_run_checkpoints(ckpt: dict, weights_dir: str | Path, *, is_best: bool = False,
                         period_name: str | None = None) -> Path:
    """Write ``last.pt``; then, when ``is_best``, replace ``best.pt`` with it (and ``period_name``, e.g.
    ``epoch10.pt``). Each file is replaced atomically and ``last.pt`` always exists before ``best.pt``
    changes, so the two never disappear together. Returns the path of ``last.pt``. Rank 0 only.
    """
    weights_dir = Path(weights_dir)
    _remove_stale_temps(weights_dir)
    last = save_checkpoint(ckpt, weights_dir / "last.pt")
    for name in (["best.pt"] if is_best else []) + ([period_name] if period_name else []):
        _atomic_copy(last, weights_dir / name)
    return last


def _atomic_copy(source: Path, target: Path) -> None:
    """Make ``target`` a hard link to (or, where links fail, a copy of) ``source``, replacing it atomically."""
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def _remove_stale_temps(folder: Path) -> None:
    """Delete temporary files that writers killed mid-write left behind (``.last.pt.tmp<pid>``)."""
    remove_dead_writers_files(folder, ".*.pt.tmp*", ".tmp")


def verify_checkpoint(path: str | Path) -> None:
    """Check that ``path`` is a whole PyTorch zip file whose every member passes its CRC32 check.

    Raises CheckpointError naming the file and what is wrong (missing, empty, truncated, corrupt member).
    """
    path = Path(path)
    if not path.is_file():
        check_not_url(path)
        raise CheckpointError(f"weights file {path} not found")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"weights file {path} is empty (0 bytes); it was never written completely")
    try:
        check_zip_members(path)  # before reading any member: no decompression bombs
        with zipfile.ZipFile(path) as archive:
            bad_member = archive.testzip()
            names = archive.namelist()
    except zipfile.BadZipFile as e:
        raise CheckpointError(f"{path} is damaged: not a complete PyTorch zip file ({size} bytes; {e}); it may "
                              "be truncated by a crash or a full disk, use an earlier checkpoint") from None
    except UntrustedFileError as e:
        raise CheckpointError(f"{path}: refused: {e}") from None
    except (OSError, EOFError, ValueError, RuntimeError) as e:  # zlib/IO errors while reading members
        raise CheckpointError(f"{path} is damaged: cannot be read ({str(e).splitlines()[0][:200]})") from None
    if bad_member is not None:
        raise CheckpointError(f"{path} is damaged: member {bad_member!r} fails its CRC32 check (the file was "
                              "altered or partly overwritten); use an earlier checkpoint")
    if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        raise CheckpointError(f"{path} is not a PyTorch checkpoint (a zip file without data.pkl)")


def load_first_good(paths: Sequence[str | Path], map_location: str | torch.device = "cpu",
                    trusted: bool = False) -> tuple[Path, dict]:
    """Load the first checkpoint of ``paths`` that is whole (e.g. ``last.pt`` then ``best.pt``), warning
    about each damaged one it skips. Raises CheckpointError listing every reason when none loads."""
    reasons = []
    for candidate in map(Path, paths):
        try:
            ckpt = load_checkpoint(candidate, map_location=map_location, trusted=trusted)
        except CheckpointError as e:
            reasons.append(str(e))
            if candidate.exists():
                LOGGER.warning(f"WARNING: {e}; trying the next checkpoint")
            continue
        return candidate, ckpt
    raise CheckpointError("no usable checkpoint: " + "; ".join(reasons))


def _unpickling_reason(error: Exception) -> str:
    """The useful line of torch's weights-only refusal, e.g. 'Unsupported global: GLOBAL __main__.Foo'."""
    text = str(error)
    match = re.search(r"Unsupported global: GLOBAL [\w.]+", text)
    if match:
        return match.group(0)
    lines = [ln.strip() for ln in text.splitlines() if re.search(r"GLOBAL|[Uu]nsupported|WeightsUnpickler", ln)]
    return (lines[0] if lines else text.splitlines()[0] if text else type(error).__name__)[:200]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", trusted: bool = False) -> dict:
    """Verify, load and check a checkpoint of this project; raise CheckpointError with the reason otherwise.

    Only tensors and plain types are accepted (``weights_only=True``). ``trusted=True`` (the
    ``--trust-weights`` flag) allows full unpickling, for files the user vouches for. Official YOLOv5
    release files (pickled ``models.yolo`` objects) are read by a restricted unpickler and converted,
    with or without ``trusted``.
    """
    path = Path(path)
    verify_checkpoint(path)
    if trusted and (release := _load_release_file(path)) is not None:
        return release
    if trusted:
        LOGGER.warning(f"WARNING: --trust-weights: fully unpickling {path}, which can run code stored in it")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=not trusted)
    except pickle.UnpicklingError as e:
        if (release := _load_release_file(path)) is not None:
            return release
        raise CheckpointError(f"{path} holds Python objects that only full unpickling can load, which may run code; "
                              f"refused ({_unpickling_reason(e)}). Use --trust-weights only for a file you trust") \
            from None
    except (zipfile.BadZipFile, RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError, KeyError,
            IndexError, RecursionError, MemoryError, OverflowError) as e:  # torch's weights-only reader lets these out
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise CheckpointError(f"{path} is damaged or not a PyTorch checkpoint ({reason})") from None
    try:
        check_loaded_tensors(ckpt, path.stat().st_size)
    except UntrustedFileError as e:
        raise CheckpointError(f"{path}: refused: {e}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or "model" not in ckpt or "model_yaml" not in ckpt:
        keys = sorted(ckpt)[:6] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{path} is not a checkpoint of this project (found {keys}); "
                              "train one with train.py or pass a .pt written by it")
    return ckpt


# Readers of other projects' release files: name -> (whether a file is theirs, its checkpoint of this project).
# The reader modules register themselves (utils/weights/release_reader.py); importing this package imports them
# (utils/weights/__init__.py), so every load_checkpoint() finds them while this module imports none of them.
RELEASE_READERS: dict[str, tuple[Callable[[Path], bool], Callable[[Path], dict]]] = {}


def register_release_reader(name: str, matches: Callable[[Path], bool], load: Callable[[Path], dict]) -> None:
    """Let load_checkpoint() read another project's release files: ``load`` reads a file that ``matches``."""
    RELEASE_READERS[name] = (matches, load)


def _load_release_file(path: Path) -> dict | None:
    """An official release file converted to our format (read without running its code), else None."""
    for matches, load in RELEASE_READERS.values():
        if matches(path):
            return load(path)
    return None


def recorded_family(ckpt: dict) -> tuple[str, str]:
    """(family, task) a checkpoint records; ("yolov5", "detect") for one from before they were recorded."""
    return str(ckpt.get("family") or "yolov5"), str(ckpt.get("task") or BASE_TASK)


def model_from_checkpoint(ckpt: dict, source: str = "checkpoint") -> Model:
    """Rebuild the model from the YAML and weights a checkpoint holds (float32, train mode), through the model
    builder (its open registry of blocks and heads); the head must be of the family and task the checkpoint records.

    The YAML must build exactly the stored tensors (names and shapes, found on the meta device) before the real
    model is built, so a config out of proportion to the file costs no memory.
    """
    try:
        check_config_against_state(ckpt.get("model_yaml"), ckpt.get("model"), nc=ckpt.get("nc"))
        model = Model(ckpt["model_yaml"], nc=ckpt["nc"])
        model.load_state_dict(ckpt["model"])
    except (ModelConfigError, UntrustedFileError, RuntimeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{source}: weights do not fit the model it describes ({str(e).splitlines()[0]})") \
            from None
    built, recorded = (str(model.head.family), str(model.head.task)), recorded_family(ckpt)
    if built != recorded:
        raise CheckpointError(f"{source}: records a {' '.join(recorded)[:60]} model but its YAML builds a "
                              f"{' '.join(built)} one")
    model.names = plain_names(ckpt.get("names"), model.nc)
    return model


MAX_NAME_LENGTH = 128


def plain_names(names: Any, nc: int) -> list[str]:
    """Class names as plain one-line strings of at most MAX_NAME_LENGTH characters; their indices when the file's
    names are missing, of another count, or not plain (names become folders and labels, never paths or code)."""
    if isinstance(names, dict):
        names = [names.get(i, names.get(str(i))) for i in range(nc)]
    if not isinstance(names, (list, tuple)) or len(names) != nc:
        return [str(i) for i in range(nc)]
    plain = []
    for i, name in enumerate(names):
        text = str(name) if isinstance(name, (str, int)) and not isinstance(name, bool) else ""
        ok = 0 < len(text) <= MAX_NAME_LENGTH and text.isprintable()
        plain.append(text if ok else str(i))
    return plain


def load_model(weights: str | Path, device: str | torch.device = "cpu", fuse: bool = True,
               trusted: bool = False) -> tuple[Model, dict]:
    """(model in eval mode on ``device``, fused when asked; the checkpoint dict) from a .pt file."""
    ckpt = load_checkpoint(weights, trusted=trusted)
    model = model_from_checkpoint(ckpt, str(weights))
    model = model.to(device).eval()
    if fuse:
        model.fuse()
    return model, ckpt
