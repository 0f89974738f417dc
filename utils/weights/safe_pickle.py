"""A torch zip file read with a restricted unpickler that cannot run, import or change anything.

Pickle's opcodes can call what ``find_class`` returns (REDUCE, INST, OBJ, NEWOBJ) and change an object on the stack
(BUILD sets attributes or ``__setstate__``; SETITEM(S), APPEND(S), ADDITEMS call its methods). So ``find_class``
never returns a real function or class: an allowed global becomes a fresh call-only stand-in that checks its
arguments, a class of the model namespaces becomes an inert :class:`Record` class made for this load, anything
else is refused. BUILD is applied only to records made in this load; the container opcodes only to plain dicts,
lists and sets. Storages are read from the zip by this module (stored members whose size matches the element
count), and every tensor is a checked, non-overlapping view inside its storage; all tensors together stay within
a budget tied to the file's size. The process is left exactly as it was, whether the file loads or is refused.
"""

from __future__ import annotations

import collections
import io
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from utils.weights.untrusted import UntrustedFileError, check_view, check_zip_members, tensor_budget

# Classes of these namespaces become inert records; globals anywhere else are refused unless allowed below.
RECORD_NAMESPACES = ("models.", "utils.", "ultralytics.", "torch.nn.modules.", "argparse.Namespace")
_LEGACY_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}  # protocol-2 names of Python 2 modules
STORAGE_DTYPES = {f"{name}Storage": dtype for name, dtype in (
    ("Half", torch.float16), ("Float", torch.float32), ("Double", torch.float64), ("BFloat16", torch.bfloat16),
    ("Long", torch.int64), ("Int", torch.int32), ("Short", torch.int16), ("Char", torch.int8),
    ("Byte", torch.uint8), ("Bool", torch.bool), ("Untyped", torch.uint8))}


class UnsafeGlobalError(pickle.UnpicklingError):
    """The pickle asked for something that may run code or change the process; nothing it named was run."""

    def __init__(self, name: str, how: str, why: str = "") -> None:
        super().__init__(f"{how} {name}{why}")
        self.name, self.how, self.why = name, how, why


