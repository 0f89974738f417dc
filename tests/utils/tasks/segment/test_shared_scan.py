"""The shared label scan gathers outlines too: a segment split's shares, packed as each rank sends them and merged,
equal the one-process scan (utils.data.shared_scan.packed / merged)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from utils.data import label_cache, shared_scan
from utils.tasks.segment.labels import check_segment_sample


def write_split(root: Path) -> tuple[list[str], list[str]]:
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    rows = {"a": "0 0.1 0.1 0.5 0.1 0.3 0.6\n1 0.6 0.6 0.9 0.6 0.9 0.9 0.6 0.9\n",
            "b": "",
            "c": "2 0.2 0.2 0.4 0.2 0.3 0.4\n",
            "d": "0 0.5 0.5 0.2 0.2\n"}  # a box row: an object with no outline
    for name, text in rows.items():
        cv2.imwrite(str(root / "images" / f"{name}.jpg"), np.full((32, 48, 3), 90, np.uint8))
        (root / "labels" / f"{name}.txt").write_text(text)
    images = sorted(str(p) for p in (root / "images").iterdir())
    return images, label_cache.img2label_paths(images)


def test_segment_shares_merge_into_the_one_process_scan(tmp_path: Path) -> None:
    images, labels = write_split(tmp_path)
    whole = label_cache.scan_files(images, labels, 3, show=False, check=check_segment_sample, cores=1)
    assert whole.extras is not None and [len(s) for s in whole.extras] == [2, 0, 1, 1]
    parts = [shared_scan.packed(label_cache.scan_files(images[s.start:s.stop], labels[s.start:s.stop], 3,
                                                        show=False, check=check_segment_sample, cores=1))
             for s in (shared_scan.share_of(len(images), r, 3) for r in range(3))]
    merged = shared_scan.merged(parts, images, tmp_path / "repaired")
    assert merged.extras is not None and len(merged.extras) == len(whole.extras)
    for got, want in zip(merged.extras, whole.extras):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert (g is None) == (w is None) and (g is None or np.array_equal(g, w))
    for got, want in zip(merged.labels, whole.labels):
        np.testing.assert_array_equal(got, want)


def test_box_shares_merge_with_no_outlines(tmp_path: Path) -> None:
    images, labels = write_split(tmp_path)
    parts = [shared_scan.packed(label_cache.scan_files(images[:2], labels[:2], 3, show=False, cores=1)),
             shared_scan.packed(label_cache.scan_files(images[2:], labels[2:], 3, show=False, cores=1))]
    assert shared_scan.merged(parts, images, tmp_path / "repaired").extras is None
