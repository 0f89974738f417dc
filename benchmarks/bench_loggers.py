"""Per-epoch cost of each tracker (MLflow, W&B, ClearML, Comet): what the training thread spends, and how long the
tracker's background thread takes to send the epoch.

    python benchmarks/bench_loggers.py                         # all four, 10 epochs each, 64 px
    python benchmarks/bench_loggers.py --loggers mlflow --epochs 20
    python benchmarks/bench_loggers.py --stop-runs 3             # a SIGTERM-stopped train.py: its exit time

No network: MLflow talks to an ``mlflow server`` this script starts on 127.0.0.1 (SQLite, local artifacts); W&B,
ClearML and Comet run offline. Each tracker's hook (the one train.py builds) gets ``--epochs`` epochs of a
results.csv row, once without validation images and once with them every epoch (``--bbox_interval 1``: the EMA
model's boxes on 4 validation images, drawn on the training thread). Figures are medians [min-max] over the
epochs; the baseline, timed in the same run, is writing the same row to results.csv. Start-up and close are given
once (they happen once a run).

``--stop-runs N`` instead times N tiny train.py runs stopped by SIGTERM before their second epoch, with the chosen
trackers and without (results.csv only, the baseline): seconds from the stop line to the process's exit, medians.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.harness import Stats, free_port, header  # noqa: E402
from utils.loggers.tracker_queue import CANCELLED_FLUSH_S  # noqa: E402

TRACKERS = ("mlflow", "wandb", "clearml", "comet")


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loggers", nargs="+", choices=TRACKERS, default=list(TRACKERS), help="trackers to time")
    p.add_argument("--epochs", type=int, default=10, help="epochs (samples) per tracker and variant")
    p.add_argument("--cfg", default="yolov5n", help="model YAML (its parameters and GFLOPs are logged)")
    p.add_argument("--img", type=int, default=64, help="image size of the validation images drawn")
    p.add_argument("--stop-runs", type=int, default=0, help="time N SIGTERM-stopped train.py runs instead (exit time)")
    return p.parse_args(argv)


def start_mlflow_server(folder: Path) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on a free loopback port; returns the process and its URL once /health answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                             "--artifacts-destination", str(folder / "artifacts")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job runner
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("mlflow server did not start within 600 s")


def build_trainer(folder: Path, cfg: str, img: int) -> SimpleNamespace:
    """What the hooks read of a Trainer: options, hyps, the model and its EMA, a validation set, the run folder."""
    from models.yolo import Model
    from utils.data.config import load_data_config
    from utils.data.datasets import DatasetOptions, YoloDataset
    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic
    from utils.hyp import default_hyp_file, load_hyp

    root = ensure_synthetic(folder / "data", n_train=4, n_val=8, img_size=(img, img), seed=0)
    data = folder / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {list(SYNTHETIC_NAMES)}\n")
    data_cfg = load_data_config(str(data))
    model = Model(cfg, nc=data_cfg.nc).eval()
    val_set = YoloDataset(data_cfg.val, DatasetOptions(img_size=img, batch_size=8, stride=32, rect=True))
    opt = argparse.Namespace(epochs=100, img_size=img, project=str(folder / "runs"), bbox_interval=-1, save_period=-1)
    loader = SimpleNamespace(dataset=val_set)
    return SimpleNamespace(opt=opt, hyp=load_hyp(default_hyp_file(str(data))), device=torch.device("cpu"),
                           model_without_ddp=model, ema=SimpleNamespace(ema=model), val_loader=loader,
                           train_loader=loader, names=list(SYNTHETIC_NAMES))


def drained(hook: Any) -> None:
    """Wait until the hook's queue has sent everything submitted so far."""
    done = threading.Event()
    hook.queue.submit(done.set)
    done.wait()


def time_tracker(name: str, trainer: SimpleNamespace, run_dir: Path, epochs: int, images: bool) -> dict[str, Any]:
    """Training-thread and total (until sent) seconds per epoch of one tracker's hook, plus start-up and close."""
    from utils.loggers.registry import LoggerContext, build_loggers

    trainer.save_dir = run_dir
    (run_dir / "weights").mkdir(parents=True, exist_ok=True)
    options = {**vars(trainer.opt), "bbox_interval": 1 if images else epochs + 1}
    start = time.perf_counter()
    hook = build_loggers([name], LoggerContext(run_dir, options))[-1]  # after results.csv, always built
    hook.before_train(trainer)
    drained(hook)
    startup = time.perf_counter() - start
    main, total = [], []
    for epoch in range(epochs):
        row = {"train/box_loss": 0.1 / (epoch + 1), "metrics/mAP_0.5": 0.01 * epoch, "x/lr0": 0.01}
        start = time.perf_counter()
        hook.after_epoch(trainer, epoch, row)
        main.append(time.perf_counter() - start)
        drained(hook)
        total.append(time.perf_counter() - start)
    start = time.perf_counter()
    hook.close(trainer, cancelled=False)
    return {"main": Stats.of(main), "total": Stats.of(total), "startup": startup,
            "close": time.perf_counter() - start, "failed": hook.queue.failed}


