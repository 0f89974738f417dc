"""The CUDA paths the CPU-only test suite cannot run, in one short pass (run it on a machine with a GPU):

    python -m tests.scripts.gpu_smoke [OUT_DIR]

1. train.py on one GPU: AMP decided on and used, 2 epochs of the tiny synthetic set;
2. the NCCL branches of utils.distributed.comm (barrier naming its device, reductions, the step vote) in a 1-rank group;
3. train.py under torchrun with 2 ranks on the GPU (gloo: NCCL needs a GPU per rank), DDP with device_ids and AMP;
   then with --batch-size -1: AutoBatch under DDP (each rank measures the GPU, the ranks agree, the total is logged);
4. detect.py with --half against fp32; test.py with --half; export.py on the GPU (TorchScript and ONNX, verified);
   a TensorRT engine exported and run by detect.py where the tensorrt package is importable;
5. the NMS and release-weight tests, whose CUDA cases run only there;
6. throughput (tests/scripts/gpu_throughput.py): yolo11n and yolov5s training at 640 px with AMP, train.py's step
   fed by the real loader against the same step on batches already on the device (goal: at least 0.9x), and the
   loader's images/s with the machine's cores; PASS when it ran, the ratio is a figure, not a verdict.
Prints one line per check (PASS/FAIL, seconds, what it saw), then one table of every check and the throughput;
exits non-zero when a check failed. Meant to finish in under 8 minutes on one GPU (the throughput part: 2 models
x 35 steps of each kind at batch 32 on a generated set of 256 images, at most 330 s).
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
    """utils.distributed.comm with NCCL, 1 rank: barrier with device_ids, all_reduce on the GPU, the step vote; the
    start-up's and a barrier's seconds."""
    import torch

    from utils.distributed import comm as dist
    from utils.training.engine import StepVote

    start = time.perf_counter()
    try:
        with dist.single_process_group("0", "nccl") as device:
            up = time.perf_counter() - start
            dist.barrier()  # the first one creates the communicator
            tick = time.perf_counter()
            dist.barrier()
            barrier = time.perf_counter() - tick
            value = dist.all_reduce_max(torch.tensor([3.0], device=dist.collective_device())).item()
            vote = StepVote.cast(torch.tensor(float("nan"), device=device), 15, False)
            ok = dist.backend() == "nccl" and value == 3.0 and vote.nonfinite and vote.signum == 15
            record("nccl barrier / all_reduce / step vote", ok, time.perf_counter() - start,
                   f"backend {dist.backend()}, collective device {dist.collective_device()}, vote {vote}, "
                   f"start-up {up:.2f} s, barrier {barrier * 1e3:.2f} ms")
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
    tensorrt(weights, py, project)
    run("pytest: NMS (with its CUDA case) and release weights", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                                  "tests/utils/test_boxes.py",
                                                                  "tests/utils/weights/test_release_reader.py"],
        expect=r"\[100%\]")  # -q -q prints no summary line; a failure makes the exit code non-zero
    speed = run("throughput: yolo11n, yolov5s at 640, AMP, real loader vs batches on the device",
                [py, "-m", "tests.scripts.gpu_throughput", "--device", "0", "--out", str(out_dir / "throughput")],
                expect=r"(?m)^yolov5s\s", timeout=330)
    print("\n".join(summary(speed)), flush=True)
    return 1 if any(not r[1] for r in RESULTS) else 0


def tensorrt(weights: Path, py: str, project: str) -> None:
    """A TensorRT engine exported and run by detect.py, where the tensorrt package is importable."""
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        record("TensorRT export and detect", True, 0.0, "skipped: the tensorrt package is not importable here")
        return
    run("TensorRT export", [py, "export.py", "--weights", str(weights), "--device", "0", "--img", "128",
                            "--include", "engine"], expect=r"Export summary")
    run("detect.py with the TensorRT engine", [py, "detect.py", "--weights", str(weights.with_suffix(".engine")),
                                               "--source", "data/images", "--device", "0", "--img", "128",
                                               "--nosave", "--project", project, "--name", "trt"], expect=r"Speed:")


def summary(throughput_output: str) -> list[str]:
    """One table: every check (PASS/FAIL, seconds, name), the throughput table, the count passed."""
    failed = [r for r in RESULTS if not r[1]]
    lines = ["", f"{'check':<78}{'result':>7}{'s':>8}"]
    lines += [f"{name[:78]:<78}{'PASS' if ok else 'FAIL':>7}{seconds:>8.1f}" for name, ok, seconds, _ in RESULTS]
    table = [line for line in throughput_output.splitlines() if re.match(r"(model\s+img|yolo)", line)]
    lines += ["", *table, "", f"{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed"]
    return lines


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/gpu_smoke")))
