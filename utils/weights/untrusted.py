"""Checks for weights files from strangers, applied before any tensor of the file is used in arithmetic.

A torch zip file is accepted only when every member is stored (torch never compresses) and the members together fit
in the file; every tensor read from it must be a non-overlapping view inside its storage; all tensors together may
not claim more bytes than the file could hold; nested containers are bounded in depth and count; and the tensors
stored for a model must have exactly the names and shapes its config builds, compared on the ``meta`` device
before the real model is built (so a config that would take gigabytes is refused without allocating them).
"""

from __future__ import annotations

import copy
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from models.yolo import ModelConfigError, parse_model
from utils.errors import UserError

MAX_MEMBERS = 100_000  # zip members of one weights file
MAX_DEPTH = 64  # nesting of containers in a loaded file
MAX_NODES = 1_000_000  # containers and values visited in a loaded file (shared references count each time)
MAX_DIMS = 16
TENSOR_SLACK_BYTES = 1 << 20  # tensors may exceed the file by this much (tiny files hold mostly metadata)


class UntrustedFileError(UserError, ValueError):
    """A weights file that breaks a safety rule; the message says which (the caller names the file)."""


def check_zip_members(path: str | Path) -> list[zipfile.ZipInfo]:
    """The members of a torch zip file, refused unless each is stored uncompressed and all fit in the file.

    A file that is not a zip at all raises zipfile.BadZipFile (damage, for the caller to name).
    """
    size = Path(path).stat().st_size
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise UntrustedFileError(f"{len(members)} zip members (at most {MAX_MEMBERS})")
    for info in members:
        if info.compress_type != zipfile.ZIP_STORED:
            raise UntrustedFileError(f"zip member {info.filename!r} is compressed; torch never compresses its "
                                     "files, so this one was altered")
        if info.file_size > size or info.compress_size != info.file_size:
            raise UntrustedFileError(f"zip member {info.filename!r} claims {info.file_size} bytes in a file of {size}")
    if sum(info.file_size for info in members) > size:
        raise UntrustedFileError(f"zip members claim {sum(i.file_size for i in members)} bytes in a file of {size}")
    return members


def check_view(size: Any, stride: Any, offset: Any, storage_numel: int, where: str = "tensor") -> int:
    """The element count of a view, after checking it is a non-overlapping view inside a storage of ``storage_numel``.

    Sizes, strides and the offset must be non-negative ints; a dimension longer than one with stride 0, or two
    dimensions whose elements interleave, would show one stored element many times (a memory bomb once used).
    """
    dims = tuple(size) if isinstance(size, (tuple, list, torch.Size)) else None
    steps = tuple(stride) if isinstance(stride, (tuple, list, torch.Size)) else None
    if dims is None or steps is None or len(dims) != len(steps) or len(dims) > MAX_DIMS:
        raise UntrustedFileError(f"{where}: size {str(size)[:60]} and stride {str(stride)[:60]} do not describe a "
                                 "tensor")
    if not all(_is_count(v) for v in (*dims, *steps, offset)):
        raise UntrustedFileError(f"{where}: size, stride and offset must be non-negative integers")
    numel = 1
    for d in dims:
        numel *= d
    if numel == 0:
        if offset > storage_numel:
            raise UntrustedFileError(f"{where}: offset {offset} is past its storage of {storage_numel} elements")
        return 0
    span = 1  # elements from the first to one past the last of the dimensions seen so far
    for d, s in sorted(((d, s) for d, s in zip(dims, steps) if d > 1), key=lambda pair: pair[1]):
        if s < span:
            raise UntrustedFileError(f"{where}: an overlapping view (size {list(dims)}, stride {list(steps)}) shows "
                                     "stored elements more than once")
        span = s * (d - 1) + span
    if offset + span > storage_numel:
        raise UntrustedFileError(f"{where}: a view of {numel} elements (size {list(dims)}, stride {list(steps)}, "
                                 f"offset {offset}) reaches past its storage of {storage_numel} elements")
    return numel


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def tensor_budget(file_size: int) -> int:
    """The most bytes the tensors of a file of ``file_size`` bytes may claim together."""
    return 2 * file_size + TENSOR_SLACK_BYTES


