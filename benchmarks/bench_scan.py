"""The label scan shared by every rank: labels/s of one process, and the speed-up when 2 ranks share the scan.

    python benchmarks/bench_scan.py                       # 100 000 images, 3 repeats of each
    python benchmarks/bench_scan.py --images 20000 --repeats 2

A split of ``--images`` tiny JPEGs (16x16 px, one file's bytes written again under each name) with one label row
each is generated into a temporary folder under ``--folder`` (default /dev/shm where there is one: in memory, so
the figures are the checking work, not a disk's latency; 100 000 pairs take about 800 MB there). Each process
checks with one core, as a machine of its own would with its cores: "1 process" is the scan one process does
alone (utils.data.label_cache.cached_scan's steps: hash, check every pair, write the cache); "2 ranks" is
utils.data.shared_scan.shared_scan in a 2-process gloo group, each rank checking its half, the halves gathered and
rank 0 writing the cache (the time of the slower rank). The cache is removed before each scan. The two take turns
(ABAB), and the speed-up is the median of the per-pair ratios. Figures are medians [min-max] of wall time, and
each process's labels per CPU second with the speed-up in CPU time of the busiest process (what the wall clock
shows where each rank has its own cores; on a machine whose cores others share, the wall clock cannot).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks.harness import Stats, free_port, header  # noqa: E402

WORLD = 2


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100_000, help="images (and label files) in the split")
    parser.add_argument("--repeats", type=int, default=3, help="scans of each kind")
    parser.add_argument("--folder", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
                        help="where the split is generated (a temporary folder inside it, removed after)")
    return parser.parse_args(argv)


def generate(root: Path, n_images: int) -> Path:
    """``root/images/*.jpg`` and ``root/labels/*.txt``: the same tiny JPEG and label row under ``n_images`` names."""
    import cv2
    import numpy as np

    images, labels = root / "images", root / "labels"
    images.mkdir(parents=True)
    labels.mkdir()
    pixels = np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    jpeg = cv2.imencode(".jpg", pixels)[1].tobytes()
    for i in range(n_images):
        (images / f"{i:07d}.jpg").write_bytes(jpeg)
        (labels / f"{i:07d}.txt").write_bytes(b"0 0.5 0.5 0.25 0.25\n")
    return images


def _quiet() -> None:
    """One thread, no progress bars."""
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the process's whole life)


def _single(images: str, queue: multiprocessing.Queue) -> None:
    """What one process does alone with one core: cached_scan's steps (hash, check every pair, write the cache)."""
    _quiet()
    from utils.data import label_cache

    im_files = label_cache.list_image_files(images)
    label_files = label_cache.img2label_paths(im_files)
    path = label_cache.cache_path_for(label_files)
    path.unlink(missing_ok=True)
    start, cpu = time.perf_counter(), time.process_time()
    file_hash = label_cache.files_hash(im_files, label_files, 1)
    result = label_cache.scan_files(im_files, label_files, 1, repair_dir=path.with_suffix(".cache.d"), cores=1)
    label_cache.save_cache(path, result, file_hash)
    queue.put((time.perf_counter() - start, [time.process_time() - cpu], result.summary().found))


def _rank(rank: int, port: int, images: str, queue: multiprocessing.Queue) -> None:
    _quiet()  # and one core each: 2 local ranks share the machine's cores (2 here)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
                       "LOCAL_WORLD_SIZE": str(WORLD),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    from utils.data import label_cache, shared_scan
    from utils.distributed import comm as dist

    dist.init_distributed(device="cpu", backend="gloo", timeout_s=600, long_timeout_s=1200)
    try:
        im_files = label_cache.list_image_files(images)
        label_files = label_cache.img2label_paths(im_files)
        if rank == 0:
            label_cache.cache_path_for(label_files).unlink(missing_ok=True)
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        result = shared_scan.shared_scan(im_files, label_files, nc=1)
        gathered = dist.all_gather_object((time.perf_counter() - start, time.process_time() - cpu))
        if rank == 0:
            queue.put((max(s for s, _ in gathered), [c for _, c in gathered], result.summary().found))
    finally:
        dist.cleanup()


def timed(kind: str, images: Path) -> tuple[float, list[float], int]:
    """One scan of ``kind`` (single or ranks) in fresh processes: (wall seconds of the slowest process, each
    process's CPU seconds, images found)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    if kind == "single":
        procs = [context.Process(target=_single, args=(str(images), queue))]
    else:
        port = free_port()
        procs = [context.Process(target=_rank, args=(rank, port, str(images), queue)) for rank in range(WORLD)]
    for proc in procs:
        proc.start()
    seconds, cpu, found = queue.get(timeout=3600)
    for proc in procs:
        proc.join()
        if proc.exitcode:
            raise SystemExit(f"bench_scan: a {kind} scan process exited with {proc.exitcode}")
    return seconds, cpu, found


def main(opt: argparse.Namespace) -> dict[str, Stats]:
    print(header(f"label scan of {opt.images} images: 1 process vs {WORLD} ranks sharing it, one core each"))
    folder = Path(tempfile.mkdtemp(prefix="yolo-bench-scan-", dir=opt.folder))
    try:
        start = time.perf_counter()
        images = generate(folder / "split", opt.images)
        print(f"generated {opt.images} images and label files in {time.perf_counter() - start:.1f} s")
        single, ranks, cpu = [], [], {"single": [], "ranks": []}
        for _ in range(opt.repeats):
            for kind, times in (("single", single), ("ranks", ranks)):
                seconds, per_process, found = timed(kind, images)
                if found != opt.images:
                    raise SystemExit(f"bench_scan: the {kind} scan found {found} of {opt.images} images")
                times.append(seconds)
                cpu[kind].append(per_process)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    figures = {"single_s": Stats.of(single), "ranks_s": Stats.of(ranks),
               "cpu_single": Stats.of(opt.images / c for (c,) in cpu["single"]),
               "cpu_ranks": Stats.of(opt.images / WORLD / c for pair in cpu["ranks"] for c in pair),
               "cpu_speedup": Stats.of(a / max(b) for (a,), b in zip(cpu["single"], cpu["ranks"])),
               "speedup": Stats.of(a / b for a, b in zip(single, ranks))}
    for kind, name in (("single", "1 process"), ("ranks", f"{WORLD} ranks")):
        wall, cpu = figures[f"{kind}_s"], figures[f"cpu_{kind}"]
        print(f"{name:9s}: {wall.median:7.2f} s [{wall.low:.2f}-{wall.high:.2f}], {opt.images / wall.median:7.0f} "
              f"labels/s in all; per process {cpu.median:7.0f} labels per CPU second [{cpu.low:.0f}-{cpu.high:.0f}]")
    print(f"speed-up  : {figures['speedup'].median:.2f}x [{figures['speedup'].low:.2f}-{figures['speedup'].high:.2f}]"
          f" ({WORLD} ranks vs 1 process, median of {opt.repeats} pairs)")
    print(f"speed-up in CPU time of the busiest process: {figures['cpu_speedup'].median:.2f}x "
          f"[{figures['cpu_speedup'].low:.2f}-{figures['cpu_speedup'].high:.2f}] (the wall-clock speed-up where each "
          "rank has its cores to itself)")
    return figures


if __name__ == "__main__":
    main(parse_opt())
