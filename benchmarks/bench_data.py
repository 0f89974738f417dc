"""Data pipeline throughput: training images/s per worker (mosaic and letterbox at 640 px), DataLoader worker
scaling, and the label scan; optionally against an older checkout timed alternately in the same run.

    python benchmarks/bench_data.py                              # this tree: 640 px, 128-160 px sources
    python benchmarks/bench_data.py --compare /tmp/old-h13       # also an older checkout (git archive/worktree)
    python benchmarks/bench_data.py --source-px 480 640          # COCO-like sources instead of small ones
    python benchmarks/bench_data.py --quick                      # 3 repeats, 1 and 2 workers: about a minute
    python benchmarks/bench_data.py --shards                     # streamed S3 shards (loopback) vs the files
    python benchmarks/bench_data.py --anchor ultralytics         # against ultralytics' pipeline, per worker core

Per worker: one process with one thread (as a DataLoader worker) builds ``--samples`` training samples of ``--img``
px and collates them into batches, a batch's samples fetched as a DataLoader does; "mosaic" is mosaic + perspective
+ HSV + flips with hyp.scratch.yaml, "letterbox" the validation pipeline (no augmentation). Each tree runs in its own
process, a fresh one for each pipeline (what ran before in a process changes the speed of the next: the C
allocator's state); the trees take turns pass by pass (ABBA order), so a change in the machine's load hits both
alike, and "speed-up" is the median of the per-pair ratios. Worker scaling times epochs of a torch DataLoader with
1, 2, 4 workers (this tree only; the main process only receives the batches). A reference fp32 matmul on one thread
is timed before and after (benchmarks/harness.py): "matmuls/img" is the time per image in units of it, comparable
between runs on a loaded machine; images/s are absolute (this machine, as loaded now). Medians [min-max].

``--shards``: the same synthetic images written as tar shards (python -m utils.data.convert --to shards), served by
moto's S3-compatible server on loopback, against the same images as files: training epochs (mosaic, ``--img``, the
last ``--workers`` count, one rank) through the loaders train.py builds, alternating, and each one's start-up per
rank: reading the shard index from S3 (no scan), and a label scan without its cache; medians and ratios.
``--anchor ultralytics``: ours against ultralytics' pipeline, per worker core and phase (benchmarks/data_anchor.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after a --serve tree, which goes first

from benchmarks.harness import ServeProcess  # noqa: E402 (stdlib and torch only: no tree's code)

MODES = ("mosaic", "letterbox")


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img", type=int, default=640, help="training image size (pixels)")
    parser.add_argument("--source-px", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                        help="source sides drawn from [MIN, MAX] (128 160, the synthetic set; 480 640 with --anchor)")
    parser.add_argument("--images", type=int, default=None, help="source images (32; 400 with --anchor)")
    parser.add_argument("--samples", type=int, default=None, help="samples per timed pass (64; 320 with --anchor)")
    parser.add_argument("--batch", type=int, default=16, help="batch size for collate")
    parser.add_argument("--repeats", type=int, default=7, help="timed passes per tree and mode")
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4], help="DataLoader worker counts")
    parser.add_argument("--loader-samples", type=int, default=192, help="samples per DataLoader epoch")
    parser.add_argument("--scan-images", type=int, default=400, help="images for the label-scan figure (0: skip)")
    parser.add_argument("--cache-images", type=int, default=64, help="images for the RAM-cache memory figure (0: skip)")
    parser.add_argument("--compare", type=Path, default=None, help="an older checkout to time in the same run")
    parser.add_argument("--quick", action="store_true", help="3 repeats, workers 1 2, no scan")
    parser.add_argument("--shards", action="store_true", help="streamed shards from loopback S3 vs the same files")
    parser.add_argument("--shard-images", type=int, default=256, help="--shards: images in the set (4 shards)")
    parser.add_argument("--anchor", choices=["ultralytics"], help="ultralytics' pipeline against ours, same images")
    parser.add_argument("--venv", type=Path, default=None, help="--anchor: ultralytics' venv (bench_learn.py's)")
    parser.add_argument("--serve", nargs=2, metavar=("TREE", "DATA"), help=argparse.SUPPRESS)
    opt = parser.parse_args(argv)
    for key, plain, anchored in (("source_px", [128, 160], [480, 640]), ("images", 32, 400),
                                 ("samples", 64, 96 if opt.quick else 320)):
        setattr(opt, key, getattr(opt, key) or (anchored if opt.anchor else plain))
    if opt.anchor and opt.samples < 3 * opt.batch:
        parser.error(f"--anchor needs --samples of at least 3 batches ({3 * opt.batch})")
    if opt.quick:
        opt.repeats, opt.workers, opt.scan_images, opt.loader_samples, opt.cache_images = 3, [1, 2], 0, 64, 16
        opt.shard_images = min(opt.shard_images, 64)
    return opt


# ---------------------------------------------------------------------------------------- one tree's process
def serve(tree: str, data: str, img: int, batch: int) -> None:
    """Build the data sets from ``tree``'s code and answer timing requests (one JSON line each) on stdin."""
    sys.path.insert(0, str(Path(tree).resolve()))
    import cv2
    import torch

    from utils.data.datasets import YoloDataset
    from utils.hyp import load_hyp

    cv2.setNumThreads(0)  # as in a DataLoader worker: one thread, the workers are the parallelism
    torch.set_num_threads(1)
    images = Path(data) / "images" / "train"
    datasets = {"mosaic": YoloDataset(images, img_size=img, augment=True, hyp=load_hyp(), nc=3, seed=0),
                "letterbox": YoloDataset(images, img_size=img, nc=3)}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        dataset = datasets[request["mode"]]
        if request.get("workers"):
            answer = {"seconds": _time_loader(dataset, batch, request["samples"], request["workers"],
                                              request["repeats"])}
        else:
            answer = {"seconds": _time_pass(dataset, batch, request["samples"], request["pass"])}
        print(json.dumps(answer), flush=True)