class _RecordType(type):
    """Metaclass of the stand-ins: calling one (pickle REDUCE/INST/OBJ) is refused, only NEWOBJ may create one."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise UnsafeGlobalError(cls.global_name, "it asks to call")


class Record(metaclass=_RecordType):
    """An inert stand-in for a pickled object of class ``global_name``: it stores its state, nothing else."""

    global_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Record:
        record = object.__new__(cls)
        record.__dict__["new_args"] = args
        record.__dict__["state"] = {}
        return record

    def __setstate__(self, state: Any) -> None:
        self.__dict__["state"] = state

    @property
    def attrs(self) -> dict:
        """The pickled instance attributes (a ``(dict, slots)`` state gives its dict part)."""
        state = self.__dict__["state"]
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
            state = state[0]
        return state if isinstance(state, dict) else {}

    @property
    def class_name(self) -> str:
        return self.global_name.rsplit(".", 1)[-1]

    def __repr__(self) -> str:
        return f"<record of {self.global_name}>"


def record_class(global_name: str) -> type[Record]:
    """A new record class for ``global_name`` (each load makes its own, so nothing is shared between loads)."""
    return _RecordType(global_name.rsplit(".", 1)[-1], (Record,), {"global_name": global_name, "__module__": __name__})


class _Allowed:
    """What pickle gets for an allowed global: a call-only stand-in with no attributes to set or state to build."""

    __slots__ = ("name", "_call")

    def __init__(self, name: str, call: Callable[..., Any]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_call", call)

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)

    def __setattr__(self, key: str, value: Any) -> None:
        raise UnsafeGlobalError(self.name, "it asks to change")

    def __repr__(self) -> str:
        return f"<allowed {self.name}>"


class _Storage:
    """A storage read from the zip: a flat tensor of its dtype (never handed to torch's own loader)."""

    __slots__ = ("flat", "key")

    def __init__(self, flat: torch.Tensor, key: str) -> None:
        self.flat, self.key = flat, key


class SafeUnpickler(pickle._Unpickler):
    """The pure-Python unpickler with a restricted ``find_class`` and the opcodes that change objects guarded."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, budget: int) -> None:
        super().__init__(io.BytesIO(data))
        self._archive, self._prefix, self._budget = archive, prefix, budget
        self._storages: dict[str, _Storage] = {}
        self._records: dict[str, type[Record]] = {}
        self._made_types: set[type] = set()  # record classes of this load: the only ones BUILD applies to
        self._allowed = self._allowed_globals()

    # ----------------------------------------------------------------------------------------- globals
    def find_class(self, module: str, name: str) -> Any:
        module = _LEGACY_MODULES.get(module, module)
        full = f"{module}.{name}"
        if full in self._allowed:
            return self._allowed[full]
        if module == "torch" and name in STORAGE_DTYPES:  # a storage type: only persistent ids may name it
            return _Allowed(full, _refuse_call(full))
        if full.startswith(RECORD_NAMESPACES) and re.fullmatch(r"[A-Za-z_]\w*", name) and name[0].isupper():
            return self._record_type(full)
        raise UnsafeGlobalError(full, "it asks for", ", which is not a tensor rebuild function, a plain container or a "
                                "known model class")

    def _record_type(self, full: str) -> type[Record]:
        if full not in self._records:
            self._records[full] = record_class(full)
            self._made_types.add(self._records[full])
        return self._records[full]

    def _allowed_globals(self) -> dict[str, Any]:
        """Everything the file may name: tensor rebuilding, plain containers, inert converters, torch dtypes."""
        calls: dict[str, Callable[..., Any]] = {
            "torch._utils._rebuild_tensor_v2": self._rebuild_tensor,
            "torch._utils._rebuild_tensor_v3": self._rebuild_v3,
            "torch._utils._rebuild_parameter": self._rebuild_parameter,
            "torch._utils._rebuild_parameter_with_state": self._rebuild_parameter,
            "collections.OrderedDict": _ordered_dict, "builtins.set": _plain_set(set),
            "builtins.frozenset": _plain_set(frozenset), "builtins.slice": _numbers(slice),
            "builtins.complex": _numbers(complex), "torch.Size": _size, "torch.device": _device,
            "_codecs.encode": _encode_bytes, "copyreg._reconstructor": self._reconstructor,
            "builtins.getattr": self._class_attribute,
            "numpy.dtype": self._numpy_dtype, "numpy.core.multiarray.scalar": _numpy_scalar,
            "numpy._core.multiarray.scalar": _numpy_scalar, "numpy.core.multiarray._reconstruct": self._reconstruct,
            "numpy._core.multiarray._reconstruct": self._reconstruct,
        }
        calls.update({f"pathlib.{cls}": _path_string for cls in ("Path", "PosixPath", "WindowsPath", "PurePath",
                                                                  "PurePosixPath", "PureWindowsPath")})
        allowed: dict[str, Any] = {name: _Allowed(name, call) for name, call in calls.items()}
        allowed["numpy.ndarray"] = self._record_type("numpy.ndarray")
        for value in vars(torch).values():  # torch.float16 and friends: constants that pickle cannot change
            if isinstance(value, torch.dtype):
                allowed[str(value)] = value
        return allowed

    # ----------------------------------------------------------------------------------------- storages
    def persistent_load(self, pid: Any) -> _Storage:
        """``('storage', torch.<Type>Storage, key, location, numel)`` -> the member's bytes as a flat tensor."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise UntrustedFileError(f"a persistent id that is not a storage ({type(pid).__name__})")
        _, storage_type, key, _location, numel = pid
        if not (isinstance(storage_type, _Allowed) and storage_type.name.startswith("torch.")
                and storage_type.name[6:] in STORAGE_DTYPES):
            raise UntrustedFileError(f"storage of unknown type ({_describe(storage_type)})")
        if not (isinstance(key, str) and re.fullmatch(r"\w{1,64}", key) and isinstance(numel, int) and numel >= 0):
            raise UntrustedFileError(f"storage id {str(key)[:40]!r} with {str(numel)[:40]} elements is malformed")
        dtype = STORAGE_DTYPES[storage_type.name[6:]]
        if key in self._storages:
            storage = self._storages[key]
            if storage.flat.dtype != dtype or storage.flat.numel() != numel:
                raise UntrustedFileError(f"storage {key} is used with two different types or sizes")
            return storage
        name = f"{self._prefix}data/{key}"
        try:
            info = self._archive.getinfo(name)
        except KeyError:
            raise UntrustedFileError(f"storage {key} is missing from the zip") from None
        element = torch.empty((), dtype=dtype).element_size()
        if info.file_size != numel * element:
            raise UntrustedFileError(f"storage {key} claims {numel} elements ({numel * element} bytes) but holds "
                                     f"{info.file_size} bytes")
        data = bytearray(self._archive.read(name))
        flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        self._storages[key] = storage = _Storage(flat, key)
        return storage

    def _rebuild_tensor(self, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                        hooks: Any = None, metadata: Any = None) -> torch.Tensor:
        """``torch._utils._rebuild_tensor_v2``: a checked view of a storage of this file (no hooks, no metadata)."""
        if not isinstance(storage, _Storage):
            raise UntrustedFileError(f"a tensor rebuilt from a {type(storage).__name__}, not a storage of the file")
        if hooks or metadata or not isinstance(requires_grad, bool):
            raise UntrustedFileError("a tensor with backward hooks or metadata")
        numel = check_view(size, stride, offset, storage.flat.numel(), f"tensor of storage {storage.key}")
        self._budget -= numel * storage.flat.element_size()
        if self._budget < 0:
            raise UntrustedFileError("its tensors claim more bytes than the file could hold")
        return torch.as_strided(storage.flat, tuple(size), tuple(stride), offset)

    def _rebuild_v3(self, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any,
                    dtype: Any, metadata: Any = None) -> torch.Tensor:
        if not isinstance(storage, _Storage) or dtype != storage.flat.dtype:
            raise UntrustedFileError("a tensor whose dtype differs from its storage's")
        return self._rebuild_tensor(storage, offset, size, stride, requires_grad, hooks, metadata)

    def _rebuild_parameter(self, data: Any, requires_grad: Any, hooks: Any, state: Any = None) -> torch.Tensor:
        """Parameters come back as plain tensors of the file (their extra state must be empty)."""
        if not isinstance(data, torch.Tensor) or not isinstance(requires_grad, bool) or hooks or state:
            raise UntrustedFileError("a parameter that is not a plain tensor of the file")
        return data

    def _reconstructor(self, cls: Any, base: Any, state: Any = None) -> Record:
        """``copyreg._reconstructor`` (protocol 0/1 objects): only for record classes of this load, built inertly."""
        if cls not in self._made_types or base is not object or state is not None:
            raise UnsafeGlobalError("copyreg._reconstructor", f"it asks to rebuild {_describe(cls)} with")
        return cls.__new__(cls)

    def _class_attribute(self, cls: Any, name: Any) -> str:
        """``getattr(cls, name)`` where ``cls`` is a record class of this load (YOLOv5's Segment head keeps
        ``Detect.forward``): the attribute is never looked up; its dotted name stands for it."""
        if cls not in self._made_types or not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w{0,63}", name):
            raise UnsafeGlobalError("builtins.getattr", "it asks to call", f" on {_describe(cls)}")
        return f"{cls.global_name}.{name}"

    def _numpy_dtype(self, code: Any, align: Any = False, copy_: Any = True) -> Record:
        """``numpy.dtype('f8', ...)``: a record of the type code (its BUILD state is kept, never applied)."""
        if not isinstance(code, str) or not re.fullmatch(r"[<>|=]?[a-zA-Z]\d*", code):
            raise UnsafeGlobalError("numpy.dtype", "it asks for an unusual dtype with")
        kind = self._record_type("numpy.dtype")
        return kind.__new__(kind, code)

    def _reconstruct(self, cls: Any, shape: Any = (0,), typecode: Any = b"b") -> Record:
        """``numpy.core.multiarray._reconstruct(ndarray, ...)``: a record that BUILD fills; see :func:`numpy_array`."""
        if cls is not self._allowed["numpy.ndarray"]:
            raise UnsafeGlobalError("numpy.core.multiarray._reconstruct", f"it asks to rebuild {_describe(cls)} with")
        return cls.__new__(cls)

    # ----------------------------------------------------------------------------------------- guarded opcodes
    def load_build(self) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if type(target) not in self._made_types:
            raise UnsafeGlobalError(_describe(target), "it asks to set the state of",
                                    " (BUILD applies only to records of model classes)")
        target.__setstate__(state)

    def load_setitem(self) -> None:
        self._container(self.stack[-3], (dict, collections.OrderedDict), "SETITEM")
        super().load_setitem()

    def load_setitems(self) -> None:
        self._container(self._below_mark(), (dict, collections.OrderedDict), "SETITEMS")
        super().load_setitems()

    def load_append(self) -> None:
        self._container(self.stack[-2], (list,), "APPEND")
        super().load_append()

    def load_appends(self) -> None:
        self._container(self._below_mark(), (list,), "APPENDS")
        super().load_appends()

    def load_additems(self) -> None:
        self._container(self._below_mark(), (set,), "ADDITEMS")
        super().load_additems()

    def load_newobj(self) -> None:
        self._record_class_on_stack(-2)
        super().load_newobj()

    def load_newobj_ex(self) -> None:
        self._record_class_on_stack(-3)
        super().load_newobj_ex()

    def _below_mark(self) -> Any:
        """The object a MARK-delimited opcode changes: the top of the stack saved by its MARK."""
        if not self.metastack or not self.metastack[-1]:
            raise pickle.UnpicklingError("a MARK-delimited opcode without a target below its MARK")
        return self.metastack[-1][-1]

    def _container(self, target: Any, kinds: tuple[type, ...], opcode: str) -> None:
        if type(target) not in kinds:
            raise UnsafeGlobalError(_describe(target), f"it asks ({opcode}) to change",
                                    f" ({opcode} applies only to plain {' and '.join(k.__name__ for k in kinds)})")

    def _record_class_on_stack(self, index: int) -> None:
        cls = self.stack[index] if len(self.stack) >= -index else None
        if cls not in self._made_types:
            raise UnsafeGlobalError(_describe(cls), "it asks to create an instance of",
                                    " (only records of model classes are created)")

    for _op, _name in ((pickle.BUILD, "load_build"), (pickle.SETITEM, "load_setitem"),
                       (pickle.SETITEMS, "load_setitems"), (pickle.APPEND, "load_append"),
                       (pickle.APPENDS, "load_appends"), (pickle.ADDITEMS, "load_additems"),
                       (pickle.NEWOBJ, "load_newobj"), (pickle.NEWOBJ_EX, "load_newobj_ex")):
        dispatch[_op[0]] = locals()[_name]
    del _op, _name


# ------------------------------------------------------------------------------------------ safe replacements
def _describe(value: Any) -> str:
    """A short name for what a refused opcode targets: the allowed global's name, or the type of the value."""
    if isinstance(value, _Allowed):
        return value.name
    if isinstance(value, (Record, _RecordType)):
        return f"a record of {value.global_name}"
    return f"a {type(value).__name__}"


def _refuse_call(name: str) -> Callable[..., Any]:
    def refuse(*args: Any) -> Any:
        raise UnsafeGlobalError(name, "it asks to call")
    return refuse


def _ordered_dict(*args: Any) -> collections.OrderedDict:
    """``OrderedDict()`` or ``OrderedDict([(key, value), ...])`` of plain pairs."""
    if args and not (len(args) == 1 and isinstance(args[0], list) and all(isinstance(p, tuple) and len(p) == 2
                                                                         for p in args[0])):
        raise UnsafeGlobalError("collections.OrderedDict", "it asks for an unusual")
    return collections.OrderedDict(*args)


def _plain_set(kind: type) -> Callable[..., Any]:
    def make(items: Any = ()) -> Any:
        if not isinstance(items, (list, tuple)):
            raise UnsafeGlobalError(f"builtins.{kind.__name__}", "it asks for an unusual")
        return kind(items)
    return make


def _numbers(kind: type) -> Callable[..., Any]:
    def make(*args: Any) -> Any:
        if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in args):
            raise UnsafeGlobalError(f"builtins.{kind.__name__}", "it asks for a non-numeric")
        return kind(*args)
    return make


