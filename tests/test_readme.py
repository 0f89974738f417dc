"""The README's promises that can be checked mechanically: it stays short, every command in it is run by a test
(the table COMMANDS says which), its links lead to pages and sections that exist, its models table is the
models', and its Python example runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()
MAX_LINES = 300

# README section -> the test that runs its commands (each reads them from the README itself).
COMMANDS = {
    "": "test_the_two_first_commands_are_the_quick_start_and_ci (below) and tests/test_requirements.py",
    "Quick start": "tests/test_requirements.py::test_requirements_txt_alone_runs_every_quick_start_line",
    "DDP on one machine": "tests/test_ddp.py::test_two_process_run_prints_once_and_exits_promptly",
    "DDP on several machines": "tests/test_ddp.py::test_two_nodes_on_localhost_with_c10d_rendezvous",
    "Docker": "tests/test_docker.py::test_the_readme_docker_command_trains_with_torchrun_in_the_image",
    "Documentation": "tests/test_docs.py::test_the_site_builds_strictly_with_every_page",
}


def sections(text: str = README) -> dict[str, str]:
    """'## ' section title -> its text ('' for the text before the first section)."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {"": parts[0], **{parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}}


def commands(section: str, language: str = "bash") -> list[str]:
    """The commands of a section's code blocks, continuation lines joined, comments dropped."""
    found = []
    for block in re.findall(rf"```{language}\n(.*?)```", sections()[section], re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip() if language == "bash" else line.rstrip()
            if line:
                found.append(re.sub(r"\s+", " ", line) if language == "bash" else line)
    return found


def readme_torchrun(section: str) -> tuple[list[str], list[str]]:
    """A section's torchrun command as (launcher options, train.py and its options)."""
    (command,) = commands(section)
    words = shlex.split(command)
    assert words[0] == "torchrun", command
    script = words.index("train.py")
    return words[1:script], words[script:]


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= MAX_LINES


def test_every_command_is_run_by_a_test() -> None:
    with_commands = {title for title in sections() if commands(title)}
    assert with_commands == set(COMMANDS), "a README section with commands that no test runs: add it to COMMANDS"
    for entry in COMMANDS.values():
        for path in re.findall(r"tests/\w+\.py(?:::\w+)?", entry):
            file, _, name = path.partition("::")
            assert (ROOT / file).is_file() and (not name or f"def {name}(" in (ROOT / file).read_text()), path
    quick = commands("Quick start")
    assert quick[0] == "pip install -r requirements.txt" and all(c.startswith("python ") for c in quick[1:])
    assert commands("Documentation") == ["mkdocs build --strict"]


def test_the_two_first_commands_are_the_quick_start_and_ci() -> None:
    """The first is requirements.txt and the Quick start's first line (tests/test_requirements.py runs both); the
    second is the command .ci/run runs."""
    first, second = commands("")
    assert first == "pip install -r requirements.txt && " + commands("Quick start")[1]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line
          and not line.startswith("#")]
    assert ci == [second], ci


def test_the_ddp_commands_are_torchrun_on_one_and_on_several_machines() -> None:
    one, _ = readme_torchrun("DDP on one machine")
    several, _ = readme_torchrun("DDP on several machines")
    assert "--nnodes" not in one and "--nproc_per_node" in one
    assert {"--nnodes", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id"} <= set(several)


def test_the_models_table_is_the_models() -> None:
    """Each family's row: the five scales' parameter counts and GFLOPs, as the builder's tests check them."""
    from tests.models.test_families import DOC_SIZES
    from tests.models.test_yolo import REFERENCE
    from tests.utils.tasks.classify import test_head as cls_head
    from tests.utils.tasks.obb import test_head as obb_head
    from tests.utils.tasks.pose.test_head import DOC_SIZES as POSE_SIZES
    from tests.utils.tasks.segment.test_head import DOC_SIZES as SEG_SIZES

    row = (r"^\| `(\w+)n(-seg|-pose|-cls|-obb)?` \.\.\. `\w+x(?:-seg|-pose|-cls|-obb)?` \| [^|]+ \| ([\d, /]+) \| "
           r"([\d. /]+) \|$")
    rows = re.findall(row, sections()["Models and tasks"], re.M)
    assert [family + task for family, task, _, _ in rows] == [
        "yolov5", "yolov8", "yolo11", "yolo26", "yolov5-seg", "yolov8-seg", "yolo11-seg", "yolo26-seg",
        "yolov8-pose", "yolo11-pose", "yolo26-pose",
        *(f"{f}-{t}" for t in ("cls", "obb") for f in ("yolov8", "yolo11", "yolo26"))]
    tasks = {f"{f}{s}-{t}": (head.PARAMETERS[f][i], head.GFLOPS[f][i]) for t, head in (("cls", cls_head),
             ("obb", obb_head)) for f in head.PARAMETERS for i, s in enumerate("nsmlx")}
    for family, task, params, gflops in rows:
        expected = [(REFERENCE | DOC_SIZES | SEG_SIZES | POSE_SIZES | tasks)[f"{family}{scale}{task}"]
                    for scale in "nsmlx"]
        assert [int(p.replace(",", "")) for p in params.split(" / ")] == [p for p, _ in expected]
        assert [float(g) for g in gflops.split(" / ")] == [g for _, g in expected]


def heading_anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (lower case, punctuation dropped, spaces as '-')."""
    titles = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", t).strip().lower()) for t in titles}


def test_every_link_leads_to_a_page_and_section_that_exist() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", README)
    assert len(links) >= 15
    for target, anchor in links:
        assert (ROOT / target).exists(), target
        if anchor:
            assert anchor in heading_anchors(ROOT / target), f"{target}#{anchor}"


def test_the_python_example_runs(tiny_dataset: Path, tiny_cfg_file: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The Quick start's Python block as written, each run() given the tiny data and model at 64 px on top."""
    import detect
    import export
    import train
    import val

    tiny = {"data": tiny_dataset, "img": 64, "device": "cpu", "batch_size": 8, "workers": 0}
    extra = {train: {**tiny, "cfg": tiny_cfg_file, "epochs": 1, "noplots": True, "noautoanchor": True,
                     "project": tmp_path / "train"},
             val: {**tiny, "project": tmp_path / "val"}, detect: {"img": 64, "project": tmp_path / "detect"},
             export: {"img": 64}}
    calls = []
    for module, options in extra.items():
        real = module.run
        monkeypatch.setattr(module, "run", lambda real=real, options=options, **kw: calls.append(kw) or
                            real(**{**kw, **options}))
    code = "\n".join(commands("Quick start", "python"))
    monkeypatch.setattr("builtins.print", lambda *args, **kwargs: calls.append(args))
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert calls[0] == {"epochs": 3, "img": 128} and len(calls) == 8
    assert calls[-1][0] == [tmp_path / "train" / "exp" / "weights" / "best.onnx"]
