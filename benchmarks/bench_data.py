"""Data pipeline throughput: training images/s per worker at 640 px, and label-scan time per 1,000 images.

    python benchmarks/bench_data.py                 # defaults: 640 px, 48 images, 3 repeats
    python benchmarks/bench_data.py --img 320 --repeats 5

The training pipeline is mosaic + random perspective + HSV + flips + collate with hyp.scratch.yaml,
measured in this process (= one dataloader worker). The scan is the parallel image/label check
without a cache, and the cache load that replaces it on later runs. Figures are medians of repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cv2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.datasets import YoloDataset  # noqa: E402
from utils.device import available_cores  # noqa: E402
from utils.hyp import load_hyp  # noqa: E402
from utils.label_cache import (  # noqa: E402
    files_hash,
    img2label_paths,
    list_image_files,
    load_cache,
    save_cache,
    scan_files,
)
from utils.synthetic import ensure_synthetic  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img", type=int, default=640, help="training image size (pixels)")
    parser.add_argument("--images", type=int, default=48, help="source images for the pipeline benchmark")
    parser.add_argument("--scan-images", type=int, default=400, help="images for the label-scan benchmark")
    parser.add_argument("--batch", type=int, default=16, help="batch size for collate")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (the median is reported)")
    return parser.parse_args(argv)


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``."""
    return statistics.median(_timed(fn, repeats)[0])


def _timed(fn: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (this process) seconds of each of ``repeats`` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return walls, cpus


def bench_pipeline(images: Path, img_size: int, batch: int, repeats: int) -> tuple[float, float]:
    """Training images per second in one process (mosaic + perspective + HSV + flips + collate), by wall
    time and by this process's CPU time (what an idle core would give on a busy machine)."""
    dataset = YoloDataset(images, img_size=img_size, augment=True, hyp=load_hyp(), nc=3, seed=0)
    count = max(batch * 2, len(dataset))

    def one_pass() -> None:  # one epoch over ``count`` samples, batched and collated
        for start in range(0, count, batch):
            YoloDataset.collate_fn([dataset[i % len(dataset)] for i in range(start, min(start + batch, count))])

    one_pass()  # warm the file cache
    walls, cpus = _timed(one_pass, repeats)
    return count / statistics.median(walls), count / statistics.median(cpus)


def bench_scan(images: Path, repeats: int) -> tuple[float, float]:
    """Seconds per 1,000 images for a full check (no cache) and for a cache load."""
    im_files = list_image_files(images)
    label_files = img2label_paths(im_files)
    scan_s = median_time(lambda: scan_files(im_files, label_files, 3, show=False), repeats)
    result = scan_files(im_files, label_files, 3, show=False)
    cache = Path(label_files[0]).parent.with_suffix(".bench.cache")
    file_hash = files_hash(im_files, label_files, 3)
    save_cache(cache, result, file_hash)
    load_s = median_time(lambda: (files_hash(im_files, label_files, 3), load_cache(cache, file_hash)), repeats)
    return scan_s * 1000 / len(im_files), load_s * 1000 / len(im_files)


def main(opt: argparse.Namespace) -> None:
    """Generate a temporary synthetic set, measure, print the figures."""
    cv2.setNumThreads(0)  # as in a dataloader worker: one thread per worker
    with tempfile.TemporaryDirectory() as tmp:
        big = ensure_synthetic(Path(tmp) / "big", n_train=opt.images, n_val=1,
                               img_size=(opt.img * 3 // 4, opt.img), seed=0)
        small = ensure_synthetic(Path(tmp) / "small", n_train=opt.scan_images, n_val=1, img_size=(128, 160), seed=0)
        per_worker, per_cpu = bench_pipeline(big / "images" / "train", opt.img, opt.batch, opt.repeats)
        scan_ms, load_ms = bench_scan(small / "images" / "train", opt.repeats)
    print(f"training pipeline at {opt.img} px (mosaic+perspective+HSV+flip+collate): "
          f"{per_worker:.1f} images/s per worker by wall time, {per_cpu:.1f} per CPU-second (median of {opt.repeats})")
    print(f"label scan (pool of {available_cores()}, {opt.scan_images} images): {scan_ms:.2f} s per 1,000 images; "
          f"cache load: {load_ms:.3f} s per 1,000 images ({scan_ms / max(load_ms, 1e-9):.0f}x faster)")


if __name__ == "__main__":
    main(parse_opt())
