"""The label scan: one test per bad input with exact counts, repairs that never touch the user's files, the
cache (reused, rebuilt, damaged), and the process-pool scan."""

from __future__ import annotations

import hashlib
import multiprocessing.pool
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import GOOD_LABEL, make_set, png_writer, write_jpg, write_truncated_jpg
from utils.data import label_cache, shared_scan
from utils.data.datasets import YoloDataset
from utils.data.label_cache import img2label_paths

CASES = {  # name: (image file, writer, label text or None, (found, missing, empty, corrupt, duplicates))
    "truncated_jpeg": ("a.jpg", write_truncated_jpg, GOOD_LABEL, (2, 0, 0, 0, 0)),
    "zero_byte": ("a.jpg", lambda p: p.write_bytes(b""), GOOD_LABEL, (1, 0, 0, 1, 0)),
    "text_as_jpg": ("a.jpg", lambda p: p.write_text("not an image\n"), GOOD_LABEL, (1, 0, 0, 1, 0)),
    "grayscale_png": ("a.png", png_writer(1), GOOD_LABEL, (2, 0, 0, 0, 0)),
    "rgba_png": ("a.png", png_writer(4), GOOD_LABEL, (2, 0, 0, 0, 0)),
    "png_16bit": ("a.png", png_writer(3, np.uint16), GOOD_LABEL, (2, 0, 0, 0, 0)),
    "image_8x900": ("a.jpg", lambda p: write_jpg(p, 900, 8), GOOD_LABEL, (1, 0, 0, 1, 0)),
    "coordinate_out_of_range": ("a.jpg", write_jpg, "0 1.5 0.5 0.2 0.2\n", (1, 0, 0, 1, 0)),
    "tiny_overshoot_clipped": ("a.jpg", write_jpg, "0 0.5 0.5 0.2 1.0004\n", (2, 0, 0, 0, 0)),
    "negative_class": ("a.jpg", write_jpg, "-1 0.5 0.5 0.2 0.2\n", (1, 0, 0, 1, 0)),
    "class_ge_nc": ("a.jpg", write_jpg, "3 0.5 0.5 0.2 0.2\n", (1, 0, 0, 1, 0)),
    "four_columns": ("a.jpg", write_jpg, "0 0.5 0.5 0.2\n", (1, 0, 0, 1, 0)),
    "six_columns": ("a.jpg", write_jpg, "0 0.5 0.5 0.2 0.2 0.9\n", (1, 0, 0, 1, 0)),
    "non_numeric": ("a.jpg", write_jpg, "zero 0.5 0.5 0.2 0.2\n", (1, 0, 0, 1, 0)),
    "duplicate_rows": ("a.jpg", write_jpg, "1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n2 0.3 0.3 0.1 0.1\n",
                       (2, 0, 0, 0, 1)),
    "missing_label_file": ("a.jpg", write_jpg, None, (1, 1, 0, 0, 0)),
    "empty_label_file": ("a.jpg", write_jpg, "\n", (2, 0, 1, 0, 0)),
    "size_zero_in_float32": ("a.jpg", write_jpg, "0 .5 .5 1e-320 1e-320\n", (1, 0, 0, 1, 0)),  # > 0 in float64 only
    "decompression_bomb": ("a.png", lambda p: write_bomb_png(p), GOOD_LABEL, (1, 0, 0, 1, 0)),
}
def write_bomb_png(path: Path, side: int = 9500) -> None:
    """A PNG of 11 kB that decodes to side x side pixels (90 M: over Pillow's limit, where it only warns)."""
    from PIL import Image

    Image.new("1", (side, side)).save(path)


KEPT = {"found": 1, "missing": 1, "empty": 1}  # images kept per outcome (corrupt ones are skipped)




