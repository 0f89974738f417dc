"""Validation throughput: images/s and per-stage ms for yolov5n, on 1 rank and on N ranks (torchrun, gloo).

    python benchmarks/bench_val.py                    # yolov5n, 320 px, 64 images, 1 vs 2 ranks on CPU
    python benchmarks/bench_val.py --img 640 --images 128 --ranks 1 2 4 --repeats 5
    python benchmarks/bench_val.py --threads 1       # every rank on 1 thread: scaling without intra-op threads

Each rank count runs in its own torchrun launch; inside it, ``evaluate`` runs ``--repeats`` times after a
warm-up pass and the median wall time (rank 0, between barriers) is reported. Speed-ups are ratios to the
1-rank figure measured in the same invocation. The model has random weights (speed does not depend on them,
except through the number of boxes NMS sees; ``--conf-thres`` is reported with the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov5n", help="model YAML")
    p.add_argument("--img", type=int, default=320, help="validation image size")
    p.add_argument("--images", type=int, default=64, help="val images (synthetic, 256-320 px)")
    p.add_argument("--batch-size", type=int, default=16, help="total batch over all ranks")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="rank counts to compare (first = base)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per rank count (median reported)")
    p.add_argument("--conf-thres", type=float, default=0.001)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="OMP_NUM_THREADS for every rank (0: each rank takes its share of the cores)")
    p.add_argument("--worker", nargs=2, metavar=("DATA_ROOT", "OUT_JSON"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(opt: argparse.Namespace) -> None:
    """One rank under torchrun: build the shard loader, warm up, time ``repeats`` evaluations, rank 0 reports."""
    import torch

    from models.yolo import Model
    from utils import dist
    from utils.engine import evaluate
    from utils.loader import create_dataloader
    from utils.log import setup_logging
    from utils.synthetic import SYNTHETIC_NAMES

    device = dist.init_distributed(opt.device, "auto")
    setup_logging(dist.get_rank(), verbose=False)
    threads = dist.configure_threads()
    try:
        torch.manual_seed(0)
        model = Model(opt.cfg, nc=len(SYNTHETIC_NAMES)).to(device).fuse().eval()
        root, world = Path(opt.worker[0]), dist.get_world_size()
        stride = int(model.stride.max())
        loader, _ = create_dataloader(root / "images" / "val", opt.img, opt.batch_size // world, stride, rect=True,
                                      pad=0.5, workers=0, shard_eval=True, nc=len(SYNTHETIC_NAMES))

        def run():
            return evaluate(model, loader, device=device, names=SYNTHETIC_NAMES, conf_thres=opt.conf_thres)

        run()  # warm-up
        walls, speeds = [], []
        for _ in range(opt.repeats):
            dist.barrier()
            start = time.perf_counter()
            result = run()
            dist.barrier()
            walls.append(time.perf_counter() - start)
            speeds.append(result.speed)
        if dist.is_main_process():
            wall = statistics.median(walls)
            Path(opt.worker[1]).write_text(json.dumps({
                "world": world, "threads_per_rank": threads, "images": result.seen, "wall_s": wall,
                "images_per_s": result.seen / wall, "speed_ms": [statistics.median(s) for s in zip(*speeds)]}))
    finally:
        dist.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(opt: argparse.Namespace, ranks: int, data_root: Path, out: Path) -> dict:
    """One torchrun launch with ``ranks`` processes; returns rank 0's figures."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
           str(_free_port()), __file__, "--cfg", opt.cfg, "--img", str(opt.img), "--batch-size", str(opt.batch_size),
           "--repeats", str(opt.repeats), "--conf-thres", str(opt.conf_thres), "--device", opt.device,
           "--threads", str(opt.threads),
           "--worker", str(data_root), str(out)]
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("OMP_NUM_THREADS", None)  # each rank takes its share of the cores (utils.dist.configure_threads)
    if opt.threads:
        env["OMP_NUM_THREADS"] = str(opt.threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"bench_val: {ranks}-rank run failed:\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def main(opt: argparse.Namespace) -> list[dict]:
    from utils.synthetic import ensure_synthetic

    if opt.worker:
        worker(opt)
        return []
    with tempfile.TemporaryDirectory() as tmp:
        data_root = ensure_synthetic(Path(tmp) / "synthetic", n_train=2, n_val=opt.images, img_size=(256, 320),
                                     seed=0)
        rows = [launch(opt, ranks, data_root, Path(tmp) / f"ranks{ranks}.json") for ranks in opt.ranks]
    base = rows[0]["images_per_s"]
    print(f"\nvalidation, {opt.cfg} at {opt.img} px, {rows[0]['images']} images, batch {opt.batch_size} total, "
          f"conf-thres {opt.conf_thres}, {opt.device}, {os.cpu_count()} cores; median of {opt.repeats}")
    print(f"{'ranks':>5} {'threads/rank':>12} {'images/s':>9} {'pre ms':>7} {'infer ms':>9} {'NMS+ ms':>8} "
          f"{'speed-up':>8}")
    for row in rows:
        pre, inf, nms = row["speed_ms"]
        print(f"{row['world']:>5} {row['threads_per_rank']:>12} {row['images_per_s']:>9.1f} {pre:>7.2f} {inf:>9.2f} "
              f"{nms:>8.2f} {row['images_per_s'] / base:>7.2f}x")
    print("(ms per image per rank; 'NMS+' is NMS alone, matching and metrics are in the wall time)")
    return rows


if __name__ == "__main__":
    main(parse_opt())