def _size(dims: Any = ()) -> torch.Size:
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise UnsafeGlobalError("torch.Size", "it asks for a non-integer")
    return torch.Size(dims)


def _device(kind: Any, index: Any = None) -> str:
    if not isinstance(kind, str) or not (index is None or isinstance(index, int)):
        raise UnsafeGlobalError("torch.device", "it asks for an unusual")
    return kind if index is None else f"{kind}:{index}"


def _encode_bytes(text: Any, encoding: Any = "latin1") -> bytes:
    """``_codecs.encode``, which protocol-2 pickles use for bytes; only the latin-1 form is accepted."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafeGlobalError("_codecs.encode", "it asks for an unusual encoding with")
    return text.encode("latin1")


def _dtype_of(record: Any) -> np.dtype:
    """The numpy dtype a ``numpy.dtype`` record stands for (a numeric type in either byte order)."""
    if not (isinstance(record, Record) and record.global_name == "numpy.dtype"):
        raise UnsafeGlobalError(_describe(record), "it asks for a numpy value of dtype")
    state = record.__dict__["state"]
    order = state[1] if isinstance(state, tuple) and len(state) > 1 and state[1] in ("<", ">", "|", "=") else "="
    dtype = np.dtype(record.new_args[0])
    if dtype.kind not in "biuf":
        raise UnsafeGlobalError("numpy.dtype", "it asks for a non-numeric dtype with")
    return dtype.newbyteorder(order) if order in "<>" else dtype


def _numpy_scalar(dtype: Any, data: Any = b"") -> Any:
    """``numpy.core.multiarray.scalar``: a numeric scalar from its raw bytes, as a plain Python number."""
    dtype = _dtype_of(dtype)
    if not isinstance(data, (bytes, bytearray)) or len(data) != dtype.itemsize:
        raise UnsafeGlobalError("numpy.core.multiarray.scalar", "it asks for a malformed scalar with")
    return np.frombuffer(bytes(data), dtype=dtype, count=1)[0].item()


def numpy_array(record: Record) -> np.ndarray:
    """The numpy array an ``ndarray`` record's state describes ``(version, shape, dtype, fortran, bytes)``."""
    state = record.__dict__["state"]
    if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[1], tuple)
            and all(isinstance(d, int) and d >= 0 for d in state[1]) and isinstance(state[4], (bytes, bytearray))):
        raise UntrustedFileError("a numpy array with a malformed state")
    dtype = _dtype_of(state[2])
    count = int(np.prod(state[1], dtype=object))
    if count * dtype.itemsize != len(state[4]):
        raise UntrustedFileError(f"a numpy array of shape {state[1]} with {len(state[4])} bytes")
    return np.frombuffer(bytes(state[4]), dtype=dtype).reshape(state[1], order="F" if state[3] else "C").copy()