def _keys(dataset: Any, samples: int, epoch: int) -> list:
    """Sample indices as the training sampler gives them: (index, (seed, epoch, position)) with augmentation."""
    n = len(dataset)
    return [(i % n, (0, epoch, i)) if dataset.augment else i % n for i in range(samples)]


def fetch_batch(dataset: Any) -> Any:
    """How a DataLoader fetches a batch's samples: the data set's ``__getitems__`` where it has one."""
    return getattr(dataset, "__getitems__", None) or (lambda keys: [dataset[k] for k in keys])


def _time_pass(dataset: Any, batch: int, samples: int, epoch: int) -> float:
    """Seconds to build and collate ``samples`` samples in this process."""
    keys, fetch = _keys(dataset, samples, epoch), fetch_batch(dataset)
    start = time.perf_counter()
    for i in range(0, samples, batch):
        dataset.collate_fn(fetch(keys[i:i + batch]))
    return time.perf_counter() - start


def init_worker(_: int) -> None:
    """A DataLoader worker as the tree's utils.data.loader sets one up (an older tree's: OpenCV on one thread)."""
    setup = getattr(__import__("utils.data.loader", fromlist=["_"]), "setup_worker_process", None)
    (setup or (lambda: __import__("cv2").setNumThreads(0)))()


def _time_loader(dataset: Any, batch: int, samples: int, workers: int, repeats: int) -> list[float]:
    """Seconds per epoch of ``samples`` samples through a DataLoader with ``workers`` persistent workers,
    after one untimed epoch (worker start-up)."""
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=_keys(dataset, samples, 0),
                                         num_workers=workers, collate_fn=dataset.collate_fn,
                                         worker_init_fn=init_worker, persistent_workers=True, prefetch_factor=4)
    seconds = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        for _ in loader:
            pass
        if r:
            seconds.append(time.perf_counter() - start)
    return seconds


class TreeProcess(ServeProcess):
    """A ``serve`` process for one checkout, asked for timings one request at a time."""

    def __init__(self, tree: Path, data: Path, opt: argparse.Namespace) -> None:
        super().__init__(tree, [sys.executable, str(Path(__file__).resolve()), "--serve", str(tree), str(data),
                                "--img", str(opt.img), "--batch", str(opt.batch)])


