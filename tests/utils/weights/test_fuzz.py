"""A fuzzer for the weights readers: pickles assembled opcode by opcode from a fixed seed, in torch zip files.

Every case is loaded by the release reader (``read_records``) and by ``load_checkpoint`` (which routes model
pickles to the release reader and the rest to ``torch.load(weights_only=True)``). Each must load or be refused
with one line (CheckpointError), write nothing, and leave every allowed global's ``__defaults__``,
``__kwdefaults__`` and ``__dict__`` (and the modules they live in) exactly as they were.
"""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.utils.weights.pickles import (
    FALSE,
    NONE,
    TRUE,
    appends,
    build,
    dct,
    floats,
    glob,
    inst,
    lst,
    newobj,
    num,
    obj,
    program,
    reduce,
    setitem,
    storage,
    tensor,
    text,
    torch_zip,
    tup,
)
from utils.weights import safe_pickle
from utils.weights.checkpoint import CheckpointError, load_checkpoint
from utils.weights.release_reader import read_records

SEED, CASES = 20261201, 400
REFUSED = ["os.system", "builtins.eval", "builtins.setattr", "subprocess.call", "torch.load",
           "torch.save", "numpy.load", "functools.partial", "posix.remove", "models.common.conv", "builtins.type"]
RECORDS = ["models.yolo.Model", "models.common.Conv", "torch.nn.modules.conv.Conv2d", "argparse.Namespace"]
STATE_KEYS = ["__defaults__", "__kwdefaults__", "__dict__", "__code__", "__class__", "__setstate__", "x", "dtype"]


def allowed_names() -> list[str]:
    return sorted(safe_pickle.SafeUnpickler(b"", None, "", 0)._allowed)


def allowed_objects() -> dict[str, Any]:
    """Every real object behind the allow-list (the globals it names, its replacements) and the modules they are in."""
    found: dict[str, Any] = {}
    for name, stand_in in safe_pickle.SafeUnpickler(b"", None, "", 0)._allowed.items():
        module, _, attr = name.rpartition(".")
        try:
            imported = importlib.import_module(module)
            found[name], found[f"module {module}"] = getattr(imported, attr), imported
        except (ImportError, AttributeError):
            pass
        call = getattr(stand_in, "_call", None)
        found[f"replacement of {name}"] = getattr(call, "__func__", call)
    for cls in (safe_pickle.Record, safe_pickle._RecordType, safe_pickle._Allowed, safe_pickle.SafeUnpickler):
        found[cls.__name__] = cls
    found["module torch._utils"], found["module safe_pickle"] = torch._utils, safe_pickle
    return {k: v for k, v in found.items() if v is not None}


def snapshot(objects: dict[str, Any]) -> dict[str, tuple]:
    """What BUILD, SETITEM or attribute setting could change on each object, by identity."""
    out = {}
    for name, value in objects.items():
        attrs = getattr(value, "__dict__", None)
        kwdefaults = getattr(value, "__kwdefaults__", None)
        out[name] = (getattr(value, "__defaults__", None), dict(kwdefaults) if isinstance(kwdefaults, dict) else None,
                     {k: id(v) for k, v in attrs.items()} if attrs is not None else None)
    return out


