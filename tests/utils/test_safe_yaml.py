"""The bounded YAML reader: alias bombs, deep nesting, huge numbers and bad files are one YamlError line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from utils import safe_yaml
from utils.errors import UserError
from utils.safe_yaml import YamlError, load_yaml, load_yaml_text

# 9 levels of 10 aliases: 10^9 leaves from a few hundred bytes (safe_load builds it at once; str() never ends)
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)) + "nc: *i\n"


def test_plain_documents_read_as_safe_load_does() -> None:
    text = "path: ../datasets/x\ntrain: images/train\nnc: 2\nnames: {0: cat, 1: dog}\nlr: 1.0e-3\nflag: true\n"
    assert load_yaml_text(text) == {"path": "../datasets/x", "train": "images/train", "nc": 2,
                                    "names": {0: "cat", 1: "dog"}, "lr": 1e-3, "flag": True}
    assert load_yaml_text("") is None
    small_aliases = "base: &b {lr: 0.01}\nother: *b\n"  # a few aliases are fine
    assert load_yaml_text(small_aliases) == {"base": {"lr": 0.01}, "other": {"lr": 0.01}}


def test_an_alias_bomb_is_refused_before_it_is_built() -> None:
    assert len(ALIAS_BOMB) < 600
    with pytest.raises(YamlError, match="aliases are expanded"):
        load_yaml_text(ALIAS_BOMB, "bomb.yaml")  # measured on the node graph, never expanded (that would not end)


def test_recursion_depth_and_big_values_are_one_line_errors() -> None:
    cases = {
        "[" * 100_000: "nested|cannot be read|not valid",
        "a: &a [*a]\n": "recursive",
        "n: " + "9" * 5000 + "\n": "not valid YAML",
        "n: 1" + "0" * 200 + ".5\n": "not valid YAML",
        "x: " + "y" * 70_000 + "\n": "characters",
        "? [1, 2]\n: v\n": "not valid YAML",  # an unhashable key
        "a: [1, 2\n": "not valid YAML",
        "a: !!python/object/apply:os.system [echo hi]\n": "not valid YAML",
    }
    for text, pattern in cases.items():
        with pytest.raises(YamlError, match=pattern) as info:
            load_yaml_text(text, "f.yaml")
        assert isinstance(info.value, UserError) and "\n" not in str(info.value) and "f.yaml" in str(info.value)


def test_the_node_bound_counts_expanded_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safe_yaml, "MAX_NODES", 50)
    load_yaml_text("a: &a [1, 2, 3]\nb: [*a, *a, *a]\n")  # 1 + 2*(1+... ) well under 50
    with pytest.raises(YamlError):
        load_yaml_text("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\nb: [*a, *a, *a, *a, *a, *a]\n")


def test_files_fifos_encodings_and_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    utf16 = tmp_path / "utf16.yaml"
    utf16.write_bytes("nc: 1\nnames: [chat]\n".encode("utf-16"))
    assert load_yaml(utf16) == {"nc": 1, "names": ["chat"]}
    with pytest.raises(YamlError, match="cannot be read"):
        load_yaml(tmp_path / "missing.yaml")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(YamlError, match="not a regular file"):
        load_yaml(fifo)  # never opened: a FIFO would block the read forever
    monkeypatch.setattr(safe_yaml, "MAX_BYTES", 10)
    (tmp_path / "big.yaml").write_text("a: 123456789012\n")
    with pytest.raises(YamlError, match="larger than"):
        load_yaml(tmp_path / "big.yaml")


def test_aliases_of_a_long_value_are_bounded_in_characters() -> None:
    """A 64 KB string aliased 200k times is 13 GB once str()'d: refused on the node graph."""
    text = f"a: &a {'y' * 60_000}\nb: [{', '.join(['*a'] * 200_000)}]\n"
    assert len(text) < 2 * 2**20
    with pytest.raises(YamlError, match="characters once its aliases are expanded"):
        load_yaml_text(text, "chars.yaml")


def test_utf32_and_boms(tmp_path: Path) -> None:
    expected = {"nc": 1, "names": ["chat"]}
    for encoding, bom in (("utf-32-le", b"\xff\xfe\x00\x00"), ("utf-32-be", b"\x00\x00\xfe\xff"),
                          ("utf-16-be", b"\xfe\xff"), ("utf-8", b"\xef\xbb\xbf")):
        path = tmp_path / f"{encoding}.yaml"
        path.write_bytes(bom + "nc: 1\nnames: [chat]\n".encode(encoding))
        assert load_yaml(path) == expected, encoding
    (tmp_path / "latin1.yaml").write_bytes("names: [caf\xe9]\n".encode("latin-1"))
    with pytest.raises(YamlError, match="not UTF-8, UTF-16 or UTF-32 text"):
        load_yaml(tmp_path / "latin1.yaml")


def test_shown_describes_large_values_without_stringifying_them() -> None:
    from utils.safe_yaml import shown

    huge = [["x" * 1000] * 1000] * 1000  # a billion characters if str()'d
    assert len(shown(huge)) <= 80 and "\n" not in shown("a\nb")
    assert shown({i: i for i in range(10)}).startswith("{0: 0, 1: 1, 2: 2") and shown(None) == "None"


def test_no_other_module_parses_yaml() -> None:
    """Every YAML read goes through this reader: no call of yaml's loaders (or its Loader classes) elsewhere in the
    product (issue 31, finding 6)."""
    import ast

    from utils.paths import ROOT

    loaders = {"load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all", "compose", "parse",
               "scan", "Loader", "SafeLoader", "FullLoader", "UnsafeLoader", "BaseLoader", "CLoader", "CSafeLoader"}
    found = []
    for path in [*ROOT.glob("*.py"), *(ROOT / "utils").rglob("*.py"), *(ROOT / "models").rglob("*.py")]:
        if path == ROOT / "utils" / "safe_yaml.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "yaml" \
                    and node.attr in loaders:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} yaml.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "yaml" and {a.name for a in node.names} & loaders:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} from yaml import ...")
    assert found == []
