"""Run script command lines where only the packages a requirements file installs exist, as in a fresh environment
after ``pip install -r <file>``: a folder of links to those packages and their dependencies (as the installed
versions declare them), read by an interpreter started without site-packages (``python -S``).

    python tests/scripts/requirements_only.py build requirements.txt FOLDER     # the folder of links
    PYTHONPATH=FOLDER python -S tests/scripts/requirements_only.py run '[["train.py", "--epochs", "1"], ...]'

``run`` needs only the standard library; it exits 0 when every command line exits 0, else with the first
failure's code after a line naming it.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(path: Path) -> list[str]:
    """The distribution names a requirements file lists (options, comments and markers left out)."""
    from packaging.requirements import Requirement

    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return [Requirement(line).name for line in lines if line and not line.startswith("-")]


def installed_closure(names: list[str]) -> set[str]:
    """``names`` and every distribution they depend on, transitively, by the installed versions' metadata
    (dependencies of extras and of other platforms left out). Normalised names of installed distributions."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = normalised(todo.pop())
        if name in seen:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (e.g. a dependency of another platform's wheel)
        seen.add(name)
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def build(requirements: Path, folder: Path) -> list[str]:
    """Links in ``folder`` to every top-level file and folder (packages, their .libs, their dist-info) of the
    distributions ``requirements`` installs; returns the distributions' names."""
    from importlib import metadata

    names = installed_closure(requirement_names(requirements))
    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(names):
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source, link = Path(dist.locate_file(top)), folder / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    return sorted(names)


def run(commands: list[list[str]]) -> int:
    """Run each command line (script first) as ``python`` would from the project folder, in this process."""
    sys.path.insert(0, str(ROOT))
    for argv in commands:
        sys.argv = argv
        print(f"$ python {' '.join(argv)}", flush=True)
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as e:
            if e.code not in (0, None):
                print(f"FAILED: python {' '.join(argv)} exited {e.code}", flush=True)
                return int(e.code) if isinstance(e.code, int) else 1
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "build":
        print(" ".join(build(Path(sys.argv[2]), Path(sys.argv[3]))))
        sys.exit(0)
    sys.exit(run(json.loads(sys.argv[2])))
