"""Red-team files of issue 31 read in a child process under an address-space limit: each gives one UserError line,
and the child's peak memory (``getrusage`` high-water mark) grows by at most READ_BUDGET_MB over the imports.

``python -m tests.test_untrusted_files`` prints each case's figures alone (the numbers in docs/security-paths.md).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.onnx_bombs import onnx_bomb
from utils.paths import ROOT

READ_BUDGET_MB = 300  # what reading any one of these files may add to the child's peak
LIMIT_BYTES = 8 << 30  # the child's address space: a regression fails there instead of swapping the machine
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))  # 10^9 leaves in ~0.5 KB


def write_cases(folder: Path) -> dict[str, tuple[Path, str]]:
    """The worst-case files, written into ``folder``: name -> (file, the function that reads it)."""
    data = folder / "alias.yaml"
    data.write_text(ALIAS_BOMB + "train: images\nval: images\nnames: *i\n")
    chars = folder / "chars.yaml"  # 140 KB: 60 KB of text aliased 20,000 times (1.2 GB once str()'d)
    chars.write_text(f"s: &s {'y' * 60_000}\nnames: [{', '.join(['*s'] * 20_000)}]\ntrain: x\nval: x\n")
    model = folder / "upsample.yaml"  # 4 stacked x8 upsamplings of a 256 px probe: 16 GB of activations
    cfg = yaml.safe_load((ROOT / "models" / "yolov5n.yaml").read_text())
    up = [-1, 1, "nn.Upsample", [None, 8, "nearest"]]
    cfg["backbone"] = [cfg["backbone"][0], up, up, up, up, *cfg["backbone"][1:]]
    model.write_text(yaml.safe_dump(cfg, sort_keys=False))
    openvino = folder / "bomb_openvino_model"
    openvino.mkdir(exist_ok=True)
    (openvino / "bomb.xml").write_text("<net/>")
    (openvino / "bomb.yaml").write_text(ALIAS_BOMB + "stride: 32\nnames: *i\n")
    return {
        "data YAML, alias bomb (names)": (data, "load_data_config"),
        "data YAML, 60 KB value aliased 20,000 times": (chars, "load_data_config"),
        "model YAML, stacked Upsample rows": (model, "Model"),
        "OpenVINO metadata YAML, alias bomb": (openvino, "InferenceModel"),
        "ONNX, ConstantOfShape of 2^31 floats": (onnx_bomb(folder / "constant.onnx"), "InferenceModel"),
        "ONNX, input shape x 10^5": (onnx_bomb(folder / "computed.onnx", "computed", 10**5), "InferenceModel"),
    }


CHILD = """
import resource, sys
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
limit = {limit} if hard == resource.RLIM_INFINITY else min({limit}, hard)
resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
from models.yolo import Model
from utils.data.config import load_data_config
from utils.deploy.runtime import InferenceModel
from utils.errors import UserError
import onnxruntime, openvino, onnx
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for path, read in {cases!r}:
    try:
        globals()[read](path)
        print("OUTCOME value")
    except UserError as e:
        print("OUTCOME one-line" if "\\n" not in str(e) else "OUTCOME multi-line", str(e)[:160].replace("\\n", " "))
    except BaseException as e:
        print("OUTCOME", type(e).__name__, str(e)[:160].replace("\\n", " "))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("PEAK_MB", before / 1024, after / 1024)
"""


def measure(cases: list[tuple[Path, str]]) -> tuple[list[str], float, float]:
    """Read each (file, reader name) of ``cases`` in one child: (outcomes, peak MB after the imports, peak MB at
    the end)."""
    code = CHILD.format(limit=LIMIT_BYTES, cases=[(str(path), read) for path, read in cases])
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = proc.stdout.splitlines()
    peaks = [line.split()[1:] for line in lines if line.startswith("PEAK_MB")]
    assert proc.returncode == 0 and peaks, proc.stderr[-2000:]
    return [line[len("OUTCOME "):] for line in lines if line.startswith("OUTCOME")], *map(float, peaks[0])


def test_worst_case_files_are_one_line_refusals_within_a_memory_budget(tmp_path: Path) -> None:
    outcomes, before, after = measure(list(write_cases(tmp_path).values()))
    assert len(outcomes) == 6 and all(o.startswith("one-line") for o in outcomes), outcomes
    assert after - before < READ_BUDGET_MB, (before, after)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'case':48} {'file bytes':>10} {'peak MB (imports)':>18} {'peak MB (read)':>15}  outcome")
        for name, (path, read) in write_cases(Path(tmp)).items():
            size = sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
            (outcome,), before, after = measure([(path, read)])
            print(f"{name:48} {size:>10,} {before:>18.0f} {after:>15.0f}  {outcome[:90]}")
