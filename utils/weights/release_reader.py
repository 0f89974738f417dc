"""Official YOLOv5 release weights (``yolov5{n,s,m,l,x}{,6}.pt`` of v5.0 ... v7.0) read without running pickled code.

The release files are torch zip pickles of whole ``models.yolo.Model`` / ``models.yolo.DetectionModel`` objects in
fp16. Unpickling them normally imports and calls whatever the file names. Here a restricted unpickler resolves only
torch's tensor rebuild functions and a few plain containers; every class of the model namespaces (``models.*``,
``torch.nn.modules.*``, ...) becomes an inert :class:`Record` that keeps its pickled state and is never imported or
called; any other global (``os.system``, ``builtins.eval``, ``subprocess.*``) is refused before it is resolved.
From the records we rebuild the flat state dict and the architecture (the model's ``yaml`` dict), build our own
``models.yolo.Model``, load every tensor strictly and return a checkpoint in this project's format.
"""

from __future__ import annotations

import collections
import pickle
import pickletools
import re
import types
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from torch import nn

from models.yolo import Model, ModelConfigError
from utils.weights.checkpoint import CheckpointError, new_checkpoint, to_plain

RELEASE_SOURCE = "yolov5-release"
MODEL_CLASSES = ("models.yolo.Model", "models.yolo.DetectionModel")  # v5.0/v6.x and v7.0 detection models
RELEASE_MARKERS = ("models.yolo.", "models.common.")  # globals that make a file a reference-format pickle
# Classes of these namespaces become inert records; globals anywhere else are refused unless allowed below.
RECORD_NAMESPACES = ("models.", "utils.", "torch.nn.modules.", "argparse.Namespace")
_LEGACY_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}  # protocol-2 names of Python 2 modules


class UnsafeGlobalError(pickle.UnpicklingError):
    """The pickle asked for a global that may run code; nothing it names was imported or called."""

    def __init__(self, name: str, how: str) -> None:
        super().__init__(f"{how} {name}")
        self.name, self.how = name, how


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