class Fuzzer:
    """Random pickle fragments: leaves, calls of allowed and refused globals, BUILD/SETITEM/APPENDS on anything."""

    def __init__(self, rng: random.Random, allowed: list[str]) -> None:
        self.rng, self.names = rng, allowed + REFUSED + RECORDS

    def global_(self) -> bytes:
        module, _, name = self.rng.choice(self.names).rpartition(".")
        return glob(module, name)

    def tensor(self) -> bytes:
        r = self.rng
        if r.random() < 0.5:
            return tensor("0", 4, (2, 2), (2, 1))
        size = tuple(r.choice([0, 1, 2, 4, 3, 10 ** 9]) for _ in range(r.randint(0, 3)))
        stride = tuple(r.choice([0, 1, 2, 4, -1]) for _ in size)
        return tensor(r.choice(["0", "1", "../0"]), r.choice([4, 8, 0]), size, stride, r.choice([0, 3, 4]),
                      r.choice(["FloatStorage", "HalfStorage", "Storage"]))

    def leaf(self) -> bytes:
        r = self.rng
        return r.choice([lambda: num(r.randint(-5, 5)), lambda: text(r.choice(STATE_KEYS)), lambda: NONE,
                         lambda: TRUE, lambda: FALSE, lambda: lst(), lambda: dct(), self.tensor,
                         lambda: storage("0", 4, r.choice(["FloatStorage", "LongStorage"]),
                                         r.choice(["storage", "module"]))])()

    def state(self, depth: int) -> bytes:
        r = self.rng
        pairs = {r.choice(STATE_KEYS): self.value(depth - 1) for _ in range(r.randint(1, 3))}
        return r.choice([dct(pairs), tup(NONE, dct(pairs)), tup(dct(), dct(pairs)), self.value(depth - 1)])

    def args(self, depth: int) -> list[bytes]:
        return [self.value(depth - 1) for _ in range(self.rng.randint(0, 3))]

    def value(self, depth: int) -> bytes:
        r = self.rng
        if depth <= 0:
            return self.leaf()
        module, _, name = r.choice(self.names).rpartition(".")
        makers = [
            lambda: build(r.choice([self.global_, lambda: self.value(depth - 1)])(), self.state(depth)),
            lambda: reduce(self.global_(), tup(*self.args(depth))),
            lambda: inst(module, name, *self.args(depth)),
            lambda: obj(self.global_(), *self.args(depth)),
            lambda: newobj(self.global_(), tup(*self.args(depth))),
            lambda: setitem(r.choice([self.global_, lambda: self.value(depth - 1)])(), self.leaf(), self.leaf()),
            lambda: appends(r.choice([self.global_, lambda: self.value(depth - 1)])(), *self.args(depth)),
            lambda: dct({f"k{i}": self.value(depth - 1) for i in range(r.randint(0, 3))}),
            lambda: lst(*self.args(depth)),
            self.leaf,
        ]
        return r.choice(makers)()

    def file(self, path: Path) -> Path:
        top = {"payload": self.value(3), "w": tensor("0", 4, (4,), (1,))}
        if self.rng.random() < 0.5:  # a release-shaped file: load_checkpoint routes it to the restricted reader
            top["model"] = build(newobj(glob("models.yolo", "Model")), dct(yaml=self.value(2)))
        return torch_zip(path, program(dct(top)), {"0": floats(1.0, -2.0, 3.0, -4.0)})


def load_or_refuse(path: Path) -> None:
    for load in (read_records, load_checkpoint):
        try:
            load(path)
        except CheckpointError as e:
            assert "\n" not in str(e) and str(path) in str(e), str(e)


def test_fuzzed_pickles_load_harmlessly_or_are_refused_in_one_line(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    objects = allowed_objects()
    before = snapshot(objects)
    honest = torch_zip(tmp_path / "honest.pt", program(dct(w=tensor("0", 4, (4,), (1,)))),
                       {"0": floats(1.0, -2.0, 3.0, -4.0)})
    fuzzer = Fuzzer(random.Random(SEED), allowed_names())
    for case in range(CASES):
        path = fuzzer.file(tmp_path / f"case{case}.pt")
        load_or_refuse(path)
        path.unlink()
    assert snapshot(objects) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["honest.pt"]  # nothing written anywhere we can see
    assert torch.load(honest, weights_only=True)["w"].tolist() == [1.0, -2.0, 3.0, -4.0]
    assert read_records(honest)["w"].tolist() == [1.0, -2.0, 3.0, -4.0]


@pytest.mark.parametrize("target", allowed_names())
def test_every_allowed_global_as_build_target_is_refused_and_unchanged(tmp_path: Path, target: str) -> None:
    """BUILD with a dict state and with a slot state, SETITEM and APPENDS on each allowed global."""
    objects = allowed_objects()
    before = snapshot(objects)
    module, _, name = target.rpartition(".")
    changes = {"__defaults__": tup(num(-1)), "__kwdefaults__": dct(metadata=num(-1)), "flipped": TRUE}
    for attack in (build(glob(module, name), dct(changes)), build(glob(module, name), tup(NONE, dct(changes))),
                   setitem(glob(module, name), text("__defaults__"), tup(num(-1))),
                   appends(glob(module, name), num(-1))):
        path = torch_zip(tmp_path / "attack.pt", program(dct(model=newobj(glob("models.yolo", "Model")),
                                                             x=attack)))
        for load in (read_records, load_checkpoint):
            with pytest.raises(CheckpointError, match="refused|cannot be read"):
                load(path)
    assert snapshot(objects) == before
