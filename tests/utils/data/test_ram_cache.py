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


def test_images_larger_than_the_available_memory_are_refused_before_writing(tmp_path, monkeypatch,
                                                                            yolo_log) -> None:
    from utils.data import ram_cache

    monkeypatch.setattr(ram_cache, "shm_dir", lambda: tmp_path)
    monkeypatch.setattr(ram_cache, "available_memory", lambda: 10 * 2**20)  # a machine with 10 MB available
    shapes = np.array([[2000, 2000]] * 2)
    assert build_shared(lambda i: np.zeros((2000, 2000, 3), np.uint8), shapes, "small") is None
    assert not list(tmp_path.iterdir())  # nothing was created, nothing left
    assert yolo_log == ["WARNING: --cache ram: the images need 24.0 MB and the machine has 10.5 MB of memory "
                        "available; use --cache disk (or fewer, smaller images); training without the RAM cache"]


SMALL_SHM = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader
from utils.log import setup_logging

setup_logging(0)
loader, dataset = create_dataloader(sys.argv[2], DatasetOptions(img_size=128, batch_size=4, nc=3, cache="ram"),
                                    workers=0)
print("ram cache:", dataset.ram, "batches:", sum(1 for _ in loader), flush=True)
"""


def test_cache_ram_with_a_small_dev_shm_warns_and_reads_from_disk(tiny_dataset) -> None:
    """A real small /dev/shm: a tmpfs of 256 KB mounted over it in a private mount namespace (we are root here)."""
    import shutil

    import yaml

    from tests.helpers import ROOT, job_env, run_job

    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to mount a small /dev/shm for this test")
    data = yaml.safe_load(tiny_dataset.read_text())
    images = f"{data['path']}/{data['train']}"  # 24 images: about 0.9 MB at 128 px
    inner = f"mount -t tmpfs -o size=256k tmpfs /dev/shm && exec {sys.executable} -c \"$0\" \"$@\""
    code, out = run_job(["unshare", "-m", "sh", "-c", inner, SMALL_SHM, str(ROOT), images], env=job_env())
    assert code == 0, out[-3000:]  # not 135 (SIGBUS)
    warning = next((line for line in out.splitlines() if "--cache ram" in line), "")
    assert warning.startswith("WARNING: --cache ram: the images need ") and "of shared memory and /dev/shm has " \
        in warning and "--ipc=host or --shm-size larger than" in warning and "or use --cache disk" in warning, out
    assert "ram cache: None batches: 6" in out, out
