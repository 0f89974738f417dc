"""The CUDA paths the CPU-only test suite cannot run, in one short pass (run it on a machine with a GPU):

    python -m tests.scripts.gpu_smoke [OUT_DIR]

1. train.py on one GPU: AMP decided on and used, 2 epochs of the tiny synthetic set;
2. the NCCL branches of utils.distributed.comm (barrier naming its device, reductions, the step vote) in a 1-rank group;
3. train.py under torchrun with 2 ranks on the GPU (gloo: NCCL needs a GPU per rank), DDP with device_ids and AMP;
   then with --batch-size -1: AutoBatch under DDP (each rank measures the GPU, the ranks agree, the total is logged);
4. detect.py with --half against fp32; test.py with --half; export.py on the GPU (TorchScript and ONNX, verified);
5. the NMS and release-weight tests, whose CUDA cases run only there.
Prints one line per check (PASS/FAIL, seconds, what it saw) and a summary; exits non-zero when a check failed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS: list[tuple[str, bool, float, str]] = []


def run(name: str, cmd: list[str], expect: str = "", timeout: float = 240) -> str:
    """Run ``cmd`` in the project root; PASS when it exits 0 (and prints ``expect`` when given)."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        out, ok = proc.stdout + proc.stderr, proc.returncode == 0
    except subprocess.TimeoutExpired as e:
        out, ok = f"timed out after {timeout} s\n{e.stdout or ''}{e.stderr or ''}", False
    ok = ok and (not expect or re.search(expect, out) is not None)
    seen = next((line for line in out.splitlines()[::-1] if expect and re.search(expect, line)), out.strip()[-300:])
    record(name, ok, time.perf_counter() - start, seen if ok else out[-2500:])
    return out


def record(name: str, ok: bool, seconds: float, detail: str) -> None:
    RESULTS.append((name, ok, seconds, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name} ({seconds:.1f} s): {detail}", flush=True)


def nccl_branches() -> None:
    """utils.distributed.comm with NCCL, 1 rank: barrier with device_ids, all_reduce on the GPU, the step vote."""
    import torch

    from utils.distributed import comm as dist
    from utils.training.engine import StepVote

    start = time.perf_counter()
    try:
        with dist.single_process_group("0", "nccl") as device:
            dist.barrier()
            value = dist.all_reduce_max(torch.tensor([3.0], device=dist.collective_device())).item()
            vote = StepVote.cast(torch.tensor(float("nan"), device=device), 15, False)
            ok = dist.backend() == "nccl" and value == 3.0 and vote.nonfinite and vote.signum == 15
            record("nccl barrier / all_reduce / step vote", ok, time.perf_counter() - start,
                   f"backend {dist.backend()}, collective device {dist.collective_device()}, vote {vote}")
    except Exception as e:  # report, do not stop the other checks
        record("nccl barrier / all_reduce / step vote", False, time.perf_counter() - start, repr(e))


def main(out_dir: Path) -> int:
    import torch

    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}", flush=True)
    root = ensure_synthetic(out_dir / "synthetic", n_train=64, n_val=16, img_size=(128, 160), seed=0)
    data = out_dir / "tiny.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                    "nc": len(SYNTHETIC_NAMES), "names": list(SYNTHETIC_NAMES)}))
    py, project = sys.executable, str(out_dir / "runs")
    common = ["--data", str(data), "--cfg", "yolov5n", "--img", "128", "--batch-size", "16", "--project", project,
              "--noautoanchor"]
    run("train.py on 1 GPU with AMP", [py, "train.py", *common, "--epochs", "2", "--device", "0", "--name", "gpu"],
        expect=r"AMP: float16 autocast")
    nccl_branches()
    run("torchrun 2 ranks on the GPU (gloo, DDP device_ids, AMP)",
        [py, "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py", *common, "--epochs", "1",
         "--device", "0,0", "--backend", "gloo", "--name", "ddp"], expect=r"batch 8 per rank, 2 ranks")
    run("AutoBatch under torchrun: 2 ranks measure the GPU and agree",
        [py, "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py", *common, "--batch-size", "-1",
         "--epochs", "1", "--device", "0,0", "--backend", "gloo", "--name", "autobatch"],
        expect=r"AutoBatch: \d+ images per rank fit 80% .* total batch \d+")
    weights = out_dir / "runs" / "gpu" / "weights" / "best.pt"
    full = run("detect.py fp32 on GPU", [py, "detect.py", "--weights", str(weights), "--source", "data/images",
                                         "--device", "0", "--conf-thres", "0.01", "--nosave", "--save-txt",
                                         "--project", project, "--name", "det32"], expect=r"Speed:")
    half = run("detect.py --half on GPU", [py, "detect.py", "--weights", str(weights), "--source", "data/images",
                                           "--device", "0", "--half", "--conf-thres", "0.01", "--nosave",
                                           "--save-txt", "--project", project, "--name", "det16"], expect=r"Speed:")
    counts = [len(re.findall(r"\d+ (?:circle|square|triangle)", text)) for text in (full, half)]
    record("detect fp16 vs fp32 detections", counts[0] == counts[1], 0.0, f"lines with detections {counts}")
    run("test.py --half on GPU", [py, "test.py", "--weights", str(weights), "--data", str(data), "--img", "128",
                                  "--device", "0", "--half", "--project", project], expect=r"\s+all\s+16")
    run("export.py on GPU (TorchScript, ONNX)", [py, "export.py", "--weights", str(weights), "--device", "0",
                                                 "--img", "128", "--include", "torchscript", "onnx"],
        expect=r"Export summary")
    run("pytest: NMS (with its CUDA case) and release weights", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                                  "tests/utils/test_boxes.py",
                                                                  "tests/utils/weights/test_release_reader.py"],
        expect=r"\[100%\]")  # -q -q prints no summary line; a failure makes the exit code non-zero
    failed = [r for r in RESULTS if not r[1]]
    print(f"\n{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/gpu_smoke")))
