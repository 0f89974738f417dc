"""Every Quick start line works after the README's first command: run in a process that can import only what
``pip install -r requirements.txt`` installs (tests/scripts/requirements_only.py), on the tiny model and data."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, job_env, run_job

REQUIREMENTS_ONLY = ROOT / "tests" / "scripts" / "requirements_only.py"


def quick_start_commands() -> list[list[str]]:
    """The ``python ...`` lines of the README's Quick start block, as argv lists (comments dropped)."""
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line.split("#")[0])[1:] for line in block.splitlines() if line.startswith("python ")]


def fast(argv: list[str], data: Path, cfg: Path, tmp: Path) -> list[str]:
    """The same command on the tiny data and model at 64 px, writing into ``tmp`` (later flags win in argparse)."""
    argv = [str(tmp / "runs" / "exp" / "weights" / "best.pt") if a == "runs/train/exp/weights/best.pt" else a
            for a in argv]
    script = argv[0]
    extra = {"train.py": ["--data", str(data), "--cfg", str(cfg), "--epochs", "1", "--batch-size", "8", "--workers",
                          "0", "--noplots", "--noautoanchor", "--noval", "--project", str(tmp / "runs")],
             "test.py": ["--data", str(data), "--batch-size", "8", "--project", str(tmp / "test")],
             "val.py": ["--data", str(data), "--batch-size", "8", "--project", str(tmp / "val")],
             "detect.py": ["--project", str(tmp / "detect")],
             "export.py": []}[script]
    return [str(ROOT / script), *argv[1:], "--img", "64", *extra]


def test_quick_start_lists_the_scripts() -> None:
    assert [argv[0] for argv in quick_start_commands()] == ["train.py", "test.py", "val.py", "detect.py",
                                                            "export.py"]
    assert "onnx" in quick_start_commands()[-1]


def only(requirements: Path, folder: Path, commands: list[list[str]], cwd: Path) -> tuple[int, str]:
    """Run ``commands`` where only what ``requirements`` installs can be imported."""
    code, names = run_job([sys.executable, str(REQUIREMENTS_ONLY), "build", str(requirements), str(folder)])
    assert code == 0, names
    return run_job([sys.executable, "-S", str(REQUIREMENTS_ONLY), "run", json.dumps(commands)], cwd=cwd,
                   env=job_env(PYTHONPATH=str(folder)))


@pytest.mark.slow
def test_requirements_txt_alone_runs_every_quick_start_line(tmp_path: Path, tiny_dataset: Path,
                                                            tiny_cfg_file: Path) -> None:
    commands = [fast(argv, tiny_dataset, tiny_cfg_file, tmp_path) for argv in quick_start_commands()]
    code, out = only(ROOT / "requirements.txt", tmp_path / "site", commands, ROOT)
    assert code == 0, out[-3000:]
    assert (tmp_path / "runs" / "exp" / "weights" / "best.onnx").is_file(), out[-3000:]
    assert not (tmp_path / "site" / "pytest").exists() and not (tmp_path / "site" / "openvino").exists()


def test_the_check_refuses_a_package_the_file_does_not_install(tmp_path: Path) -> None:
    """The same runner with a requirements file without onnx: importing it fails, as in such an environment."""
    reduced = tmp_path / "requirements.txt"
    reduced.write_text("pyyaml>=6.0\n")
    probe = tmp_path / "probe.py"
    probe.write_text("import yaml\nimport onnx\n")
    code, out = only(reduced, tmp_path / "site", [[str(probe)]], tmp_path)
    assert code != 0 and "No module named 'onnx'" in out and "import onnx" in out, out[-2000:]


@pytest.mark.parametrize("name", ["onnx", "onnxruntime"])
def test_export_and_runtime_packages_are_runtime_requirements(name: str) -> None:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    assert name in [re.split(r"[<>=!~; \[]", line)[0].lower() for line in lines]