# ------------------------------------------------------------------------------------------------ the parent
def compare_passes(trees: list[TreeProcess], opt: argparse.Namespace, mode: str) -> list[list[float]]:
    """Seconds of every timed pass of each tree, the trees taking turns in ABBA order; one warm-up pass each."""
    for tree in trees:
        tree.ask(mode=mode, samples=opt.samples, **{"pass": 0})
    seconds: list[list[float]] = [[] for _ in trees]
    for r in range(opt.repeats):
        order = list(range(len(trees))) if r % 2 == 0 else list(reversed(range(len(trees))))
        for t in order:
            seconds[t].append(trees[t].ask(mode=mode, samples=opt.samples, **{"pass": r + 1}))
    return seconds


def pipeline_rows(seconds: dict[str, list[list[float]]], opt: argparse.Namespace, ref_seconds: float) -> list[str]:
    """The per-worker table: images/s, matmuls per image and, with --compare, the paired speed-up."""
    from benchmarks.harness import Stats

    rows = [f"{'pipeline, one worker':<24}{'tree':<9}{'images/s':>20}{'matmuls/img':>13}{'speed-up':>20}"]
    for mode, per_tree in seconds.items():
        for t, times in enumerate(per_tree):
            rate = Stats.of(opt.samples / s for s in times)
            per_image = Stats.of(s / opt.samples for s in times).median / ref_seconds
            speedup = ""
            if t == 0 and len(per_tree) > 1:
                speedup = Stats.of(old / new for new, old in zip(times, per_tree[1])).fmt(2) + "x"
            label = "this" if t == 0 else "compare"
            rows.append(f"{f'{mode} {opt.img} px':<24}{label:<9}{rate.fmt(1):>20}{per_image:>13.2f}{speedup:>20}")
    return rows


def scaling_rows(seconds: dict[int, list[float]], opt: argparse.Namespace) -> list[str]:
    """Images/s of a DataLoader with each worker count (mosaic), and the ratio to the first count."""
    from benchmarks.harness import Stats

    rows, base = [f"{'DataLoader, mosaic':<24}{'workers':<9}{'images/s':>20}{'x first':>13}"], None
    for workers, times in seconds.items():
        rate = Stats.of(opt.loader_samples / s for s in times)
        base = base or rate.median
        rows.append(f"{f'{opt.img} px, batch {opt.batch}':<24}{workers:<9}{rate.fmt(1):>20}{rate.median / base:>13.2f}")
    return rows


def measure_trees(data: Path, opt: argparse.Namespace) -> tuple[dict, dict]:
    """Per-worker pass times of each tree and mode, and this tree's DataLoader epoch times per worker count.
    Every mode gets fresh processes: what ran before in a process (the C allocator's state) changes the next
    mode's speed, and a real worker runs one pipeline."""
    passes, scaling = {}, {}
    for mode in MODES:
        trees = [TreeProcess(ROOT, data, opt)]
        if opt.compare is not None:
            trees.append(TreeProcess(opt.compare.resolve(), data, opt))
        try:
            passes[mode] = compare_passes(trees, opt, mode)
        finally:
            for tree in trees:
                tree.close()
    tree = TreeProcess(ROOT, data, opt)
    try:
        scaling = {w: tree.ask(mode="mosaic", samples=opt.loader_samples, workers=w, repeats=opt.repeats)
                   for w in opt.workers}
    finally:
        tree.close()
    return passes, scaling


def bench_scan(images: Path, repeats: int) -> tuple[float, float]:
    """Seconds per 1,000 images for a full check (no cache) and for a cache load."""
    from benchmarks.harness import time_call
    from utils.data.label_cache import files_hash, img2label_paths, list_image_files, load_cache, save_cache, scan_files

    im_files = list_image_files(images)
    label_files = img2label_paths(im_files)
    scan_s = time_call(lambda: scan_files(im_files, label_files, 3, show=False), repeats, 0).median
    result = scan_files(im_files, label_files, 3, show=False)
    cache = Path(label_files[0]).parent.with_suffix(".bench.cache")
    file_hash = files_hash(im_files, label_files, 3)
    save_cache(cache, result, file_hash)
    load_s = time_call(lambda: (files_hash(im_files, label_files, 3), load_cache(cache, file_hash)), repeats).median
    return scan_s * 1000 / len(im_files), load_s * 1000 / len(im_files)


