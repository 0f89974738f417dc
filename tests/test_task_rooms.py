"""Tasks live in their rooms: scripts and shared modules never name a task, as the layering test keeps the floors.

Every task has a room (``utils/tasks/<task>/``) and a record in the task registry (utils/tasks/registry.py); the
shared code asks the record (its lazy references to the room's pieces, its facts) and never tests which task it
has. Read with ``ast``, outside the rooms and the registry, in the scripts, models/ and utils/:

- no string that is a registered task's name, except the base task's (``detect`` is also the script and the run
  folder), and no comparison with any task's name (``task == "detect"``);
- no name, attribute, keyword, argument or string that is a word of a task's vocabulary (``Task.words``: a
  segmenter's ``masks``, ``outlines``, ``nm``...);
- no import of a room's module (a room is reached through the registry).

Docstrings and comments may speak of tasks; the checks are on code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_layers import ROOT, module_name, project_files
from utils.tasks.registry import BASE_TASK, all_tasks

REGISTRY = "utils.tasks.registry"


def room_of(module: str) -> str | None:
    """The task whose room holds ``module`` (``utils.tasks.<task>...``), else None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["utils", "tasks"] and parts[2] in names() else None


def names() -> set[str]:
    return {task.name for task in all_tasks()}


def words() -> dict[str, str]:
    """Each vocabulary word -> the task it belongs to."""
    return {word: task.name for task in all_tasks() for word in task.words}


def shared_files() -> list[Path]:
    """The scripts and the shared modules: every project file outside the rooms, the registry and benchmarks/."""
    return [p for p in project_files() if room_of(module_name(p)) is None and module_name(p) != REGISTRY
            and not module_name(p).startswith("benchmarks")]


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def problems_in(source: str, where: str) -> list[str]:
    """What names a task in ``source`` (see the module docstring)."""
    tree, vocabulary, tasks = ast.parse(source), words(), names()
    skip, found = _docstrings(tree), []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in tasks - {BASE_TASK}:
                say(node, f"names the task {node.value!r}")
            elif node.value in vocabulary:
                say(node, f"spells {node.value!r}, a word of the {vocabulary[node.value]} task")
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in tasks:
                    say(node, f"compares with the task {side.value!r}")
        identifiers = [node.attr] if isinstance(node, ast.Attribute) else [node.id] if isinstance(node, ast.Name) \
            else [node.arg] if isinstance(node, (ast.keyword, ast.arg)) and node.arg else \
            [node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        for identifier in identifiers:
            if identifier in vocabulary:
                say(node, f"uses {identifier!r}, a word of the {vocabulary[identifier]} task")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if room_of(module):
                    say(node, f"imports {module}, a module of the {room_of(module)} room")
    return found


def test_scripts_and_shared_modules_do_not_name_a_task() -> None:
    problems = [p for path in shared_files() for p in problems_in(path.read_text(), str(path.relative_to(ROOT)))]
    assert problems == []


def test_every_task_has_a_room_and_the_base_is_the_shared_code() -> None:
    rooms = {room_of(module_name(p)) for p in project_files()} - {None}
    assert rooms == names() - {BASE_TASK}
    assert len(shared_files()) > 100  # the check reads the whole house


@pytest.mark.parametrize("source, what", [
    ('if task == "segment":\n    pass\n', "names the task 'segment'"),
    ('ok = head.task != "detect"\n', "compares with the task 'detect'"),
    ("n = contract.nm\n", "uses 'nm', a word of the segment task"),
    ('masks = batch["masks"]\n', "spells 'masks', a word of the segment task"),
    ("def run(outlines=None):\n    pass\n", "uses 'outlines', a word of the segment task"),
    ("from utils.tasks.segment.masks import rle_encode\n", "imports utils.tasks.segment.masks"),
])
def test_the_checker_sees_a_task_named(source: str, what: str) -> None:
    found = problems_in(source, "x.py")
    assert any(what in p for p in found), found


def test_the_checker_lets_docstrings_and_the_base_name_be() -> None:
    source = '"""Segment masks are drawn by the segment room."""\n\ndef f() -> str:\n    """masks"""\n' \
             '    return run_folder("detect")\n'
    assert problems_in(source, "x.py") == []