def walk(obj: Any, where: str = "", children: Callable[[Any], dict | None] | None = None) -> Iterator[tuple[str, Any]]:
    """(dotted place, value) of every value in nested dicts, lists and tuples, refusing deep or huge structures.

    ``children(value)`` may name more to descend into (a record's attributes), as a dict.
    """
    stack, visited = [(obj, where, 0)], 0
    while stack:
        value, place, depth = stack.pop()
        visited += 1
        if visited > MAX_NODES:
            raise UntrustedFileError(f"more than {MAX_NODES} values (shared references repeated?)")
        if depth > MAX_DEPTH:
            raise UntrustedFileError(f"{place or 'the top level'} is nested deeper than {MAX_DEPTH} levels")
        yield place, value
        if children is not None and (more := children(value)) is not None:
            value = more
        if isinstance(value, dict):
            stack.extend((v, f"{place}.{k}" if place else str(k), depth + 1) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, f"{place}[{i}]", depth + 1) for i, v in enumerate(value))


def check_loaded_tensors(obj: Any, file_size: int) -> None:
    """Every tensor in a loaded structure: a plain dense CPU view inside its storage; all within the file's budget."""
    total = 0
    for place, value in walk(obj):
        if not isinstance(value, torch.Tensor):
            continue
        if value.layout != torch.strided or value.device.type not in ("cpu", "meta") or value.is_quantized:
            raise UntrustedFileError(f"{place}: a {value.layout} tensor on {value.device}; only dense tensors load")
        numel = check_view(tuple(value.shape), tuple(value.stride()), value.storage_offset(),
                           value.untyped_storage().nbytes() // value.element_size(), place or "tensor")
        total += numel * value.element_size()
        if total > tensor_budget(file_size):
            raise UntrustedFileError(f"its tensors claim more than {tensor_budget(file_size)} bytes, out of "
                                     f"proportion to the file's {file_size}")


def config_state_shapes(cfg: dict, nc: int | None = None, ch: int = 3) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the state dict that model config ``cfg`` builds, found on the meta device (no memory)."""
    cfg = copy.deepcopy(cfg)
    if nc is not None:
        cfg["nc"] = nc
    with torch.device("meta"):
        layers, _, _ = parse_model(cfg, ch, str(cfg.get("yaml_file", "<dict>")))
    return {f"model.{name}": tuple(t.shape) for name, t in layers.state_dict().items()}


def check_state_fits(expected: dict[str, tuple[int, ...]], state: dict) -> None:
    """Refuse ``state`` unless it holds exactly the tensors ``expected`` names, each of the expected shape."""
    for name, tensor in state.items():
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None
        if shape is None:
            raise UntrustedFileError(f"{name} is a {type(tensor).__name__}, not a tensor")
        if name not in expected:
            raise UntrustedFileError(f"tensor {name} {shape} has no place in the model its yaml builds")
        if shape != expected[name]:
            raise UntrustedFileError(f"tensor {name} is {shape} in the file but {expected[name]} in the model its "
                                     "yaml builds")
    missing = [name for name in expected if name not in state]
    if missing:
        raise UntrustedFileError(f"tensor {missing[0]} {expected[missing[0]]} is missing from the file")


def check_config_against_state(cfg: Any, state: Any, nc: int | None = None, ch: int = 3) -> None:
    """Before building: the model config is within bounds and its tensors are exactly those stored in the file."""
    if not isinstance(cfg, dict) or not isinstance(state, dict):
        raise UntrustedFileError("the model config must be a mapping and the weights a mapping of tensors")
    try:
        expected = config_state_shapes(cfg, nc, ch)
    except ModelConfigError as e:
        raise UntrustedFileError(f"the model it describes cannot be built here ({e})") from None
    except (RecursionError, MemoryError, TypeError, ValueError, RuntimeError, KeyError, IndexError) as e:
        raise UntrustedFileError(f"the model it describes cannot be built here ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None
    check_state_fits(expected, state)


def check_torchscript_trusted(path: str | Path, trusted: bool) -> None:
    """Refuse a TorchScript file unless the user vouches for it (``--trust-weights``): loading one runs the code it
    holds (its ``__setstate__`` methods run inside ``torch.jit.load`` and may, e.g., overwrite any file the user can
    write through ``torch.from_file(..., shared=True)``; tests/utils/weights/test_untrusted.py shows it)."""
    if not trusted:
        raise UntrustedFileError(f"{path} is a TorchScript file, and loading one runs the code stored in it (it can "
                                 "write files); pass --trust-weights only for a file you trust, or use the .pt")
