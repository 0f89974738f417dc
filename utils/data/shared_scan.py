"""The label scan of a YOLO txt split shared by every rank of every machine under DDP: each rank checks its
contiguous share, the shares travel as a few plain arrays (what a task's labels add too, for a scan that keeps
it) and are merged into the
one-process scan, and the cache is written once (utils.data.label_cache holds the scan and the cache themselves;
they are called through that module, so whatever wraps them there wraps them here too)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from utils.data import label_cache
from utils.data.label_cache import ScanResult, check_sample
from utils.distributed import comm as dist
from utils.log import LOGGER


def share_of(n_items: int, rank: int, world: int) -> range:
    """Rank ``rank``'s contiguous share of ``n_items`` split over ``world`` ranks (sizes differ by at most one)."""
    base, extra = divmod(n_items, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def packed(result: ScanResult) -> dict[str, Any]:
    """A scan as a few plain arrays, for the gather (one pickled array per image would cost far more)."""
    return {"states": result.states, "shapes": result.shapes, "duplicates": result.duplicates,
            "counts": np.array([len(lab) for lab in result.labels], np.int64),
            "labels": np.concatenate(result.labels, 0) if result.labels else np.zeros((0, 5), np.float32),
            "messages": result.messages, "repaired": [bool(r) for r in result.repaired],
            "extras": None if result.extras is None else (
                np.array([len(image) for image in result.extras], np.int64),
                *label_cache.pack_points([s for image in result.extras for s in image]))}


def merged(parts: Sequence[dict[str, Any]], im_files: Sequence[str], repair_dir: Path) -> ScanResult:
    """The gathered shares, in rank order, as one scan of ``im_files`` (this machine's paths). An image another
    machine repaired is repaired here too, into this machine's ``repair_dir``, unless that copy exists."""
    counts = np.concatenate([p["counts"] for p in parts])
    labels = np.split(np.concatenate([p["labels"] for p in parts]), np.cumsum(counts)[:-1]) if len(counts) else []
    repaired = [""] * len(im_files)
    for i in np.flatnonzero([f for p in parts for f in p["repaired"]]):
        copy = repair_dir / label_cache.copy_name(im_files[i], ".jpg")
        if not copy.is_file():
            with contextlib.suppress(OSError, ValueError):  # as scan_files: read the original as it is
                copy = label_cache.repair_jpeg(im_files[i], repair_dir)
        repaired[i] = str(copy) if copy.is_file() else ""
    return ScanResult(list(im_files), np.concatenate([p["states"] for p in parts]),
                      np.concatenate([p["shapes"] for p in parts]), labels,
                      np.concatenate([p["duplicates"] for p in parts]), [m for p in parts for m in p["messages"]],
                      repaired, merged_extras(parts))


def merged_extras(parts: Sequence[dict[str, Any]]) -> list[list[np.ndarray | None]] | None:
    """The gathered shares' extras (what a task's labels add) per image (None for a box scan)."""
    if any(p["extras"] is None for p in parts):
        return None
    merged = []
    for per_image, points, offsets in (p["extras"] for p in parts):
        objects = label_cache.unpack_points(points, offsets)
        bounds = np.concatenate(([0], np.cumsum(per_image)))
        merged += [objects[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    return merged


def shared_scan(im_files: Sequence[str], label_files: Sequence[str], nc: int | None, prefix: str = "",
                check: Any = check_sample, kind: str = "") -> ScanResult | None:
    """Under DDP: the scan of a YOLO txt split shared by every rank of every machine, when any rank lacks a valid
    cache. Each rank checks its contiguous share with its share of its machine's cores, the shares are gathered
    (equal to one process's scan), and rank 0 writes the cache; on a machine that does not see rank 0's file, its
    local rank 0 writes its own. None when every rank's cache was valid (nothing scanned). ``check`` and ``kind``
    as cached_scan's. All ranks must call it."""
    path = label_cache.cache_path_for(label_files, kind)
    file_hash = label_cache.files_hash(im_files, label_files, nc, kind)
    if all(dist.all_gather_object(label_cache.load_cache(path, file_hash) is not None, long=True)):
        return None
    share, world = share_of(len(im_files), dist.get_rank(), dist.get_world_size()), dist.get_world_size()
    repair_dir = label_cache.cache_dir_for(label_files) / "repaired"
    desc = f"{prefix}Scanning '{path.parent / path.stem}' images and labels ({world} ranks, this one's share)..."
    mine = label_cache.scan_files(im_files[share.start:share.stop], label_files[share.start:share.stop], nc,
                                  desc=desc, show=dist.is_main_process(), repair_dir=repair_dir,
                                  cores=dist.cpu_share(), check=check)
    result = merged(dist.all_gather_object(packed(mine), long=True), im_files, repair_dir)
    if dist.is_main_process() and label_cache.save_cache(path, result, file_hash):
        LOGGER.info(f"{prefix}New cache created: {path}")
    dist.barrier(long=True)  # rank 0's file is whole before another machine looks for it
    if dist.is_local_main_process() and not dist.is_main_process() \
            and label_cache.load_cache(path, file_hash) is None:
        label_cache.save_cache(path, result, file_hash)
    return result