def _pss_mb() -> float:
    """This process's proportional set size in MB: shared pages count a share per process that maps them."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cache_worker(rank: int, world: int, port: int, images: str, img: int, out: str) -> None:
    """One rank: build the --cache ram data set and report how much its memory (PSS) grew."""
    import os

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.path.insert(0, str(ROOT))
    import torch

    from utils.data.datasets import DatasetOptions
    from utils.data.loader import create_dataloader
    from utils.distributed import comm as dist
    from utils.log import setup_logging

    torch.set_num_threads(1)
    dist.init_distributed("cpu", "gloo", 300, 300)
    setup_logging(1)
    try:
        before = _pss_mb()
        _, dataset = create_dataloader(images, DatasetOptions(img_size=img, batch_size=4, nc=3, cache="ram"),
                                       workers=0)
        grown = dist.all_gather_object(_pss_mb() - before)
        if rank == 0:
            Path(out).write_text(json.dumps({"grown": grown, "cache_mb": dataset.ram.nbytes / 2**20}))
    finally:
        dist.cleanup()


def cache_memory(images: Path, img: int) -> list[str]:
    """--cache ram: the memory one process and two ranks add, as the sum of their PSS (shared pages once)."""
    import torch.multiprocessing as mp

    from benchmarks.harness import free_port

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, 2):
            out = Path(tmp) / f"{world}.json"
            mp.start_processes(_cache_worker, args=(world, free_port(), str(images), img, str(out)), nprocs=world,
                               start_method="spawn")
            result = json.loads(out.read_text())
            rows.append((world, sum(result["grown"]), result["cache_mb"]))
    (_, one, size), (_, two, _) = rows
    return [f"RAM cache (--cache ram) of {size:.0f} MB of images: 1 process adds {one:.0f} MB; 2 ranks add "
            f"{two:.0f} MB in all (summed PSS), {two / max(one, 1e-9):.2f}x one process: one copy per machine"]


# ---------------------------------------------------------------------------------------------------- --shards
def _s3_server() -> tuple[Any, dict[str, str]]:
    """moto's S3 server in its own process on a free loopback port (as a server is another machine: it takes no
    time from this process's interpreter), and the environment a client needs to reach it."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return server, {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
                    "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def _shard_sets(folder: Path, opt: argparse.Namespace) -> tuple[Path, Path]:
    """Data YAMLs of the same synthetic images: as files, and as 4 tar shards uploaded to the S3 server."""
    import boto3
    import yaml

    from utils.data.convert import main as convert
    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    root = ensure_synthetic(folder / "set", n_train=opt.shard_images, n_val=1, img_size=tuple(opt.source_px), seed=0)
    per = -(-opt.shard_images // 4)
    convert(["--from", "yolo", "--to", "shards", "--images", str(root / "images" / "train"), "--names",
             *SYNTHETIC_NAMES, "--out", str(folder / "shards"), "--shard-samples", str(per)])
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    for path in (folder / "shards").iterdir():
        client.upload_file(str(path), "bench", f"set/{path.name}")
    files, shards = folder / "files.yaml", folder / "shards.yaml"
    common = {"names": list(SYNTHETIC_NAMES)}
    files.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", **common}))
    pattern = "s3://bench/set/train-{000000..000003}.tar"
    shards.write_text(yaml.safe_dump({"train": pattern, "val": pattern, **common}))
    return files, shards


def _startup(data: Path, opt: argparse.Namespace, workers: int) -> tuple[float, Any]:
    """Seconds from the data YAML to a ready training loader (the label scan without a cache for files, the index
    read for shards), and the loader."""
    from utils.data.config import load_data_config
    from utils.data.datasets import DatasetOptions
    from utils.data.loader import create_dataloader
    from utils.hyp import load_hyp

    for cache in Path(load_data_config(data).root).rglob("*.cache"):
        cache.unlink()  # the files' start-up scans, as a first run on a machine does
    start = time.perf_counter()
    options = DatasetOptions(img_size=opt.img, batch_size=opt.batch, augment=True, hyp=load_hyp(), nc=3, seed=0)
    loader, _ = create_dataloader(load_data_config(data).train, options, workers=workers, shuffle=True)
    return time.perf_counter() - start, loader


def _epoch_seconds(loader: Any, epoch: int) -> float:
    from utils.data.loader import set_epoch

    set_epoch(loader, epoch)
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def bench_shards(opt: argparse.Namespace) -> list[str]:
    """Images/s and start-up per rank: streamed S3 shards against the same files, alternating; the rows to print."""
    import os

    from benchmarks.harness import Stats

    workers = opt.workers[-1]
    server, env = _s3_server()
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            files, shards = _shard_sets(Path(tmp), opt)
            startup: dict[str, list[float]] = {"files": [], "shards": []}
            epochs: dict[str, list[float]] = {"files": [], "shards": []}
            for r in range(opt.repeats):
                for name, data in (("files", files), ("shards", shards))[::1 if r % 2 == 0 else -1]:
                    seconds, loader = _startup(data, opt, workers)
                    startup[name].append(seconds)
                    if r == 0:
                        _epoch_seconds(loader, 0)  # the first epoch of each warms the caches, untimed
                    epochs[name].append(opt.shard_images / _epoch_seconds(loader, r + 1))
    finally:
        server.terminate()
        server.wait(30)
    ips = {name: Stats.of(values) for name, values in epochs.items()}
    ratio = Stats.of(s / f for s, f in zip(epochs["shards"], epochs["files"]))
    up = {name: Stats.of(values) for name, values in startup.items()}
    up_ratio = Stats.of(s / f for s, f in zip(startup["shards"], startup["files"]))
    return [f"--shards: {opt.shard_images} images ({opt.source_px[0]}-{opt.source_px[1]} px) in 4 shards on loopback "
            f"S3, mosaic at {opt.img} px, batch {opt.batch}, {workers} workers, {opt.repeats} alternating runs",
            f"  images/s: files {ips['files'].fmt(1)}, S3 shards {ips['shards'].fmt(1)}; shards/files "
            f"{ratio.fmt(2)}x (median [min-max])",
            f"  start-up per rank: files (label scan) {up['files'].fmt(3)} s, S3 shards (index) "
            f"{up['shards'].fmt(3)} s; shards/files {up_ratio.fmt(2)}x"]


def main(opt: argparse.Namespace) -> None:
    """Generate a temporary synthetic set, start one process per tree, measure, print the figures."""
    if opt.serve:
        return serve(*opt.serve, opt.img, opt.batch)
    sys.path.insert(0, str(ROOT))
    if opt.shards:
        print("\n".join(bench_shards(opt)))
        return None
    if opt.anchor:
        from benchmarks.data_anchor import main_anchor

        return main_anchor(opt)
    import torch

    from benchmarks.harness import Reference, header
    from utils.data.synthetic import ensure_synthetic
    from utils.device import available_cores

    torch.set_num_threads(1)  # the reference runs on one thread, as a worker does
    print(header(f"bench_data: {opt.img} px from {opt.source_px[0]}-{opt.source_px[1]} px sources, "
                 f"{opt.samples} samples a pass, median [min-max] of {opt.repeats} passes"))
    reference = Reference(n=512, runs=opt.repeats)
    reference.measure()
    with tempfile.TemporaryDirectory() as tmp:
        data = ensure_synthetic(Path(tmp) / "set", n_train=opt.images, n_val=1, img_size=tuple(opt.source_px), seed=0)
        passes, scaling = measure_trees(data, opt)
        if opt.scan_images:
            small = ensure_synthetic(Path(tmp) / "scan", n_train=opt.scan_images, n_val=1, img_size=(128, 160))
            scan_ms, load_ms = bench_scan(small / "images" / "train", 3)
        if opt.cache_images:
            big = ensure_synthetic(Path(tmp) / "cache", n_train=opt.cache_images, n_val=1, img_size=(480, 640))
            cache_rows = cache_memory(big / "images" / "train", opt.img)
    reference.measure()
    print(reference.describe())
    print("\n".join(pipeline_rows(passes, opt, reference.seconds) + scaling_rows(scaling, opt)))
    if opt.compare is not None:
        print(f"(compare = {opt.compare}; speed-up = compare's time / this tree's, per pair of passes)")
    if opt.cache_images:
        print("\n".join(cache_rows))
    if opt.scan_images:
        print(f"label scan (pool of {available_cores()}, {opt.scan_images} images): {scan_ms:.2f} s per 1,000 "
              f"images; cache load: {load_ms:.3f} s per 1,000 images ({scan_ms / max(load_ms, 1e-9):.0f}x faster)")


if __name__ == "__main__":
    main(parse_opt())