def _path_string(*parts: Any) -> str:
    """pathlib paths (options of the reference hold some) become plain strings."""
    if not all(isinstance(p, str) for p in parts):
        raise UnsafeGlobalError("pathlib.Path", "it asks for a path of non-strings with")
    return str(PurePosixPath(*parts))


# ------------------------------------------------------------------------------------------ reading a file
def data_pickle_name(names: list[str]) -> str:
    """The one ``<folder>/data.pkl`` member of a torch zip file."""
    found = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(found) != 1:
        raise UntrustedFileError(f"{len(found)} data.pkl members at the top folder (a torch file has one)")
    return found[0]


def safe_load(path: str | Path) -> Any:
    """Unpickle a torch zip file with :class:`SafeUnpickler`: tensors are checked views, objects are Records.

    Raises UnsafeGlobalError for a global or an opcode that could run code or change the process, and
    UntrustedFileError for a file that breaks a rule of :mod:`utils.weights.untrusted`.
    """
    path = Path(path)
    members = check_zip_members(path)
    names = [m.filename for m in members]
    pickle_name = data_pickle_name(names)
    prefix = pickle_name[: -len("data.pkl")]
    with zipfile.ZipFile(path) as archive:
        byteorder = archive.read(f"{prefix}byteorder").decode(errors="replace") if f"{prefix}byteorder" in names \
            else "little"
        if byteorder != "little":
            raise UntrustedFileError(f"tensors stored {byteorder}-endian; only little-endian files are read")
        unpickler = SafeUnpickler(archive.read(pickle_name), archive, prefix, tensor_budget(path.stat().st_size))
        return unpickler.load()
