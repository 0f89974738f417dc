"""The declared layers of the code: a module imports only from its own component or from lower layers.

Every ``import``/``from ... import`` of the project's own modules is read with ``ast``, at module level and
inside functions alike (a lazy import is still a dependency). The entry-point block of a module
(``if __name__ == "__main__":``) is the script layer and is not counted. The layers, lowest first, are the
Architecture page's layer table in code (docs/architecture.md; tests/test_docs.py
compares the two).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A component is a module or a package prefix; components on one line are one layer and may not
# import each other (they are independent), only their own component and lower layers.
LAYERS: list[list[str]] = [
    ["utils.errors"],
    ["utils.log", "utils.paths", "utils.atomic_files", "utils.boxes", "utils.http_fetch", "utils.safe_yaml",
     "utils.masks"],
    ["utils.device", "utils.hyp", "utils.hooks", "utils.predictions"],
    ["utils.distributed"],
    ["models.registry"],
    ["models.common"],
    ["models.blocks"],
    ["models.head", "models.head_anchor_free"],
    ["models.head_end_to_end"],
    ["models.segment"],
    ["models.yolo"],
    ["utils.data", "utils.weights"],
    ["utils.plots"],
    ["utils.evaluation"],
    ["utils.deploy", "models.hub", "utils.loggers"],
    ["utils.training"],
    ["utils.cli"],
    ["utils.api"],
    ["train", "test", "val", "detect", "export", "hubconf", "benchmarks"],
]


def component_of(module: str) -> tuple[int, str] | None:
    """(layer index, component) of a project module, or None for a module outside the declared tree."""
    for level, components in enumerate(LAYERS):
        for comp in components:
            if module == comp or module.startswith(comp + "."):
                return level, comp
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def project_files() -> list[Path]:
    files = [*ROOT.glob("*.py"), *ROOT.glob("models/**/*.py"), *ROOT.glob("utils/**/*.py"),
             *ROOT.glob("benchmarks/**/*.py")]
    top_inits = {ROOT / "utils" / "__init__.py", ROOT / "models" / "__init__.py"}  # empty: asserted below
    return sorted(p for p in files if p not in top_inits)


def test_the_top_packages_are_empty():
    assert (ROOT / "utils" / "__init__.py").read_text().strip() == ""
    assert (ROOT / "models" / "__init__.py").read_text().strip() == ""


def _is_main_block(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of the project's own modules outside the entry-point block.
    Imports only for type annotations (``if TYPE_CHECKING:``) are not dependencies at run time, and not counted."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if _is_main_block(node) or _is_type_checking_block(node):
            skipped |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if (ROOT / node.module.replace(".", "/") / a.name).with_suffix(".py").exists()
                      or (ROOT / node.module.replace(".", "/") / a.name).is_dir()]
    return [(line, name) for line, name in found if name.split(".")[0] in {"utils", "models"}]


def violations() -> list[str]:
    problems = []
    for path in project_files():
        own = component_of(module_name(path))
        if own is None:
            problems.append(f"{path.relative_to(ROOT)}: not in any declared layer")
            continue
        for line, name in imports_of(path):
            target = component_of(name)
            if target is None:
                if name not in {"utils", "models"}:
                    problems.append(f"{path.relative_to(ROOT)}:{line}: imports {name}, which no layer declares")
                continue
            if target[1] != own[1] and target[0] >= own[0]:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {own[1]} (layer {own[0]}) imports {name} "
                                f"({target[1]}, layer {target[0]})")
    return problems


def test_every_import_goes_down_the_declared_layers():
    assert violations() == []


def test_every_module_belongs_to_a_layer():
    assert all(component_of(module_name(p)) is not None for p in project_files())


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """The checker can fail: a low module importing a high one, and a lazy import inside a function."""
    fake = tmp_path / "utils" / "boxes.py"
    fake.parent.mkdir()
    fake.write_text("import os\nfrom utils.training.engine import Trainer\n\ndef f():\n"
                    "    from utils.cli import run_main\n\nif __name__ == '__main__':\n    import utils.cli\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    monkeypatch.setattr(f"{__name__}.project_files", lambda: [fake])
    found = violations()
    assert len(found) == 2 and "utils.training.engine" in found[0] and "utils.cli" in found[1]


@pytest.mark.parametrize("module", ["utils.errors", "utils.distributed.comm", "utils.training.engine"])
def test_components_are_found(module):
    assert component_of(module) is not None


def test_no_cycles_between_components():
    """Same-layer components never import each other, lower never import higher: so no cycle exists. Checked
    directly too: the component graph is acyclic."""
    edges: dict[str, set[str]] = {}
    for path in project_files():
        own = component_of(module_name(path))
        for _, name in imports_of(path):
            target = component_of(name)
            if own and target and target[1] != own[1]:
                edges.setdefault(own[1], set()).add(target[1])
    seen, stack = set(), set()

    def visit(node: str) -> None:
        assert node not in stack, f"import cycle through {node}"
        if node in seen:
            return
        stack.add(node)
        for nxt in edges.get(node, ()):
            visit(nxt)
        stack.discard(node)
        seen.add(node)

    for node in list(edges):
        visit(node)
