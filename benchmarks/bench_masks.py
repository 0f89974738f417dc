"""What outlines cost a training sample: the overlap index image at 1/4 and the outlines' warp, against baselines
timed in the same run.

    python benchmarks/bench_masks.py                 # 640 px, 8 objects of 1000 points, 20 repeats
    python benchmarks/bench_masks.py --objects 30 --quick

- "index image": utils.tasks.segment.masks.overlap_index at 1/4 resolution (the exact fill, straight at
  160 x 160) against the
  reference's way (cv2.fillPoly of each outline at full size, whole-pixel vertices, then cv2.resize to 1/4, then
  the index image), both for the same outlines;
- "warp": utils.tasks.segment.augment.warp_segments (the outlines warped, clipped exactly, boxes from them) against
  utils.data.augment.warp_boxes (the boxes alone) for the same matrix.
One process, one thread (a DataLoader worker's); the variants take turns each repeat, so a change in load hits
both; figures are medians [min-max] of milliseconds per sample, and the ratio is the median of per-turn ratios.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks.harness import Stats, header  # noqa: E402
from utils.data.augment import _perspective_matrix, warp_boxes  # noqa: E402
from utils.tasks.segment.augment import polygon_boxes, resample_polygons, warp_segments  # noqa: E402
from utils.tasks.segment.masks import overlap_index  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_masks.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--img", type=int, default=640, help="sample size in pixels")
    p.add_argument("--objects", type=int, default=8, help="objects per sample")
    p.add_argument("--points", type=int, default=1000, help="points per outline (the augmentation's count)")
    p.add_argument("--repeats", type=int, default=20, help="timed turns of each variant")
    p.add_argument("--quick", action="store_true", help="5 repeats")
    return p.parse_args(argv)


def outlines(rng: np.random.Generator, size: int, count: int, points: int) -> np.ndarray:
    """``count`` random star-shaped outlines of 5-40% of the image, resampled to ``points``."""
    shapes = []
    for _ in range(count):
        centre, radius = rng.uniform(0.1, 0.9, 2) * size, rng.uniform(0.05, 0.2) * size
        angles = np.sort(rng.uniform(0, 2 * np.pi, 24))
        radii = rng.uniform(0.5, 1.0, 24) * radius
        shapes.append(np.stack([centre[0] + radii * np.cos(angles), centre[1] + radii * np.sin(angles)], 1))
    return resample_polygons(shapes, points)


def reference_index(polygons: np.ndarray, size: int, ratio: int = 4) -> np.ndarray:
    """The reference's route to the same index image: fill at full size (whole-pixel vertices), resize, stack."""
    masks = []
    for polygon in polygons:
        mask = np.zeros((size, size), np.uint8)
        cv2.fillPoly(mask, [polygon.astype(np.int32).reshape(-1, 1, 2)], 1)
        masks.append(cv2.resize(mask, (size // ratio, size // ratio)))
    masks = np.array(masks)
    order = np.argsort(-masks.reshape(len(masks), -1).sum(1))
    index = np.zeros(masks.shape[1:], np.uint8)
    for rank, i in enumerate(order):
        index[masks[i] > 0] = rank + 1
    return index


def turns(first, second, repeats: int) -> tuple[Stats, Stats, Stats]:  # noqa: ANN001
    """Alternate the two callables ``repeats`` times: (ms of first, ms of second, per-turn first/second)."""
    a, b = [], []
    first(), second()  # warm-up
    for i in range(repeats):
        for fn, out in ((first, a), (second, b)) if i % 2 == 0 else ((second, b), (first, a)):
            start = time.perf_counter()
            fn()
            out.append((time.perf_counter() - start) * 1e3)
    return Stats.of(a), Stats.of(b), Stats.of(x / y for x, y in zip(a, b))


def main(opt: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    repeats = 5 if opt.quick else opt.repeats
    print(header(f"bench_masks: {opt.objects} objects of {opt.points} points at {opt.img} px, {repeats} turns"))
    rng = np.random.default_rng(0)
    polygons = outlines(rng, opt.img, opt.objects, opt.points)
    ours, theirs, ratio = turns(lambda: overlap_index(polygons, (opt.img, opt.img), 4),
                                lambda: reference_index(polygons, opt.img), repeats)
    agree = (overlap_index(polygons, (opt.img, opt.img), 4)[0] > 0) == (reference_index(polygons, opt.img) > 0)
    print(f"index image at 1/4: exact fill {ours.fmt(2)} ms, reference route {theirs.fmt(2)} ms, "
          f"ratio {ratio.fmt(2)} (pixels agreeing on object/background: {agree.mean():.1%})")
    labels = np.concatenate((np.zeros((len(polygons), 1)), polygon_boxes(polygons)), 1).astype(np.float32)
    matrix, s = _perspective_matrix(rng, (opt.img, opt.img), (opt.img, opt.img), 10, 0.1, 0.5, 2, 0)
    segments, boxes, ratio = turns(lambda: warp_segments(labels, polygons, matrix, s, (opt.img, opt.img)),
                                   lambda: warp_boxes(labels, matrix, s, (opt.img, opt.img)), repeats)
    print(f"warp: outlines and boxes {segments.fmt(3)} ms, boxes alone {boxes.fmt(3)} ms, ratio {ratio.fmt(1)}")


if __name__ == "__main__":
    main(parse_opt())
