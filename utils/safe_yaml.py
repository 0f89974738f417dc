"""The one YAML reader for files that may come from strangers (data, hyp, model and export-metadata YAMLs).

``yaml.safe_load`` runs no code, but it lets a 500-byte file describe 10^8 values through aliases (each alias is
the same object again, so a later ``str()`` or deep copy walks them all), nest thousands of levels (a
RecursionError), or hold an integer of a million digits (Python's digit limit raises ValueError inside the
constructor). Here the document's node graph is composed first and measured before anything is built: its size
with every alias expanded (in values and in characters), its depth and each scalar's length are bounded, recursive
aliases are refused, and every failure is one ``YamlError`` line naming the file. Files are UTF-8 (a BOM allowed),
or UTF-16 / UTF-32 with their BOM. ``shown(value)`` describes a value read from such a file for an error message
without turning a large one into a string first.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml

from utils.errors import UserError

MAX_BYTES = 16 * 2**20  # a YAML file larger than this is not a configuration
MAX_NODES = 1_000_000  # values in the document with every alias expanded (COCO's 80 names: ~200)
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_SCALAR = 65_536  # characters of one scalar (a class name, a path, a number)
MAX_CHARS = 32 * 2**20  # characters of all scalars with every alias expanded (what a str() of it all would hold)
MAX_DIGITS = 100  # an integer or float written with more digits is refused before int()/float() sees it


class YamlError(UserError, ValueError):
    """A YAML file that cannot be read safely or is not valid YAML; the message names the file."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses overlong numbers (the constructor would otherwise hit Python's digit limit)."""


def _bounded_number(kind: str):
    base = yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{kind}"]

    def construct(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        if sum(c.isdigit() for c in node.value) > MAX_DIGITS:
            raise yaml.constructor.ConstructorError(None, None, f"a number of more than {MAX_DIGITS} digits",
                                                    node.start_mark)
        return base(loader, node)
    return construct


for _kind in ("int", "float"):
    _BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_kind}", _bounded_number(_kind))


def _measure(root: yaml.Node, source: str) -> None:
    """Refuse a node graph whose alias-expanded size (values and characters), depth or scalar length is over the
    bounds (iterative: a deeply nested file cannot overflow the stack here)."""
    expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (values, characters) below it with aliases expanded
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            sizes = [expanded[id(c)] for c in _children(node)]
            expanded[key] = (1 + sum(n for n, _ in sizes), sum(c for _, c in sizes))
            _check_expanded(*expanded[key], source)
            continue
        if key in expanded:
            continue  # an alias to a node already measured: its size is known
        if key in on_path:
            raise YamlError(f"{source}: a recursive alias (a value that contains itself); refused")
        if depth > MAX_DEPTH:
            raise YamlError(f"{source}: nested deeper than {MAX_DEPTH} levels; refused")
        if isinstance(node, yaml.ScalarNode):
            if len(node.value) > MAX_SCALAR:
                raise YamlError(f"{source}: a value of more than {MAX_SCALAR:,} characters; refused")
            expanded[key] = (1, len(node.value))
            continue
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node))


def _check_expanded(values: int, chars: int, source: str) -> None:
    if values > MAX_NODES:
        raise YamlError(f"{source}: more than {MAX_NODES:,} values once its aliases are expanded; refused")
    if chars > MAX_CHARS:
        raise YamlError(f"{source}: more than {MAX_CHARS:,} characters once its aliases are expanded; refused")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml_text(text: str, source: str = "<yaml>") -> Any:
    """The single document in ``text`` as Python values (None when empty), within the bounds above."""
    if len(text) > MAX_BYTES:
        raise YamlError(f"{source}: larger than {MAX_BYTES // 2**20} MB; not a configuration file")
    loader = None
    try:
        loader = _BoundedLoader(text)  # checks the characters: a control character is a ReaderError here
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, source)
        return loader.construct_document(node)
    except YamlError:
        raise
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()
        raise YamlError(f"{source}: not valid YAML ({' '.join(first[:2])[:200]})") from None
    except (RecursionError, ValueError, TypeError, OverflowError, MemoryError) as e:
        # TypeError: an unhashable mapping key such as a list; ValueError: numbers Python refuses
        raise YamlError(f"{source}: cannot be read ({type(e).__name__}: {str(e)[:120]})") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """The YAML file at ``path`` read with load_yaml_text; an unreadable or oversized file is one YamlError."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise YamlError(f"{path}: larger than {MAX_BYTES // 2**20} MB; not a configuration file")
        if not path.is_file():
            raise YamlError(f"{path}: not a regular file")
        raw = path.read_bytes()
    except OSError as e:
        raise YamlError(f"{path}: cannot be read ({e.strerror or type(e).__name__})") from None
    text = decode_text(raw)
    if text is None:
        raise YamlError(f"{path}: not UTF-8, UTF-16 or UTF-32 text")
    return load_yaml_text(text, str(path))


BOMS = ((b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\xfe\xff", "utf-16-be"),
        (b"\xff\xfe", "utf-16-le"), (b"\xef\xbb\xbf", "utf-8"))


def decode_text(raw: bytes) -> str | None:
    """A YAML file's bytes as text: the encoding its BOM names (UTF-32 before UTF-16, whose BOM begins UTF-32 LE's),
    else UTF-8; None when they do not decode."""
    bom, encoding = next(((b, e) for b, e in BOMS if raw.startswith(b)), (b"", "utf-8"))
    try:
        return raw[len(bom):].decode(encoding)
    except UnicodeDecodeError:
        return None


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict, _SHOWN.maxset = 2, 3, 3, 3, 3
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 40, 40, 40


def shown(value: Any) -> str:
    """A short description of a value read from a file, for a one-line error: bounded text, built from the first
    few items only (never a str() of a whole list or mapping an alias may have multiplied)."""
    return _SHOWN.repr(value).replace("\n", " ")[:80]