@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_outcome_and_exact_counts(tmp_path: Path, case: str, yolo_log: list[str]) -> None:
    name, writer, label, (found, missing, empty, corrupt, duplicates) = CASES[case]
    images = make_set(tmp_path, {"good.jpg": (write_jpg, GOOD_LABEL), name: (writer, label)})
    ds = YoloDataset(images, img_size=64, nc=3, prefix="train: ")
    scan = ds.scan
    assert (scan.found, scan.missing, scan.empty, scan.corrupt, scan.duplicates) == (
        found, missing, empty, corrupt, duplicates)
    assert len(ds) == 2 - corrupt
    summary = f"{found} found, {missing} missing, {empty} empty, {corrupt} corrupt"
    assert any(line.startswith("train: Scanning '") and summary in line for line in yolo_log)
    if corrupt:
        assert len(scan.warnings) == 1 and name in scan.warnings[0] and "corrupt" in scan.warnings[0]
        assert sum("WARNING" in line and name in line for line in yolo_log) == 1  # listed once
        return
    sample = ds[ds.im_files.index(str(images / name))]
    img, targets = sample[0], sample[1]
    assert img.dtype == torch.uint8 and img.shape == (3, 64, 64)
    expected_rows = {"missing_label_file": 0, "empty_label_file": 0, "duplicate_rows": 2}.get(case, 1)
    assert targets.shape == (expected_rows, 6)
    assert (targets[:, 2:] <= 1).all() and (targets[:, 2:] >= 0).all()


def test_truncated_jpeg_is_repaired_into_the_cache_folder_and_the_original_is_untouched(tmp_path: Path) -> None:
    images = make_set(tmp_path, {"a.jpg": (write_truncated_jpg, GOOD_LABEL), "b.jpg": (write_jpg, GOOD_LABEL)})
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    ds = YoloDataset(images, img_size=64, nc=3)
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(images.parent.parent.rglob("*"))
             if p.is_file() and ".cache" not in str(p.relative_to(tmp_path))}
    assert after == before  # every file the user had is byte-identical
    assert (images / "a.jpg").read_bytes()[-2:] != b"\xff\xd9"
    repaired = list((tmp_path / "labels" / "train.cache.d" / "repaired").glob("a-*.jpg"))
    assert len(repaired) == 1 and repaired[0].read_bytes()[-2:] == b"\xff\xd9"
    assert any("repaired" in w and "unchanged" in w for w in ds.scan.warnings)
    assert ds.read_files[ds.im_files.index(str(images / "a.jpg"))] == str(repaired[0])
    assert ds.load_image(0)[0].shape[:2] == (54, 64)  # 40x48 scaled to a long side of 64
    repaired[0].unlink()  # the copy lost: the original is read as it is
    assert ds.load_image(ds.im_files.index(str(images / "a.jpg")))[0].shape[:2] == (54, 64)


