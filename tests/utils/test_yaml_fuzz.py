"""A fuzzer for every YAML reader (issue 31, finding 6): random structure, deep nesting, huge numbers, aliases,
tags, byte damage and encodings (UTF-8/16/32, with and without BOM). Each document read by utils.safe_yaml and by
the data, hyp and model readers gives a value or one UserError line, never another exception. The work per
document is bounded by construction (a fixed number of documents of bounded size, and the readers' own bounds);
nothing here measures time."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from utils.errors import UserError
from utils.safe_yaml import load_yaml

KEYS = ["path", "train", "val", "test", "nc", "names", "convert", "lr0", "lrf", "momentum", "weight_decay", "box",
        "cls", "obj", "anchor_t", "anchors", "backbone", "head", "depth_multiple", "width_multiple", "<<", "?"]
SCALARS = ["0", "-1", "3", "80", "1e999", "-.inf", ".nan", "0x1F", "0o17", "1_000", "1" + "0" * 99, "0.01", "true",
           "null", "~", "2001-12-14t21:59:43.10-05:00", "'a\\nb'", '"\\u00e9"', "Conv", "nn.Upsample", "images/train",
           "../../etc", "/etc/passwd", "~/x", "a" * 300, "caf\u00e9", "!!binary aGVsbG8=", "!!set {a, b}",
           "!!omap [a: 1]", "!!float 3"]
ODD = ["9" * 4400, "1." + "0" * 5000, '"\\x00"', "\u202e\u0000", "\x0b", "!!python/object/apply:os.system [echo]",
       "*undefined", "&", "[", "{", "!!int x", "!!timestamp x", "? [a]", "{[a]: 1}"]


def _value(rng: random.Random, depth: int, anchors: list[str], odd: float) -> str:
    """A random YAML value in flow style (scalars, lists, mappings, anchors and aliases to earlier anchors); a
    scalar is one of the ODD ones (invalid, huge or unsafe) with probability ``odd``."""
    roll = rng.random()
    if anchors and roll < 0.15:
        return f"*{rng.choice(anchors)}"
    if depth <= 0 or roll < 0.45:
        return rng.choice(ODD if rng.random() < odd else SCALARS)
    if roll < 0.75:
        items = [_value(rng, depth - 1, anchors, odd) for _ in range(rng.randint(0, 6))]
        text = f"[{', '.join(items)}]"
    else:
        items = [f"{rng.choice(KEYS + SCALARS[:8])}: {_value(rng, depth - 1, anchors, odd)}"
                 for _ in range(rng.randint(0, 5))]
        text = f"{{{', '.join(items)}}}"
    if rng.random() < 0.3:
        name = f"a{len(anchors)}"
        anchors.append(name)
        return f"&{name} {text}"
    return text


def _document(rng: random.Random) -> str:
    """A random document: block mapping of flow values, sometimes an alias bomb, deep nesting or a merge key."""
    anchors: list[str] = []
    odd = rng.choice([0.0, 0.0, 0.02, 0.1])
    lines = [f"{rng.choice(KEYS)}: {_value(rng, rng.randint(0, 5), anchors, odd)}" for _ in range(rng.randint(1, 8))]
    kind = rng.random()
    if kind < 0.1:  # an alias bomb: 8 levels of 10
        lines += ["b0: &b0 [x, x, x, x, x, x, x, x, x, x]"] + [
            f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]" for i in range(1, 8)] + [f"{rng.choice(KEYS)}: *b7"]
    elif kind < 0.2:
        depth = rng.choice([63, 64, 65, 200, 5000])
        lines.append(f"{rng.choice(KEYS)}: {'[' * depth}{']' * depth}")
    elif kind < 0.3 and anchors:
        lines.append(f"merged: {{<<: *{rng.choice(anchors)}, nc: 1}}")
    return "\n".join(lines) + "\n"


def _damaged(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        where = rng.randrange(len(data) + 1)
        action = rng.random()
        if action < 0.4 and data:
            data[min(where, len(data) - 1)] = rng.randrange(256)
        elif action < 0.7:
            data[where:where] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        else:
            del data[where:where + rng.randint(1, 3)]
    return bytes(data)


ENCODINGS = [("utf-8", b""), ("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"),
             ("utf-32-le", b"\xff\xfe\x00\x00"), ("utf-32-be", b"\x00\x00\xfe\xff"), ("utf-16-le", b""),
             ("utf-32-be", b"")]


def _encoded(rng: random.Random, text: str) -> bytes:
    encoding, bom = rng.choice(ENCODINGS[:6]) if rng.random() < 0.8 else rng.choice(ENCODINGS)
    raw = bom + text.encode(encoding, errors="surrogatepass")
    return _damaged(rng, raw) if rng.random() < 0.15 else raw


def _one_line(read, path: Path) -> object:
    """``read(path)``: its value, or the UserError it raised (checked to be one line)."""
    try:
        return read(path)
    except UserError as e:
        assert "\n" not in str(e) and len(str(e)) < 2000, str(e)[:300]
        return e


def _readers(tmp_path: Path) -> dict:
    from models.yolo import Model
    from utils.data.config import load_data_config
    from utils.hyp import load_hyp

    return {"yaml": load_yaml, "data": load_data_config, "hyp": load_hyp, "model": Model}


@pytest.mark.parametrize("seed", range(4))
def test_every_yaml_reader_gives_a_value_or_one_line(seed: int, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    rng = random.Random(seed)
    readers = _readers(tmp_path)
    outcomes = {"value": 0, "error": 0, "mapping": 0}
    for i in range(60):
        path = tmp_path / f"doc{i}.yaml"
        path.write_bytes(_encoded(rng, _document(rng)))
        for name, read in readers.items():
            result = _one_line(read, path)
            if name == "yaml":
                outcomes["error" if isinstance(result, UserError) else "value"] += 1
                outcomes["mapping"] += isinstance(result, dict)
            if name == "yaml" and isinstance(result, UserError):
                break  # the others read it the same way: the same refusal
    assert min(outcomes.values()) >= 10, outcomes  # the fuzzer reaches both outcomes, and the other readers
