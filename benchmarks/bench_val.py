"""Validation throughput: images/s and per-image pre-process, inference and NMS ms, on 1 rank and on N ranks.

    python benchmarks/bench_val.py --quick            # ~1 min: yolov5n, 160 px, 1 rank, 3 passes
    python benchmarks/bench_val.py                    # yolov5n, 160 px, 64 images, 1 vs 2 ranks on CPU, 5 passes
    python benchmarks/bench_val.py --img 640 --images 128 --ranks 1 2 4 --repeats 5
    python benchmarks/bench_val.py --threads 1       # every rank on 1 thread: scaling without intra-op threads

Each rank count runs in its own torchrun launch (gloo); inside it, ``evaluate`` runs ``--repeats`` times after a
warm-up pass on the synthetic validation set (conf-thres 0.001, multi-label NMS, max_det 300, as test.py).
Figures are the median [min-max] over the passes: wall time of rank 0 between barriers, and the per-image
stage times ``evaluate`` reports. NMS/infer is the ratio of the two per pass (goal: <= 1.0). Rank 0 times
a reference fp32 matmul before and after its passes (benchmarks/harness.py); each figure is also given in
units of it, which stay comparable when other jobs share the machine. Speed-ups are ratios to the first rank
count of the same invocation. The model has random weights (speed does not depend on them, except through
the number of boxes NMS sees).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import Reference, Stats, free_port, header  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov5n", help="model YAML")
    p.add_argument("--img", type=int, default=160, help="validation image size")
    p.add_argument("--images", type=int, default=64, help="val images (synthetic, 0.8-1 x --img px)")
    p.add_argument("--batch-size", type=int, default=16, help="total batch over all ranks")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="rank counts to compare (first = base)")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per rank count (median and spread)")
    p.add_argument("--quick", action="store_true", help="1 rank, 3 passes: about a minute on a 2-core CPU")
    p.add_argument("--conf-thres", type=float, default=0.001)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="OMP_NUM_THREADS for every rank (0: each rank takes its share of the cores)")
    p.add_argument("--worker", nargs=2, metavar=("DATA_ROOT", "OUT_JSON"), help=argparse.SUPPRESS)
    opt = p.parse_args(argv)
    if opt.quick:
        opt.ranks, opt.repeats = opt.ranks[:1], 3
    return opt


def worker(opt: argparse.Namespace) -> None:
    """One rank under torchrun: build the shard loader, warm up, time ``repeats`` evaluations, rank 0 reports."""
    import torch

    from models.yolo import Model
    from utils.data.datasets import DatasetOptions
    from utils.data.loader import create_dataloader
    from utils.data.synthetic import SYNTHETIC_NAMES
    from utils.distributed import comm as dist
    from utils.evaluation.evaluate import evaluate
    from utils.log import setup_logging

    device = dist.init_distributed(opt.device, "auto")
    setup_logging(dist.get_rank(), verbose=False)
    threads = dist.configure_threads()
    try:
        torch.manual_seed(0)
        model = Model(opt.cfg, nc=len(SYNTHETIC_NAMES)).to(device).fuse().eval()
        root, world = Path(opt.worker[0]), dist.get_world_size()
        stride = int(model.stride.max())
        options = DatasetOptions(img_size=opt.img, batch_size=opt.batch_size // world, stride=stride, rect=True,
                                 pad=0.5, nc=len(SYNTHETIC_NAMES))
        loader, _ = create_dataloader(root / "images" / "val", options, workers=0, shard_eval=True)

        def run():
            return evaluate(model, loader, device=device, names=SYNTHETIC_NAMES, conf_thres=opt.conf_thres)

        run()  # warm-up
        reference = Reference(device=str(device))
        reference.measure()
        walls, speeds = [], []
        for _ in range(opt.repeats):
            dist.barrier()
            start = time.perf_counter()
            result = run()
            dist.barrier()
            walls.append(time.perf_counter() - start)
            speeds.append(result.speed)
        reference.measure()
        if dist.is_main_process():
            Path(opt.worker[1]).write_text(json.dumps({
                "world": world, "threads_per_rank": threads, "images": result.seen, "walls": walls,
                "speeds_ms": speeds, "device": str(device),
                "reference_s": [reference.before.samples, reference.after.samples]}))
    finally:
        dist.cleanup()


def launch(opt: argparse.Namespace, ranks: int, data_root: Path, out: Path) -> dict:
    """One torchrun launch with ``ranks`` processes; returns rank 0's figures."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
           str(free_port()), __file__, "--cfg", opt.cfg, "--img", str(opt.img), "--batch-size", str(opt.batch_size),
           "--repeats", str(opt.repeats), "--conf-thres", str(opt.conf_thres), "--device", opt.device,
           "--threads", str(opt.threads),
           "--worker", str(data_root), str(out)]
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("OMP_NUM_THREADS", None)  # each rank takes its share of the cores (comm.configure_threads)
    if opt.threads:
        env["OMP_NUM_THREADS"] = str(opt.threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"bench_val: {ranks}-rank run failed:\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def summarize(row: dict) -> dict:
    """A worker's raw samples -> Stats of images/s, per-image stage ms, NMS/inference, and the reference."""
    pre, inf, nms = (Stats.of(stage) for stage in zip(*row["speeds_ms"]))
    reference = Reference(device=row["device"])
    reference.before, reference.after = (Stats.of(s) for s in row["reference_s"])
    return {**row, "images_per_s": Stats.of(row["images"] / wall for wall in row["walls"]), "pre": pre,
            "inf": inf, "nms": nms, "nms_per_inf": Stats.of(n / i for _, i, n in row["speeds_ms"]),
            "reference": reference}


def report(opt: argparse.Namespace, rows: list[dict]) -> None:
    """The table (median [min-max] over the passes) and the same figures in reference-matmul units."""
    base = rows[0]["images_per_s"].median
    print(f"\nvalidation, {opt.cfg} at {opt.img} px, {rows[0]['images']} images, batch {opt.batch_size} total, "
          f"conf-thres {opt.conf_thres}, {opt.device}; median [min-max] of {opt.repeats} passes")
    print(f"{'ranks':>5} {'threads/rank':>12} {'images/s':>18} {'pre ms':>18} {'infer ms':>18} {'NMS ms':>18} "
          f"{'NMS/infer':>18} {'speed-up':>8}")
    for row in rows:
        print(f"{row['world']:>5} {row['threads_per_rank']:>12} {row['images_per_s'].fmt(1, 18)} "
              f"{row['pre'].fmt(2, 18)} {row['inf'].fmt(2, 18)} {row['nms'].fmt(2, 18)} "
              f"{row['nms_per_inf'].fmt(2, 18)} {row['images_per_s'].median / base:>7.2f}x")
    print("(ms per image per rank; 'NMS' is NMS alone, matching and metrics are in the wall time; "
          "NMS/infer goal: <= 1.0)")
    print("in reference matmuls (each figure divided by the time of one, rank 0's median before and after):")
    for row in rows:
        ref = row["reference"]
        per_image = {name: ref.ratio(row[name].median / 1e3) for name in ("pre", "inf", "nms")}
        print(f"{row['world']:>5} ranks: pre {per_image['pre']:.4f}, infer {per_image['inf']:.4f}, "
              f"NMS {per_image['nms']:.4f} per image; {row['images_per_s'].median * ref.seconds:.2f} images "
              f"per matmul time; {ref.describe()}")


def main(opt: argparse.Namespace) -> list[dict]:
    from utils.data.synthetic import ensure_synthetic

    if opt.worker:
        worker(opt)
        return []
    print(header(f"bench_val: {opt.cfg} validation at {opt.img} px, ranks {' '.join(map(str, opt.ranks))}",
                 opt.device))
    with tempfile.TemporaryDirectory() as tmp:
        data_root = ensure_synthetic(Path(tmp) / "synthetic", n_train=2, n_val=opt.images,
                                     img_size=(opt.img * 4 // 5, opt.img), seed=0)
        rows = [summarize(launch(opt, ranks, data_root, Path(tmp) / f"ranks{ranks}.json")) for ranks in opt.ranks]
    report(opt, rows)
    return rows


if __name__ == "__main__":
    main(parse_opt())