def test_cache_reused_then_rebuilt_when_a_label_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = make_set(tmp_path, {f"{i}.jpg": (write_jpg, GOOD_LABEL) for i in range(3)})
    scans: list[int] = []
    real_scan = label_cache.scan_files
    monkeypatch.setattr(label_cache, "scan_files", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    YoloDataset(images, img_size=64, nc=3)
    cache = tmp_path / "labels" / "train.cache"
    assert cache.is_file() and len(scans) == 1
    with np.load(cache, allow_pickle=False) as z:  # plain arrays: no pickled objects inside
        assert int(z["version"]) == label_cache.CACHE_VERSION and len(z["im_files"]) == 3
    ds = YoloDataset(images, img_size=64, nc=3)
    assert len(scans) == 1 and np.allclose(ds.labels[1], [[0, 0.5, 0.5, 0.25, 0.25]])
    (tmp_path / "labels" / "train" / "1.txt").write_text("2 0.4 0.4 0.1 0.1\n")
    ds = YoloDataset(images, img_size=64, nc=3)
    assert len(scans) == 2 and np.allclose(ds.labels[1], [[2, 0.4, 0.4, 0.1, 0.1]])
    YoloDataset(images, img_size=64, nc=2)  # nc decides validity: a different nc rescans
    assert len(scans) == 3


def test_unreadable_cache_is_rebuilt(tmp_path: Path) -> None:
    images = make_set(tmp_path, {"a.jpg": (write_jpg, GOOD_LABEL)})
    (tmp_path / "labels" / "train.cache").write_bytes(b"\x80\x04garbage")
    ds = YoloDataset(images, img_size=64, nc=3)
    assert ds.scan.found == 1
    assert label_cache.load_cache(tmp_path / "labels" / "train.cache", label_cache.files_hash(
        ds.im_files, ds.label_files, 3)) is not None
    assert not list((tmp_path / "labels").glob("*.tmp*"))


def test_a_compressed_cache_from_elsewhere_is_not_inflated_but_rebuilt(tmp_path: Path) -> None:
    """A cache shipped with a data set: numpy writes stored members, so a deflated one (a 200 kB file may inflate
    to gigabytes) is someone else's and is rebuilt, even when its hash matches."""
    images = make_set(tmp_path, {"a.jpg": (write_jpg, GOOD_LABEL)})
    ds = YoloDataset(images, img_size=64, nc=3)
    cache = tmp_path / "labels" / "train.cache"
    with np.load(cache, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["labels"] = np.array([[2, 0.1, 0.1, 0.1, 0.1]], np.float32)  # what a planted cache would claim
    with open(cache, "wb") as f:
        np.savez_compressed(f, **arrays)
    file_hash = label_cache.files_hash(ds.im_files, ds.label_files, 3)
    assert label_cache.load_cache(cache, file_hash) is None
    assert YoloDataset(images, img_size=64, nc=3).labels[0].tolist() == [[0, 0.5, 0.5, 0.25, 0.25]]


@pytest.mark.timeout(60)
def test_a_fifo_as_cache_or_label_file_is_not_waited_on(tmp_path: Path) -> None:
    from tests.utils.data.special_files import fifos

    images = make_set(tmp_path, {"a.jpg": (write_jpg, None), "b.jpg": (write_jpg, GOOD_LABEL)})
    with fifos(tmp_path / "labels" / "train.cache", tmp_path / "labels" / "train" / "a.txt"):
        ds = YoloDataset(images, img_size=64, nc=3)
        assert ds.scan.line() == "1 found, 1 missing, 0 empty, 0 corrupt"


def test_img2label_paths_replaces_the_last_images_folder() -> None:
    assert img2label_paths(["/d/images/x/images/a.b.jpg"]) == ["/d/images/x/labels/a.b.txt"]


def test_process_pool_scan_matches_the_thread_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {f"{case}{Path(name).suffix}": (writer, label) for case, (name, writer, label, _) in CASES.items()}
    images = make_set(tmp_path, files)
    im_files = label_cache.list_image_files(images)
    label_files = img2label_paths(im_files)
    threads = label_cache.scan_files(im_files, label_files, 3, show=False)
    monkeypatch.setattr(label_cache, "PROCESS_POOL_MIN", 0)
    with label_cache._check_pool(len(im_files)) as pool:
        assert type(pool) is multiprocessing.pool.Pool  # processes, not threads
    processes = label_cache.scan_files(im_files, label_files, 3, show=False)
    assert processes.summary().line() == threads.summary().line()
    assert processes.summary().line() == "7 found, 1 missing, 1 empty, 11 corrupt, 1 duplicate rows removed"
    assert [len(lab) for lab in processes.labels] == [len(lab) for lab in threads.labels]


@pytest.mark.parametrize("n_items, world", [(21, 2), (5, 4), (3, 5), (100_000, 3)])
def test_shares_of_a_shared_scan_cover_every_item_once_in_order(n_items: int, world: int) -> None:
    shares = [shared_scan.share_of(n_items, rank, world) for rank in range(world)]
    assert [i for share in shares for i in share] == list(range(n_items))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_gathered_scan_repairs_here_what_another_machine_repaired(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    write_truncated_jpg(images / "cut.jpg")
    write_jpg(images / "whole.jpg")
    im_files = [str(images / "cut.jpg"), str(images / "whole.jpg")]
    there = label_cache.scan_files(im_files, label_cache.img2label_paths(im_files), None, show=False,
                                   repair_dir=tmp_path / "there")  # the machine that scanned them
    assert [bool(r) for r in there.repaired] == [True, False]
    here = tmp_path / "here"
    merged = shared_scan.merged([shared_scan.packed(there)], im_files, here)
    assert merged.repaired == [str(here / label_cache.copy_name(im_files[0], ".jpg")), ""]
    assert Path(merged.repaired[0]).is_file() and merged.messages == there.messages
    assert (merged.states == there.states).all() and (merged.shapes == there.shapes).all()
