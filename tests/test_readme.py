"""The README's promises that can be checked mechanically: its flag tables are the scripts' own flags."""

from __future__ import annotations

import re

import pytest

import detect
import export
import test as test_script
import train
from tests.helpers import ROOT
from utils.cli import flag_table

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
