"""Pickles assembled opcode by opcode and wrapped in torch zip files laid out as torch writes them.

Each helper returns the bytes of one pickle fragment that pushes one value; they nest like the values they make,
so a crafted file reads like the object it describes: ``reduce(glob("os", "system"), tup(text("id")))``.
Nothing here unpickles anything.
"""

from __future__ import annotations

import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np

NONE, TRUE, FALSE = pickle.NONE, pickle.NEWTRUE, pickle.NEWFALSE


def glob(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def text(value: str) -> bytes:
    data = value.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def num(value: int | float) -> bytes:
    if isinstance(value, float):
        return pickle.BINFLOAT + struct.pack(">d", value)
    if -(2 ** 31) <= value < 2 ** 31:
        return pickle.BININT + struct.pack("<i", value)
    data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return pickle.LONG1 + bytes([len(data)]) + data


def tup(*items: bytes) -> bytes:
    return pickle.MARK + b"".join(items) + pickle.TUPLE


def lst(*items: bytes) -> bytes:
    return pickle.EMPTY_LIST + (pickle.MARK + b"".join(items) + pickle.APPENDS if items else b"")


def dct(pairs: dict[str, bytes] | None = None, **items: bytes) -> bytes:
    items = {**(pairs or {}), **items}
    body = b"".join(text(k) + v for k, v in items.items())
    return pickle.EMPTY_DICT + (pickle.MARK + body + pickle.SETITEMS if items else b"")


def reduce(func: bytes, args: bytes) -> bytes:
    return func + args + pickle.REDUCE


def build(target: bytes, state: bytes) -> bytes:
    return target + state + pickle.BUILD


def newobj(cls: bytes, args: bytes = b"") -> bytes:
    return cls + (args or tup()) + pickle.NEWOBJ


def inst(module: str, name: str, *args: bytes) -> bytes:
    return pickle.MARK + b"".join(args) + pickle.INST + f"{module}\n{name}\n".encode()


def obj(cls: bytes, *args: bytes) -> bytes:
    return pickle.MARK + cls + b"".join(args) + pickle.OBJ


def setitem(target: bytes, key: bytes, value: bytes) -> bytes:
    return target + key + value + pickle.SETITEM


def appends(target: bytes, *items: bytes) -> bytes:
    return target + pickle.MARK + b"".join(items) + pickle.APPENDS


def storage(key: str, numel: int, kind: str = "FloatStorage", typename: str = "storage") -> bytes:
    """A persistent id as torch writes it: ('storage', torch.<kind>, key, 'cpu', numel)."""
    return tup(text(typename), glob("torch", kind), text(key), text("cpu"), num(numel)) + pickle.BINPERSID


def tensor(key: str, numel: int, size: tuple[int, ...], stride: tuple[int, ...], offset: int = 0,
           kind: str = "FloatStorage") -> bytes:
    """``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())``."""
    return reduce(glob("torch._utils", "_rebuild_tensor_v2"),
                  tup(storage(key, numel, kind), num(offset), tup(*map(num, size)), tup(*map(num, stride)), FALSE,
                      reduce(glob("collections", "OrderedDict"), tup())))


def program(value: bytes) -> bytes:
    """A whole protocol-2 pickle of ``value``."""
    return pickle.PROTO + b"\x02" + value + pickle.STOP


def torch_zip(path: Path, pickled: bytes, storages: dict[str, bytes] | None = None, *,
              compress: bool = False) -> Path:
    """A torch zip file: ``archive/data.pkl``, ``archive/byteorder``, ``archive/data/<key>`` and ``archive/version``."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
        for key, data in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", data)
        archive.writestr("archive/version", "3\n")
    return path


def floats(*values: float) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()
