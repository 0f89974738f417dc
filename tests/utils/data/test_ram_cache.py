"""The shared RAM image cache: one mapping, exact views, read-only, nothing left in shared memory, stale files
of killed builds removed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from utils.data.ram_cache import PREFIX, build_shared, remove_stale, shm_dir


def test_build_packs_every_image_and_leaves_no_file() -> None:
    shapes = np.array([[4, 6], [3, 3], [5, 2]])
    images = [np.full((h, w, 3), i + 1, np.uint8) for i, (h, w) in enumerate(shapes)]
    cache = build_shared(lambda i: images[i], shapes, "unit")
    assert len(cache) == 3 and cache.nbytes == sum(h * w * 3 for h, w in shapes)
    for i, image in enumerate(images):
        assert np.array_equal(cache[i], image)
    with pytest.raises(ValueError):
        cache[0][0, 0, 0] = 9  # views are read-only: an augmentation must never write into the cache
    assert not list(shm_dir().glob(f"{PREFIX}{os.getpid()}-*"))


def test_stale_files_of_dead_builders_are_removed(tmp_path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f"{PREFIX}{dead}-abc").write_bytes(b"x")
    (tmp_path / f"{PREFIX}{os.getpid()}-abc").write_bytes(b"x")  # alive: kept
    (tmp_path / "other-file").write_bytes(b"x")
    assert remove_stale(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{PREFIX}{os.getpid()}-abc", "other-file"])