def csv_baseline(folder: Path, epochs: int) -> Stats:
    """Seconds to append one epoch's row to results.csv (what every run writes, trackers or not)."""
    from utils.loggers.results_csv import append_row, results_columns

    row = {column: 0.1 for column in results_columns(("box", "obj", "cls"))[1:]}
    samples = []
    for epoch in range(epochs):
        start = time.perf_counter()
        append_row(folder / "results.csv", epoch, row)
        samples.append(time.perf_counter() - start)
    return Stats.of(samples)


def stopped_exit_s(folder: Path, loggers: list[str]) -> float:
    """A tiny train.py run stopped by SIGTERM at the first batch of epoch 1: seconds from its stop line to its exit."""
    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    root = ensure_synthetic(folder / "data", n_train=8, n_val=8, img_size=(64, 64), seed=0)
    data = folder / "stop-data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {list(SYNTHETIC_NAMES)}\n")
    cmd = [sys.executable, str(ROOT / "train.py"), "--data", str(data), "--cfg", str(ROOT / "models" / "yolov5n.yaml"),
           "--weights", "", "--img-size", "64", "--batch-size", "8", "--epochs", "2", "--workers", "0", "--device",
           "cpu", "--noautoanchor", "--noplots", "--project", str(folder / "stop-runs"), "--loggers", "csv", *loggers,
           "--hook", "tests.plugins.faults:FailAt(epoch=1, batch=0, action='term')"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    stopped_at = None
    for line in proc.stdout:
        if stopped_at is None and "SIGTERM received" in line:
            stopped_at = time.perf_counter()
    proc.wait()
    if stopped_at is None:
        raise SystemExit(f"train.py ended ({proc.returncode}) without a stop line: {' '.join(cmd)}")
    return time.perf_counter() - stopped_at


def time_stops(folder: Path, loggers: list[str], runs: int) -> None:
    """Median exit time of SIGTERM-stopped runs with the trackers against results.csv alone, runs interleaved."""
    alone, tracked = [], []
    for _ in range(runs):
        alone.append(stopped_exit_s(folder, []))
        tracked.append(stopped_exit_s(folder, loggers))
    alone_s, tracked_s = Stats.of(alone), Stats.of(tracked)
    print(f"stop line to exit, results.csv only: {alone_s.fmt(1)} s; with {' '.join(loggers)}: {tracked_s.fmt(1)} s "
          f"({tracked_s.median / alone_s.median:.2f}x; the trackers' deadline after a stop: {CANCELLED_FLUSH_S:g} s)")


def main(opt: argparse.Namespace) -> None:
    print(header("bench_loggers: per-epoch cost of each tracker"))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "COMET_START_ONLINE": "false",
                           "CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": str(folder / "clearml")})
        server = None
        if "mlflow" in opt.loggers:
            server, os.environ["MLFLOW_TRACKING_URI"] = start_mlflow_server(folder / "mlflow")
        try:
            if opt.stop_runs:
                time_stops(folder, opt.loggers, opt.stop_runs)
                return
            trainer = build_trainer(folder, opt.cfg, opt.img)
            baseline = csv_baseline(folder, opt.epochs).scaled(1e3)
            print(f"baseline: results.csv row {baseline.fmt(3)} ms per epoch")
            print(f"{'tracker':<8} {'images':<6} {'training thread ms/epoch':>26} {'x results.csv':>14} "
                  f"{'until sent ms/epoch':>22} {'start s':>8} {'close s':>8}")
            for name in opt.loggers:
                for images in (False, True):
                    run_dir = folder / "runs" / f"{name}-{'images' if images else 'rows'}"
                    figures = time_tracker(name, trainer, run_dir, opt.epochs, images)
                    main_ms, total_ms = figures["main"].scaled(1e3), figures["total"].scaled(1e3)
                    note = "  (the tracker FAILED: see the warning)" if figures["failed"] else ""
                    print(f"{name:<8} {'yes' if images else 'no':<6} {main_ms.fmt(2):>26} "
                          f"{main_ms.median / baseline.median:>13.1f}x {total_ms.fmt(1):>22} "
                          f"{figures['startup']:>8.1f} {figures['close']:>8.1f}{note}")
        finally:
            if server is not None:
                server.kill()


if __name__ == "__main__":
    main(parse_opt())
