"""Worker for tests/test_data_ddp.py: two gloo ranks build the synthetic set and the label cache once.

Run under ``torch.distributed.run --nproc_per_node 2``. Usage: ``data_ddp_worker.py DATA_DIR OUT_DIR [SPLIT]``.
Each rank counts the generations and cache writes it performed itself and writes
``OUT_DIR/rank<r>.json`` with those counts, its scan summary and its sample order. With SPLIT (a YOLO txt images
folder), the ranks then scan it together (utils.data.formats.shared_scan_sources) and each records how many images
it checked and a digest of the scan it ended with.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from utils.data import datasets, formats, label_cache, synthetic
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader, set_epoch
from utils.distributed import comm as dist
from utils.log import setup_logging


def main(data_dir: Path, out_dir: Path) -> None:
    counts = {"generate": 0, "save_cache": 0}
    real_generate, real_save = synthetic.generate, label_cache.save_cache

    def counting_generate(*args):  # noqa: ANN002, ANN202
        counts["generate"] += 1
        return real_generate(*args)

    def counting_save(*args):  # noqa: ANN002, ANN202
        counts["save_cache"] += 1
        return real_save(*args)

    synthetic.generate, label_cache.save_cache = counting_generate, counting_save
    dist.init_distributed(device="cpu", backend="gloo", timeout_s=60, long_timeout_s=120)
    setup_logging(dist.get_rank())
    try:
        root = synthetic.ensure_synthetic(data_dir, n_train=10, n_val=4, img_size=64, seed=0)
        options = DatasetOptions(img_size=64, batch_size=2, nc=3, seed=0, cache="ram")
        loader, dataset = create_dataloader(root / "images" / "train", options, shuffle=True, workers=0)
        set_epoch(loader, 1)
        reads, real_imread = [0], datasets.cv2.imread
        datasets.cv2.imread = lambda *a: reads.__setitem__(0, reads[0] + 1) or real_imread(*a)
        order = [p for _, _, paths, _ in loader for p in paths]
        datasets.cv2.imread = real_imread
        maps = {word for line in open("/proc/self/maps") for word in line.split() if "yolo-ram-" in word}
        result = {"rank": dist.get_rank(), **counts, "found": dataset.scan.found, "order": order,
                  "decoded_in_epoch": reads[0], "cache_files": sorted(maps), "cached": len(dataset.ram)}
        if len(sys.argv) > 3:
            result.update(shared_scan(Path(sys.argv[3])))
        (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    finally:
        dist.cleanup()


def digest(scan: label_cache.ScanResult) -> str:
    """Every field of a scan, hashed (equal scans, equal digests)."""
    h = hashlib.sha1()
    for array in (scan.states, scan.shapes, scan.duplicates, *scan.labels):
        h.update(array.tobytes())
    h.update(json.dumps([scan.im_files, scan.messages, scan.repaired]).encode())
    return h.hexdigest()


def shared_scan(images: Path) -> dict:
    checked, real_scan = [], label_cache.scan_files

    def counting_scan(im_files, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        checked.append(len(im_files))
        return real_scan(im_files, *args, **kwargs)

    label_cache.scan_files = counting_scan
    try:
        scan = formats.shared_scan_sources(images, nc=3)
    finally:
        label_cache.scan_files = real_scan
    return {"shared_checked": checked, "shared_digest": digest(scan)}


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
