"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict`` (a broken link, a missing
anchor or a page left out of the navigation fails), and its mechanical promises hold: the flag tables are the
scripts' own flags, the Architecture page lists every module once and its layer table is tests/test_layers.py's,
and no page carries lab notes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import detect
import export
import train
from tests.helpers import ROOT, load_script
from tests.test_layers import LAYERS
from utils.cli import flag_table

test_script = load_script("test")
DOCS = ROOT / "docs"


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                                            "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_every_page(tmp_path: Path) -> None:
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    pages = sorted(p.stem for p in DOCS.glob("*.md"))
    assert {"index", "api", "architecture", "flags", "performance", "security", "multinode"} <= set(pages)
    for page in pages:
        built = tmp_path / "site" / ("index.html" if page == "index" else f"{page}/index.html")
        assert built.is_file(), page


def test_a_broken_link_or_a_page_left_out_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
    with (tmp_path / "docs" / "api.md").open("a") as f:
        f.write("\n[gone](performance.md#no-such-section)\n")
    result = mkdocs_build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "orphan.md" in result.stderr and "no-such-section" in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("module, script", [(train, "train.py"), (test_script, "test.py"), (detect, "detect.py"),
                                            (export, "export.py")])
def test_flag_tables_match_the_parsers(module: object, script: str) -> None:
    expected = flag_table(module.build_parser())
    text = (DOCS / "flags.md").read_text()
    section = re.search(rf"### `{re.escape(script)}`\n\n(.*?)(?=\n\n|\n<!--|\Z)", text, re.S)
    assert section, f"docs/flags.md has no flag table for {script}"
    assert section.group(1).strip() == expected, f"docs/flags.md's {script} table is stale; it should read:\n{expected}"


def architecture_blocks() -> list[str]:
    blocks = re.findall(r"```text\n(.*?)```", (DOCS / "architecture.md").read_text(), re.S)
    assert len(blocks) == 2, "docs/architecture.md has the layer table and the module list"
    return blocks


def listed_modules(block: str) -> list[str]:
    """The module paths the list names, in order, repeats kept: the first word of each line that ends in .py."""
    return [line.split()[0] for line in block.splitlines() if line.strip() and line.split()[0].endswith(".py")
            and "*" not in line.split()[0]]


def project_modules() -> set[str]:
    """Every module of the scripts, models/ and utils/ (package __init__ files aside)."""
    files = [*ROOT.glob("*.py"), *ROOT.glob("models/*.py"), *ROOT.glob("utils/**/*.py")]
    return {str(p.relative_to(ROOT)) for p in files if p.name != "__init__.py"}


def module_list_problems(block: str) -> list[str]:
    listed, present = listed_modules(block), project_modules()
    problems = [f"listed {listed.count(m)} times: {m}" for m in sorted(set(listed)) if listed.count(m) > 1]
    problems += [f"missing: {m}" for m in sorted(present - set(listed))]
    problems += [f"no such module: {m}" for m in sorted(set(listed) - present)]
    return problems


def test_architecture_lists_every_module_once() -> None:
    assert module_list_problems(architecture_blocks()[1]) == []


def test_the_module_list_check_can_fail() -> None:
    block = architecture_blocks()[1]
    assert module_list_problems(block.replace("utils/hooks.py", "utils/hook.py")) == [
        "missing: utils/hooks.py", "no such module: utils/hook.py"]
    duplicated = block + "utils/hooks.py            the training events again\n"
    assert module_list_problems(duplicated) == ["listed 2 times: utils/hooks.py"]


SCRIPTS = {"train", "test", "val", "detect", "export", "hubconf", "benchmarks"}


def layer_rows(block: str) -> list[list[str]]:
    """The layer table as module names per layer: ``data/`` is utils.data, ``models/head.py`` models.head."""
    rows = []
    for line in block.splitlines()[1:]:
        words = line.split()
        names = [w for w in words[1:] if not w.startswith(("layer", "nothing", "(", "of", "ours"))
                 and not re.fullmatch(r"\d+(-\d+)?\)?|each|not|other\)", w)]
        modules = []
        for name in names:
            dotted = name.rstrip("/").removesuffix(".py").replace("/", ".")
            modules.append(dotted if dotted.startswith("models.") or dotted in SCRIPTS else f"utils.{dotted}")
        rows.append(modules)
    return rows


def test_the_layer_table_is_the_declared_layers() -> None:
    assert [sorted(row) for row in layer_rows(architecture_blocks()[0])] == [sorted(layer) for layer in LAYERS]


def test_no_page_carries_lab_notes() -> None:
    """Figures keep their commands and name the machine kind; no load averages, commit hashes or session notes."""
    commit = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
    for path in [ROOT / "README.md", *DOCS.glob("*.md")]:
        text = path.read_text()
        for pattern in ("load average", "this session", "issue 1", "issue 2", "issue 3"):
            assert pattern not in text, f"{path.name}: {pattern!r}"
        assert not commit.findall(text), f"{path.name}: {commit.findall(text)}"
    performance = (DOCS / "performance.md").read_text()
    for section in performance.split("\n## ")[1:]:
        assert re.search(r"Intel Xeon|AMD EPYC", section), section.splitlines()[0]
