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


def small_shm_job(size: str, *cmd: str) -> list[str]:
    """``cmd`` run with a tmpfs of ``size`` mounted over /dev/shm in a private mount namespace (we are root)."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to mount a small /dev/shm for this test")
    inner = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$0" "$@"'
    return ["unshare", "-m", "sh", "-c", inner, *cmd]


@pytest.mark.slow
def test_cache_ram_training_with_a_16_mb_dev_shm_completes_with_one_warning(tiny_dataset, tiny_cfg_file,
                                                                            tmp_path) -> None:
    """Docker's 64 MB /dev/shm scaled to the tiny set: the RAM cache fits, the workers' batches (16 images of
    320 px, 4 prefetched per worker: 25 MB) do not, so the loaders make their batches in the training process."""
    from tests.helpers import job_env, run_job, train_args

    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path, "--cache", "ram", epochs=1)
    args[args.index("--img-size") + 1], args[args.index("--batch-size") + 1] = "320", "16"
    args[args.index("--workers") + 1] = "2"
    code, out = run_job(small_shm_job("16m", sys.executable, *args), env=job_env())
    assert code == 0, out[-3000:]  # not "unable to allocate shared memory ... No space left on device"
    warnings = [line for line in out.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("train: WARNING: /dev/shm has ") and "--ipc=host or --shm-size larger than" in \
        warnings[0], warnings
    assert "Cached images to RAM" in out and "Using 0 dataloader workers" in out
    assert len((tmp_path / "exp" / "results.csv").read_text().strip().splitlines()) == 2  # header + the epoch


LOADER_JOB = """
import sys
sys.path.insert(0, sys.argv[1])
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader
from utils.log import setup_logging

setup_logging(0)
options = DatasetOptions(img_size=int(sys.argv[3]), batch_size=8, nc=3, augment=True, prefix="train: ")
loader, _ = create_dataloader(sys.argv[2], options, workers=2, shuffle=True)
print("workers", loader.num_workers, "batches", sum(1 for _ in loader), flush=True)
"""


@pytest.mark.parametrize("img_size, workers", [(64, 2), (256, 1), (320, 0)])
def test_workers_are_as_many_as_dev_shm_holds_their_batches(tiny_dataset, img_size: int, workers: int) -> None:
    """8 MB of /dev/shm and batches of 8 images, 4 prefetched per worker and 1 in use: 2 workers fit at 64 px
    (9 x 98 kB), 1 at 256 px (5 x 1.6 MB), none at 320 px (5 x 2.5 MB)."""
    import yaml

    from tests.helpers import ROOT, job_env, run_job

    data = yaml.safe_load(tiny_dataset.read_text())
    code, out = run_job(small_shm_job("8m", sys.executable, "-c", LOADER_JOB, str(ROOT),
                                      f"{data['path']}/{data['train']}", str(img_size)), env=job_env())
    assert code == 0, out[-3000:]
    assert f"workers {workers} batches 3" in out, out
    assert sum("WARNING" in line for line in out.splitlines()) == (workers < 2), out
