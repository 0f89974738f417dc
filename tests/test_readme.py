"""The README's promises that can be checked mechanically: its flag tables are the scripts' own flags."""

from __future__ import annotations

import re

import pytest

import detect
import export
import train
from tests.helpers import ROOT, load_script
from utils.cli import flag_table

test_script = load_script("test")

README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("module, script", [(train, "train.py"), (test_script, "test.py"), (detect, "detect.py"),
                                            (export, "export.py")])
def test_flag_tables_match_the_parsers(module: object, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    captured = {}
    real_parse = __import__("argparse").ArgumentParser.parse_args

    def capture(parser, args=None, namespace=None):  # the parser each script builds
        captured["parser"] = parser
        return real_parse(parser, args, namespace)

    monkeypatch.setattr("argparse.ArgumentParser.parse_args", capture)
    module.parse_opt([])
    expected = flag_table(captured["parser"])
    section = re.search(rf"#### `{re.escape(script)}`\n\n(.*?)(?=\n\n|\n<!--|\Z)", README, re.S)
    assert section, f"README has no flag table for {script}"
    assert section.group(1).strip() == expected, f"README's {script} table is stale; it should read:\n{expected}"


def _architecture_block() -> str:
    section = README.split("## Architecture\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```text\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "Architecture has the layer table and the module list"
    return blocks[1]


def listed_modules(block: str) -> set[str]:
    """The module paths the Architecture list names: the first word of each line that ends in .py."""
    return {line.split()[0] for line in block.splitlines() if line.strip() and line.split()[0].endswith(".py")
            and "*" not in line.split()[0]}


def project_modules() -> set[str]:
    """Every module of the scripts, models/ and utils/ (package __init__ files aside)."""
    files = [*ROOT.glob("*.py"), *ROOT.glob("models/*.py"), *ROOT.glob("utils/**/*.py")]
    return {str(p.relative_to(ROOT)) for p in files if p.name != "__init__.py"}


def test_architecture_lists_every_module_and_only_those():
    listed, present = listed_modules(_architecture_block()), project_modules()
    assert present - listed == set(), f"modules missing from README's Architecture: {sorted(present - listed)}"
    assert listed - present == set(), f"README's Architecture lists absent modules: {sorted(listed - present)}"


def test_architecture_check_can_fail():
    block = _architecture_block()
    assert "utils/hooks.py" in listed_modules(block)
    assert "utils/hooks.py" not in listed_modules(block.replace("utils/hooks.py", "utils/hook.py"))