# ------------------------------------------------------------------------------------------ safe replacements
def _encode_bytes(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode``, which protocol-2 pickles use for bytes; only the latin-1 form is accepted."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafeGlobalError("_codecs.encode", "it asks for an unusual encoding with")
    return text.encode("latin1")


def _numpy_dtype(code: Any, align: bool = False, copy_: bool = True) -> np.dtype:
    """``numpy.dtype`` for a plain type code ('f8', 'i4', ...), as numpy scalars in old checkpoints pickle it."""
    if not isinstance(code, str) or not re.fullmatch(r"[<>|=]?[a-zA-Z]\d*", code):
        raise UnsafeGlobalError("numpy.dtype", "it asks for an unusual dtype with")
    return np.dtype(code)


def _numpy_scalar(dtype: Any, data: Any = b"") -> Any:
    """``numpy.core.multiarray.scalar``: a numeric scalar from its raw bytes, as a plain Python number."""
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biuf" or not isinstance(data, (bytes, bytearray)):
        raise UnsafeGlobalError("numpy.core.multiarray.scalar", "it asks for a non-numeric scalar with")
    return np.frombuffer(bytes(data), dtype=dtype, count=1)[0].item()


_NDARRAY = _RecordType("ndarray", (Record,), {"global_name": "numpy.ndarray", "__module__": __name__})


def _numpy_reconstruct(cls: Any, shape: Any = (0,), typecode: Any = b"b") -> np.ndarray:
    """``numpy.core.multiarray._reconstruct``: an empty array that pickle's BUILD then fills (v5.0 best_fitness)."""
    if cls is not _NDARRAY:
        raise UnsafeGlobalError("numpy.core.multiarray._reconstruct", f"it asks to rebuild {cls!r} with")
    return np.empty(0, dtype=np.uint8)


def _path_string(*parts: Any) -> str:
    """pathlib paths (options of the reference hold some) become plain strings."""
    if not all(isinstance(p, str) for p in parts):
        raise UnsafeGlobalError("pathlib.Path", "it asks for a path of non-strings with")
    return str(PurePosixPath(*parts))


def _reconstructor(cls: Any, base: Any, state: Any = None) -> Record:
    """``copyreg._reconstructor`` (protocol 0/1 objects): only for record classes, built inertly."""
    if not (isinstance(cls, type) and issubclass(cls, Record)) or base is not object:
        raise UnsafeGlobalError("copyreg._reconstructor", f"it asks to rebuild {cls!r} with")
    return cls.__new__(cls)


def _allowed_globals() -> dict[str, Any]:
    """Everything the unpickler may resolve and call: tensor rebuilding, plain containers, inert converters."""
    allowed: dict[str, Any] = {
        "torch._utils._rebuild_tensor_v2": torch._utils._rebuild_tensor_v2,
        "torch._utils._rebuild_parameter": torch._utils._rebuild_parameter,
        "torch._utils._rebuild_parameter_with_state": torch._utils._rebuild_parameter_with_state,
        "collections.OrderedDict": collections.OrderedDict,
        "builtins.set": set, "builtins.frozenset": frozenset, "builtins.slice": slice, "builtins.complex": complex,
        "torch.Size": torch.Size, "torch.device": torch.device,
        "_codecs.encode": _encode_bytes, "copyreg._reconstructor": _reconstructor,
        "numpy.dtype": _numpy_dtype, "numpy.core.multiarray.scalar": _numpy_scalar,
        "numpy._core.multiarray.scalar": _numpy_scalar, "numpy.ndarray": _NDARRAY,
        "numpy.core.multiarray._reconstruct": _numpy_reconstruct,
        "numpy._core.multiarray._reconstruct": _numpy_reconstruct,
    }
    if hasattr(torch._utils, "_rebuild_tensor_v3"):
        allowed["torch._utils._rebuild_tensor_v3"] = torch._utils._rebuild_tensor_v3
    for cls in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
        allowed[f"pathlib.{cls}"] = _path_string
    for value in vars(torch).values():  # torch.float16 and friends are plain constants
        if isinstance(value, torch.dtype):
            allowed[str(value)] = value
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only :func:`_allowed_globals`; classes of :data:`RECORD_NAMESPACES` become inert records."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._allowed = _allowed_globals()
        self._records: dict[str, type[Record]] = {}

    def find_class(self, module: str, name: str) -> Any:
        module = _LEGACY_MODULES.get(module, module)
        full = f"{module}.{name}"
        if full in self._allowed:
            return self._allowed[full]
        if full.startswith(RECORD_NAMESPACES) and re.fullmatch(r"[A-Za-z_]\w*", name) and name[0].isupper():
            if full not in self._records:
                self._records[full] = _RecordType(name, (Record,), {"global_name": full, "__module__": __name__})
            return self._records[full]
        raise UnsafeGlobalError(full, "it asks for")


def _pickle_module() -> types.ModuleType:
    """A module-like object that hands :class:`RestrictedUnpickler` to torch's zip reader."""
    module = types.ModuleType("yolo_restricted_pickle")
    module.Unpickler = RestrictedUnpickler  # type: ignore[attr-defined]
    module.load = None  # type: ignore[attr-defined]  # legacy (non-zip) files are refused before reaching torch
    return module


# ------------------------------------------------------------------------------------------ reading the file
def pickle_globals(path: str | Path) -> list[str]:
    """The globals (``module.name``) a torch zip file's data.pkl names, found by reading opcodes, never by running."""
    try:
        with zipfile.ZipFile(path) as archive:
            member = next((n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") <= 1), None)
            data = archive.read(member) if member else b""
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError):
        return []
    found, last, stack, memo = [], None, [], {}
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("GLOBAL", "INST"):
                found.append(str(arg).replace(" ", "."))
            elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
                last = arg
                stack.append(arg)
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                memo[arg if op.name != "MEMOIZE" else len(memo)] = last
            elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                last = memo.get(arg)
                stack.append(last)
            elif op.name == "STACK_GLOBAL" and len(stack) >= 2:
                found.append(f"{stack[-2]}.{stack[-1]}")
            else:
                last = None
    except (ValueError, EOFError):  # a damaged pickle: report what was read so far
        pass
    return list(dict.fromkeys(_normalise_global(g) for g in found))


def _normalise_global(name: str) -> str:
    module, _, rest = name.partition(".")
    return f"{_LEGACY_MODULES.get(module, module)}.{rest}"


def is_release_file(path: str | Path) -> bool:
    """True when ``path`` pickles classes of the reference YOLOv5 (``models.yolo.*`` / ``models.common.*``)."""
    return any(g.startswith(RELEASE_MARKERS) for g in pickle_globals(path))


def read_records(path: str | Path) -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler`: tensors are real, every object of a class is a Record.

    Raises CheckpointError (one line, naming the file and the global) for anything outside the allow-list.
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path} is not a PyTorch zip file; only zip-format release files can be read safely")
    with zipfile.ZipFile(path) as archive:
        if any(name.endswith("constants.pkl") for name in archive.namelist()):  # torch.load would hand it to jit
            raise CheckpointError(f"{path} is a TorchScript archive, not a release checkpoint; run it with detect.py")
    try:
        return torch.load(path, map_location="cpu", pickle_module=_pickle_module(), weights_only=False)
    except UnsafeGlobalError as e:
        raise CheckpointError(f"{path}: refused: {e.how} {e.name}, which is not a tensor rebuild function or a known "
                              "model class; nothing from the file was run") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError,
            KeyError, IndexError) as e:
        raise CheckpointError(f"{path} cannot be read as a YOLOv5 release file ({str(e).splitlines()[0][:200]})") \
            from None


# ------------------------------------------------------------------------------------------ records -> our model
class _FormatError(ValueError):
    """The records do not describe a model we can build; converted to a CheckpointError naming the file."""


# Constructor settings that change the output without changing any tensor's shape, compared module by module.
_SETTINGS = {
    "Conv2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"),
    "MaxPool2d": ("kernel_size", "stride", "padding", "dilation", "ceil_mode"),
    "Upsample": ("scale_factor", "mode"),
    "BatchNorm2d": ("eps",),
    "Bottleneck": ("add",),
    "Concat": ("d",),
    "Detect": ("nc", "na", "nl"),
}
_CLASS_ALIASES = {"DetectionModel": "Model"}  # v7.0's name for the same detection model


def load_release_checkpoint(path: str | Path) -> dict:
    """Read an official YOLOv5 release file safely and return it as a checkpoint of this project (float32).

    The result is what :func:`utils.weights.checkpoint.new_checkpoint` makes, with the file's class ``names``,
    ``source: "yolov5-release"`` and ``release`` (model class, date, git, epoch, the reference's options).
    """
    return convert_records(read_records(path), path)


def convert_records(raw: Any, path: str | Path = "<records>") -> dict:
    """The checkpoint of this project for what :func:`read_records` returned; CheckpointError when it does not map."""
    try:
        record = model_record(raw)
        model = release_model(record)
    except _FormatError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except ModelConfigError as e:
        raise CheckpointError(f"{path}: the model it describes cannot be built here ({e})") from None
    info = {"model_class": record.global_name, "epoch": _plain(raw.get("epoch")), "date": _plain(raw.get("date")),
            "git": _plain(raw.get("git")), "opt": _plain(raw.get("opt") or {})}
    return new_checkpoint(model, epoch=-1, source=RELEASE_SOURCE, release=info)


def model_record(raw: Any) -> Record:
    """The pickled detection model of a release file (its EMA when the file has one, as the reference loads it)."""
    if not isinstance(raw, dict):
        raise _FormatError(f"expected a dict with a 'model' entry, found a {type(raw).__name__}")
    record = raw.get("ema") if isinstance(raw.get("ema"), Record) else raw.get("model")
    if not isinstance(record, Record):
        raise _FormatError(f"no pickled model under 'model' or 'ema' (keys: {sorted(map(str, raw))[:8]})")
    if record.global_name not in MODEL_CLASSES:
        raise _FormatError(f"holds a {record.global_name}; only YOLOv5 detection models "
                           f"({' or '.join(MODEL_CLASSES)}) can be loaded")
    return record


def release_model(record: Record) -> Model:
    """Our Model built from the record's ``yaml``, checked module by module, holding every tensor of the file."""
    state = flat_state(record)
    layers = _child(record, "model")
    detect_index = list(_children(layers))[-1]
    detect, prefix = _children(layers)[detect_index], f"model.{detect_index}."
    stride = detect.attrs.get("stride", record.attrs.get("stride"))
    if not isinstance(stride, torch.Tensor) or prefix + "anchors" not in state:
        raise _FormatError(f"the last layer ({detect.global_name}) has no stride or anchors")
    stride = stride.detach().float().view(-1)
    anchors = state.pop(prefix + "anchors").float() * stride.view(-1, 1, 1)  # grid units -> input pixels
    anchor_grid = state.pop(prefix + "anchor_grid", None)  # v5.0 also kept (and decoded with) pixel anchors
    if anchor_grid is not None:
        if anchor_grid.numel() != anchors.numel() or not torch.allclose(
                anchor_grid.float().reshape(anchors.shape), anchors, rtol=4e-3, atol=0.05):
            raise _FormatError(f"{prefix}anchor_grid disagrees with {prefix}anchors x stride")
        anchors = anchor_grid.float().reshape(anchors.shape)  # fp16-rounded in pixels, as v5.0 used them
    state[prefix + "anchors"], state[prefix + "stride"] = anchors, stride
    model = Model(release_config(record, detect, anchors), ch=int(record.attrs.get("yaml", {}).get("ch", 3)))
    if not torch.equal(model.stride.float(), stride):
        raise _FormatError(f"strides {stride.tolist()} in the file but {model.stride.tolist()} for its yaml")
    check_structure(record, model)
    load_exact(model, state)
    model.names = release_names(record, model.nc)
    return model


def release_config(record: Record, detect: Record, anchors: torch.Tensor) -> dict:
    """The model YAML dict of the file, with the anchors it was trained with (pixels) and its class count."""
    cfg = record.attrs.get("yaml")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("backbone"), list) or not isinstance(cfg.get("head"), list):
        raise _FormatError(f"the {record.global_name} has no model yaml (backbone/head rows)")
    cfg = _plain(cfg)
    cfg["anchors"] = [[int(v) if float(v).is_integer() else float(v) for v in level.flatten().tolist()]
                      for level in anchors]
    if isinstance(detect.attrs.get("nc"), int):
        cfg["nc"] = detect.attrs["nc"]
    cfg["yaml_file"] = str(record.attrs.get("yaml_file") or cfg.get("yaml_file") or "yolov5-release.yaml")
    return cfg


def release_names(record: Record, nc: int) -> list[str]:
    """Class names as the file stores them (a list, or a dict keyed 0..nc-1); numbers when absent or malformed."""
    names = record.attrs.get("names")
    if isinstance(names, dict):
        names = [names.get(i, names.get(str(i))) for i in range(nc)]
    if isinstance(names, (list, tuple)) and len(names) == nc and all(isinstance(n, (str, int)) for n in names):
        return [str(n) for n in names]
    return [str(i) for i in range(nc)]


def flat_state(record: Record, prefix: str = "", depth: int = 0) -> dict[str, torch.Tensor]:
    """What ``nn.Module.state_dict()`` gives for the pickled module tree: parameters, persistent buffers, children."""
    if depth > 64:
        raise _FormatError(f"module tree nested deeper than 64 levels at {prefix!r}")
    attrs, state = record.attrs, {}
    non_persistent = attrs.get("_non_persistent_buffers_set") or set()
    for group in ("_parameters", "_buffers"):
        for name, tensor in (attrs.get(group) or {}).items():
            if tensor is None or (group == "_buffers" and name in non_persistent):
                continue
            if not isinstance(tensor, torch.Tensor):
                raise _FormatError(f"{prefix}{name} is a {type(tensor).__name__}, not a tensor")
            state[prefix + str(name)] = tensor.detach()
    for name, child in _children(record).items():
        state.update(flat_state(child, f"{prefix}{name}.", depth + 1))
    return state


def check_structure(record: Record, module: nn.Module, where: str = "model") -> None:
    """Same classes, same children and same shape-free settings (strides, padding, pooling, shortcuts) everywhere."""
    ours = type(module).__name__
    if _CLASS_ALIASES.get(record.class_name, record.class_name) != ours:
        raise _FormatError(f"{where} is a {record.global_name} in the file but a {ours} in the model its yaml builds")
    for setting in _SETTINGS.get(ours, ()):
        if setting in record.attrs and _comparable(record.attrs[setting]) != _comparable(getattr(module, setting)):
            raise _FormatError(f"{where}.{setting} is {record.attrs[setting]!r} in the file but "
                               f"{getattr(module, setting)!r} in the model its yaml builds")
    theirs, mine = _children(record), dict(module.named_children())
    if list(theirs) != list(mine):
        raise _FormatError(f"{where} has children {list(theirs)} in the file but {list(mine)} in the model")
    for name, child in theirs.items():
        check_structure(child, mine[name], f"{where}.{name}")


def load_exact(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load ``state`` into ``model`` tensor for tensor (names and shapes must match exactly), as float32."""
    own = model.state_dict()
    for name, tensor in state.items():
        if name not in own:
            raise _FormatError(f"tensor {name} {tuple(tensor.shape)} has no place in the model its yaml builds")
        if tensor.shape != own[name].shape:
            raise _FormatError(f"tensor {name} is {tuple(tensor.shape)} in the file but {tuple(own[name].shape)} "
                               "in the model its yaml builds")
    missing = [name for name in own if name not in state]
    if missing:
        raise _FormatError(f"tensor {missing[0]} {tuple(own[missing[0]].shape)} is missing from the file")
    model.load_state_dict({k: v.float() if v.is_floating_point() else v.to(own[k].dtype) for k, v in state.items()})
    if hasattr(model, "detect"):
        model.detect.clear_grid_cache()


def _children(record: Record) -> dict[str, Record]:
    children = {}
    for name, child in (record.attrs.get("_modules") or {}).items():
        if child is None:
            continue
        if not isinstance(child, Record):
            raise _FormatError(f"child {name!r} of {record.global_name} is a {type(child).__name__}, not a module")
        children[str(name)] = child
    return children


def _child(record: Record, name: str) -> Record:
    child = _children(record).get(name)
    if child is None or not _children(child):
        raise _FormatError(f"the {record.global_name} has no '{name}' layers")
    return child


def _comparable(value: Any) -> Any:
    """Settings as plain comparable values: ints and floats alike, tuples and lists alike."""
    if isinstance(value, (list, tuple)):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def _plain(obj: Any) -> Any:
    """Records -> their attribute dicts, then everything as plain types that ``weights_only`` loading accepts."""
    if isinstance(obj, Record):
        return _plain({k: v for k, v in obj.attrs.items() if not str(k).startswith("_")})
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.detach().float().cpu().clone() if obj.is_floating_point() else obj.detach().cpu().clone()
    return to_plain(obj)
