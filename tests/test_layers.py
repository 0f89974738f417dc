"""The declared layers of the code: a module imports only from its own component or from lower layers, and inside
a package only from the package's lower modules.

Every ``import``/``from ... import`` of the project's own modules is read with ``ast``, at module level, inside
functions (a lazy import is still a dependency) and under ``if TYPE_CHECKING:`` (an import for annotations is a
dependency of the design, and a cycle hidden there is still a cycle). The entry-point block of a module
(``if __name__ == "__main__":``) is the script layer and is not counted. The layers, lowest first, are the
Architecture page's layer table in code (docs/architecture.md; tests/test_docs.py
compares the two).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A component is a module or a package prefix; components on one line are one layer and may not
# import each other (they are independent), only their own component and lower layers.
# A task's room (utils/tasks/<task>/) holds its pieces at the layers of the subsystems they extend: each of its
# modules is a component of its own, declared on the row just above what it imports (the shared code below never
# imports a room: it reaches a task's pieces through the task registry's lazy references).
LAYERS: list[list[str]] = [
    ["utils.errors", "utils.tasks", "utils.tasks.segment", "utils.tasks.pose", "utils.tasks.classify",
     "utils.tasks.obb"],
    ["utils.log", "utils.paths", "utils.atomic_files", "utils.boxes", "utils.http_fetch", "utils.safe_yaml",
     "utils.tasks.registry", "utils.tasks.segment.masks", "utils.tasks.segment.hub",
     "utils.tasks.segment.releases", "utils.tasks.pose.hub", "utils.tasks.pose.releases", "utils.compat",
     "utils.tasks.classify.augment", "utils.tasks.classify.hub", "utils.tasks.classify.releases",
     "utils.tasks.obb.rotated", "utils.tasks.obb.hub", "utils.tasks.obb.releases"],
    ["utils.device", "utils.hyp", "utils.hooks", "utils.tasks.contract", "utils.tracking"],
    ["utils.distributed", "utils.tasks.obb.postprocess"],
    ["models.registry", "utils.tasks.segment.mask_loss", "utils.tasks.classify.loss"],
    ["models.common", "models.cost"],
    ["models.blocks"],
    ["models.head", "models.head_anchor_free"],
    ["models.head_end_to_end"],
    ["utils.tasks.segment.head", "utils.tasks.pose.head", "utils.tasks.classify.head", "utils.tasks.obb.head"],
    ["utils.tasks.segment.head_end_to_end"],
    ["models.yolo"],
    ["utils.data", "utils.weights", "models.layer_profile"],
    ["utils.tasks.segment.labels", "utils.tasks.segment.augment", "utils.tasks.pose.labels",
     "utils.tasks.pose.augment", "utils.tasks.classify.folders", "utils.tasks.classify.synthetic",
     "utils.tasks.obb.labels", "utils.tasks.obb.augment", "utils.tasks.obb.synthetic"],
    ["utils.tasks.segment.sample", "utils.tasks.segment.synthetic", "utils.tasks.pose.sample",
     "utils.tasks.pose.synthetic", "utils.tasks.classify.dataset", "utils.tasks.obb.sample"],
    ["utils.plots"],
    ["utils.tasks.pose.draw"],
    ["utils.evaluation"],
    ["utils.tasks.segment.metric", "utils.tasks.segment.predict", "utils.tasks.pose.metric",
     "utils.tasks.pose.predict", "utils.tasks.classify.metric", "utils.tasks.classify.predict",
     "utils.tasks.obb.metric", "utils.tasks.obb.predict"],
    ["utils.deploy", "models.hub", "utils.loggers"],
    ["utils.tasks.segment.export", "utils.tasks.pose.export", "utils.tasks.classify.export",
     "utils.tasks.obb.export"],
    ["utils.training"],
    ["utils.tasks.segment.loss", "utils.tasks.pose.loss", "utils.tasks.obb.loss"],
    ["utils.cli"],
    ["utils.api"],
    ["train", "test", "val", "detect", "export", "hubconf", "benchmarks"],
]


# Inside each package, its modules lowest first; modules on one line are one layer and may not import each other.
# A declared module may be absent (a file another branch adds); a present one must be declared.
MODULE_LAYERS: dict[str, list[list[str]]] = {
    "utils.distributed": [["launcher", "openmp", "signals", "watchdog"], ["comm", "elastic"],
                          ["loss_share", "ray_train"]],
    "utils.compat": [["ultralytics"]],
    "utils.data": [["batch_memory", "colour", "generated", "heap"],
                   ["augment", "batch_pool", "errors", "ram_cache", "regular_files", "shard_urls", "synthetic"],
                   ["image_io", "samples"], ["download", "label_cache"],
                   ["annotations", "shards", "shared_scan"],
                   ["dota", "sources", "voc", "coco_json"],
                   ["formats"],
                   ["convert", "datasets"], ["stream"], ["zoo", "loader"], ["config"]],
    "utils.weights": [["downloads", "untrusted"], ["safe_pickle"], ["checkpoint"], ["release_reader"],
                      ["ultralytics_reader"]],
    "utils.plots": [["annotate", "feature_maps", "viewer"], ["figures"]],
    "utils.evaluation": [["metrics", "outputs", "task_metric", "task_outputs"], ["results", "tta"], ["evaluate"]],
    "utils.deploy": [["formats"], ["head_maps"],
                     ["coreml", "ncnn", "onnx", "pytorch", "runtime", "tf_graph", "torchscript"],
                     ["openvino", "saved_model", "tflite", "verify"]],
    "utils.loggers": [["background", "progress", "tracker_queue"], ["batch_plots", "registry"],
                      ["results_csv", "tensorboard", "tracking"],
                      ["clearml_logger", "comet_logger", "mlflow_logger", "wandb_logger"]],
    "utils.tracking": [["appearance", "config", "gmc", "kalman", "matching", "track"], ["bytetrack"], ["botsort"],
                       ["registry"], ["session"]],
    "utils.training": [["amp", "autoanchor", "autobatch", "config", "early_stop", "fingerprint", "fitness", "loss",
                        "optim", "tal", "train_state"], ["loss_anchor_free", "resume"],
                       ["families", "run_plan"], ["checkpointer", "engine"], ["loop"], ["builder"], ["evolve"]],
}
# Imports that go up inside a package (a lazy import closing a cycle), each to be broken by its package's owner.
# Empty, and it may only stay so: a new upward import fails the test.
KNOWN_UPWARD: set[tuple[str, str]] = set()

def component_of(module: str) -> tuple[int, str] | None:
    """(layer index, component) of a project module: the longest declared component it is or lies in (a room's
    module inside its room's package); None for a module outside the declared tree."""
    found = [(len(comp), level, comp) for level, components in enumerate(LAYERS) for comp in components
             if module == comp or module.startswith(comp + ".")]
    return max(found)[1:] if found else None


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


ENTRY_POINTS = {"train.py", "test.py", "detect.py", "export.py"}


def test_only_the_scripts_import_the_module_that_acts_on_import():
    """utils.distributed.openmp sets the process's OpenMP wait when imported (it must act before torch loads): the
    four scripts import it first, and no library module imports it (importing the library has no side effects)."""
    importers = {str(path.relative_to(ROOT)) for path in project_files()
                 if any(name == "utils.distributed.openmp" for _, name in imports_of(path))}
    assert importers == ENTRY_POINTS | {"benchmarks/harness.py"}  # the harness reads what it set, for baselines
    for script in ENTRY_POINTS:
        imported = [n.names[0].name if isinstance(n, ast.Import) else n.module or ""
                    for n in ast.parse((ROOT / script).read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert [m for m in imported if m.split(".")[0] not in sys.stdlib_module_names][0] == "utils.distributed.openmp"


def _is_main_block(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of the project's own modules outside the entry-point block,
    imports for type annotations only (``if TYPE_CHECKING:``) included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if _is_main_block(node):
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


def test_every_module_of_a_task_room_is_declared_itself():
    """A room's module sits at the layer of what it extends, so each is declared by name, never by its package."""
    rooms = [module_name(p) for p in project_files() if module_name(p).startswith("utils.tasks.")]
    assert rooms and [m for m in rooms if component_of(m)[1] != m] == []


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


# ------------------------------------------------------------------------------------------ inside each package
def package_of(module: str) -> tuple[str, str] | None:
    """(package, module's name in it) for a module of a package MODULE_LAYERS declares, else None."""
    package, _, name = module.rpartition(".")
    return (package, name) if package in MODULE_LAYERS else None


def module_layer(package: str, name: str) -> int | None:
    return next((i for i, names in enumerate(MODULE_LAYERS[package]) if name in names), None)


def package_edges() -> list[tuple[str, int, str, str]]:
    """(importing file, line, importing module, imported module) for every import between two modules of one
    declared package."""
    edges = []
    for path in project_files():
        own = module_name(path)
        if package_of(own) is None:
            continue
        for line, name in imports_of(path):
            target = package_of(name)
            if target is not None and target[0] == package_of(own)[0] and name != own:
                edges.append((str(path.relative_to(ROOT)), line, own, name))
    return edges


def package_violations() -> list[str]:
    """Undeclared modules, and imports that do not go down their package's declared layers (KNOWN_UPWARD aside)."""
    problems = [f"{path.relative_to(ROOT)}: not declared in MODULE_LAYERS[{package_of(module_name(path))[0]!r}]"
                for path in project_files() if package_of(module_name(path)) is not None
                and module_layer(*package_of(module_name(path))) is None and path.name != "__init__.py"]
    for file, line, own, name in package_edges():
        (package, low), high = package_of(own), package_of(name)[1]
        own_layer, target_layer = module_layer(package, low), module_layer(package, high)
        if None in (own_layer, target_layer) or (own, name) in KNOWN_UPWARD:
            continue
        if target_layer >= own_layer:
            problems.append(f"{file}:{line}: {own} (layer {own_layer} of {package}) imports {name} "
                            f"(layer {target_layer})")
    return problems


def test_modules_inside_each_package_import_only_lower_ones():
    assert package_violations() == []


def test_the_known_upward_imports_are_still_there_to_be_broken():
    """KNOWN_UPWARD only lists imports that exist (one that was broken leaves the list)."""
    found = {(own, name) for _, _, own, name in package_edges()}
    assert KNOWN_UPWARD <= found, f"no longer imported, remove from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - found)}"


def test_no_cycles_between_the_modules_of_a_package_outside_the_known_ones():
    """The module graph of every package, without the known upward imports, is acyclic (checked directly, so a
    cycle would show even between modules of one declared layer)."""
    graph: dict[str, set[str]] = {}
    for _, _, own, name in package_edges():
        if (own, name) not in KNOWN_UPWARD:
            graph.setdefault(own, set()).add(name)
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"import cycle: {' -> '.join((*path[path.index(node):], node))}"
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, (*path, node))
        done.add(node)

    for node in sorted(graph):
        visit(node, ())


def test_the_package_checker_sees_a_cycle_and_an_import_for_annotations_only(tmp_path, monkeypatch):
    """Two modules of one package importing each other, one of them only under TYPE_CHECKING: both edges count."""
    folder = tmp_path / "utils" / "evaluation"
    folder.mkdir(parents=True)
    (folder / "metrics.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from utils.evaluation.evaluate import EvalResult\n"
                                       "    from utils.training.loop import Trainer\n")
    (folder / "evaluate.py").write_text("from utils.evaluation.metrics import ap_per_class\n")
    files = [folder / "metrics.py", folder / "evaluate.py"]
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    monkeypatch.setattr(f"{__name__}.project_files", lambda: files)
    assert package_violations() == ["utils/evaluation/metrics.py:3: utils.evaluation.metrics (layer 0 of "
                                    "utils.evaluation) imports utils.evaluation.evaluate (layer 2)"]
    low, high = component_of("utils.evaluation")[0], component_of("utils.training")[0]
    assert [v.split(": ", 1)[1] for v in violations()] == [
        f"utils.evaluation (layer {low}) imports utils.training.loop (utils.training, layer {high})"]
    with pytest.raises(AssertionError, match="import cycle: utils.evaluation.evaluate -> utils.evaluation.metrics"):
        test_no_cycles_between_the_modules_of_a_package_outside_the_known_ones()


MAX_MODULE_LINES = 450
MAX_TOP_LEVEL_MODULES = 12  # utils/'s own modules; everything else lives in a package


def test_the_rooms_stay_small():
    """No module over MAX_MODULE_LINES lines, and at most MAX_TOP_LEVEL_MODULES modules at utils/' top level."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in project_files()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert long == []
    top = sorted(p.name for p in (ROOT / "utils").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
