"""Data YAMLs, label checks (one test per bad input, exact counts), the label cache, and dataset samples."""

from __future__ import annotations

import multiprocessing.pool
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from utils import datasets
from utils.datasets import DataError, YoloDataset, img2label_paths, load_data_config, safe_extract

GOOD_LABEL = "0 0.5 0.5 0.25 0.25\n"


def _jpg(path: Path, h: int = 40, w: int = 48) -> None:
    cv2.imwrite(str(path), np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8))


def _truncated_jpg(path: Path) -> None:
    _jpg(path)
    path.write_bytes(path.read_bytes()[:-300])


def _png(channels: int, dtype: type = np.uint8) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        shape = (30, 36) if channels == 1 else (30, 36, channels)
        cv2.imwrite(str(path), (np.random.default_rng(1).random(shape) * np.iinfo(dtype).max).astype(dtype))
    return write


CASES = {  # name: (image file, writer, label text or None, (found, missing, empty, corrupt, duplicates))
    "truncated_jpeg": ("a.jpg", _truncated_jpg, GOOD_LABEL, (2, 0, 0, 0, 0)),
    "zero_byte": ("a.jpg", lambda p: p.write_bytes(b""), GOOD_LABEL, (1, 0, 0, 1, 0)),
    "text_as_jpg": ("a.jpg", lambda p: p.write_text("not an image\n"), GOOD_LABEL, (1, 0, 0, 1, 0)),
    "grayscale_png": ("a.png", _png(1), GOOD_LABEL, (2, 0, 0, 0, 0)),
    "rgba_png": ("a.png", _png(4), GOOD_LABEL, (2, 0, 0, 0, 0)),
    "png_16bit": ("a.png", _png(3, np.uint16), GOOD_LABEL, (2, 0, 0, 0, 0)),
    "image_8x900": ("a.jpg", lambda p: _jpg(p, 900, 8), GOOD_LABEL, (1, 0, 0, 1, 0)),
    "coordinate_out_of_range": ("a.jpg", _jpg, "0 1.5 0.5 0.2 0.2\n", (1, 0, 0, 1, 0)),
    "tiny_overshoot_clipped": ("a.jpg", _jpg, "0 0.5 0.5 0.2 1.0004\n", (2, 0, 0, 0, 0)),
    "negative_class": ("a.jpg", _jpg, "-1 0.5 0.5 0.2 0.2\n", (1, 0, 0, 1, 0)),
    "class_ge_nc": ("a.jpg", _jpg, "3 0.5 0.5 0.2 0.2\n", (1, 0, 0, 1, 0)),
    "four_columns": ("a.jpg", _jpg, "0 0.5 0.5 0.2\n", (1, 0, 0, 1, 0)),
    "six_columns": ("a.jpg", _jpg, "0 0.5 0.5 0.2 0.2 0.9\n", (1, 0, 0, 1, 0)),
    "non_numeric": ("a.jpg", _jpg, "zero 0.5 0.5 0.2 0.2\n", (1, 0, 0, 1, 0)),
    "duplicate_rows": ("a.jpg", _jpg, "1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n2 0.3 0.3 0.1 0.1\n", (2, 0, 0, 0, 1)),
    "missing_label_file": ("a.jpg", _jpg, None, (1, 1, 0, 0, 0)),
    "empty_label_file": ("a.jpg", _jpg, "\n", (2, 0, 1, 0, 0)),
}
KEPT = {"found": 1, "missing": 1, "empty": 1}  # images kept per outcome (corrupt ones are skipped)


def make_set(root: Path, files: dict[str, tuple[Callable[[Path], None], str | None]]) -> Path:
    """images/train/<name> written by its writer, labels/train/<stem>.txt with the text (None: no file)."""
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for name, (writer, label) in files.items():
        writer(root / "images" / "train" / name)
        if label is not None:
            (root / "labels" / "train" / f"{Path(name).stem}.txt").write_text(label)
    return root / "images" / "train"


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_outcome_and_exact_counts(tmp_path: Path, case: str, yolo_log: list[str]) -> None:
    name, writer, label, (found, missing, empty, corrupt, duplicates) = CASES[case]
    images = make_set(tmp_path, {"good.jpg": (_jpg, GOOD_LABEL), name: (writer, label)})
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


def test_truncated_jpeg_is_repaired_and_noted(tmp_path: Path) -> None:
    images = make_set(tmp_path, {"a.jpg": (_truncated_jpg, GOOD_LABEL)})
    ds = YoloDataset(images, img_size=64, nc=3)
    assert (images / "a.jpg").read_bytes()[-2:] == b"\xff\xd9"
    assert any("restored" in w for w in ds.scan.warnings)
    assert ds.load_image(0)[0].shape[:2] == (54, 64)  # 40x48 scaled to a long side of 64


def test_16bit_and_gray_png_load_as_8bit_3_channels(tmp_path: Path) -> None:
    images = make_set(tmp_path, {"g.png": (_png(1), None), "d.png": (_png(3, np.uint16), None)})
    ds = YoloDataset(images, img_size=36)
    for i in range(2):
        img = ds.load_image(i)[0]
        assert img.dtype == np.uint8 and img.shape == (30, 36, 3) and img.max() > 100


def test_exif_orientation_swaps_the_size(tmp_path: Path) -> None:
    def rotated(path: Path) -> None:
        exif = Image.Image.getexif(Image.new("RGB", (1, 1)))
        exif[0x0112] = 6  # rotate 90 degrees on display
        Image.fromarray(np.zeros((20, 50, 3), np.uint8)).save(path, exif=exif)

    ds = YoloDataset(make_set(tmp_path, {"r.jpg": (rotated, GOOD_LABEL)}), img_size=50, nc=3)
    assert ds.shapes[0].tolist() == [20, 50]  # (w, h) after rotation
    assert ds.load_image(0)[0].shape[:2] == (50, 20)


def test_duplicate_rows_are_dropped(tmp_path: Path) -> None:
    _, writer, label, _ = CASES["duplicate_rows"]
    ds = YoloDataset(make_set(tmp_path, {"a.jpg": (writer, label)}), img_size=64, nc=3)
    assert np.allclose(ds.labels[0], [[1, 0.5, 0.5, 0.2, 0.2], [2, 0.3, 0.3, 0.1, 0.1]])
    assert "1 duplicate labels removed" in ds.scan.warnings[0]


def test_all_corrupt_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no usable images"):
        YoloDataset(make_set(tmp_path, {"a.jpg": (lambda p: p.write_bytes(b""), None)}), img_size=64)


# ------------------------------------------------------------------------------------------------- cache
def test_cache_reused_then_rebuilt_when_a_label_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = make_set(tmp_path, {f"{i}.jpg": (_jpg, GOOD_LABEL) for i in range(3)})
    scans: list[int] = []
    real_scan = datasets.scan_files
    monkeypatch.setattr(datasets, "scan_files", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    YoloDataset(images, img_size=64, nc=3)
    cache = tmp_path / "labels" / "train.cache"
    assert cache.is_file() and len(scans) == 1
    with np.load(cache, allow_pickle=False) as z:  # plain arrays: no pickled objects inside
        assert int(z["version"]) == datasets.CACHE_VERSION and len(z["im_files"]) == 3
    ds = YoloDataset(images, img_size=64, nc=3)
    assert len(scans) == 1 and np.allclose(ds.labels[1], [[0, 0.5, 0.5, 0.25, 0.25]])
    (tmp_path / "labels" / "train" / "1.txt").write_text("2 0.4 0.4 0.1 0.1\n")
    ds = YoloDataset(images, img_size=64, nc=3)
    assert len(scans) == 2 and np.allclose(ds.labels[1], [[2, 0.4, 0.4, 0.1, 0.1]])
    YoloDataset(images, img_size=64, nc=2)  # nc decides validity: a different nc rescans
    assert len(scans) == 3


def test_unreadable_cache_is_rebuilt(tmp_path: Path) -> None:
    images = make_set(tmp_path, {"a.jpg": (_jpg, GOOD_LABEL)})
    (tmp_path / "labels" / "train.cache").write_bytes(b"\x80\x04garbage")
    ds = YoloDataset(images, img_size=64, nc=3)
    assert ds.scan.found == 1
    assert datasets.load_cache(tmp_path / "labels" / "train.cache", datasets.files_hash(
        ds.im_files, ds.label_files, 3)) is not None
    assert not list((tmp_path / "labels").glob("*.tmp*"))


# ---------------------------------------------------------------------------------------------- data YAML
def test_yaml_paths_names_and_errors(tmp_path: Path) -> None:
    images = make_set(tmp_path / "set", {"a.jpg": (_jpg, GOOD_LABEL)})
    (tmp_path / "list.txt").write_text("./set/images/train/a.jpg\n")
    good = tmp_path / "d.yaml"
    good.write_text(f"path: {tmp_path}\ntrain: [set/images/train, list.txt]\nval: set/images/train\n"
                    "names: {0: cat, 1: dog}\n")
    config = load_data_config(good)
    assert config.nc == 2 and config.names == ["cat", "dog"] and config.train[0] == images
    assert datasets.list_image_files(config.train) == [str(images / "a.jpg")] * 2
    (tmp_path / "bad_nc.yaml").write_text("train: set/images/train\nval: set/images/train\nnc: 3\nnames: [a]\n")
    with pytest.raises(DataError, match="nc is 3"):
        load_data_config(tmp_path / "bad_nc.yaml")
    (tmp_path / "no_split.yaml").write_text("train: set/images/train\nval: nowhere\nnc: 1\n")
    with pytest.raises(DataError, match=str(tmp_path / "nowhere")):
        load_data_config(tmp_path / "no_split.yaml")
    with pytest.raises(DataError, match="not found"):
        load_data_config(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("train: [unclosed\n")
    with pytest.raises(DataError, match="YAML"):
        load_data_config(tmp_path / "broken.yaml")


def test_shipped_yamls_parse() -> None:
    for name in ("coco128.yaml", "coco.yaml"):
        data = datasets._read_yaml(datasets.ROOT / "data" / name)
        nc, names = datasets._parse_names(data, Path(name))
        assert nc == 80 and len(names) == 80 and data["download"]
    hyp = datasets.load_hyp()
    assert hyp["lr0"] == 0.01 and hyp["mosaic"] == 1.0 and hyp["anchor_t"] == 4.0
    assert datasets.load_hyp("hyp.finetune.yaml")["lr0"] < hyp["lr0"]


def test_safe_extract_refuses_escaping_members(tmp_path: Path) -> None:
    good, evil = tmp_path / "good.zip", tmp_path / "evil.zip"
    with zipfile.ZipFile(good, "w") as z:
        z.writestr("set/images/a.txt", "x")
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("ok.txt", "x")
        z.writestr("../escaped.txt", "x")
    assert (tmp_path / "out" / "set" / "images" / "a.txt") in safe_extract(good, tmp_path / "out")
    with pytest.raises(DataError, match="outside"):
        safe_extract(evil, tmp_path / "out2")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "out2" / "ok.txt").exists()


def test_img2label_paths_replaces_the_last_images_folder() -> None:
    assert img2label_paths(["/d/images/x/images/a.b.jpg"]) == ["/d/images/x/labels/a.b.txt"]


# ------------------------------------------------------------------------------------------------ samples
def test_sample_contract_and_rect_shapes(tiny_dataset: Path) -> None:
    config = load_data_config(tiny_dataset)
    ds = YoloDataset(config.val, img_size=96, batch_size=4, rect=True, pad=0.5, nc=3)
    img, targets, path, ((h0, w0), ((rh, rw), (pw, ph))) = ds[0]
    assert img.shape[0] == 3 and img.shape[1] % 32 == 0 and img.shape[2] % 32 == 0
    assert targets.shape[1] == 6 and (targets[:, 0] == 0).all() and len(targets) == len(ds.labels[0])
    assert path == ds.im_files[0] and (h0, w0) == (int(ds.shapes[0][1]), int(ds.shapes[0][0]))
    ratios = ds.shapes[:, 1] / ds.shapes[:, 0]
    assert (np.diff(ratios) >= 0).all()  # sorted by aspect ratio
    batch = YoloDataset.collate_fn([ds[i] for i in range(4)])
    assert batch[0].shape[0] == 4 and batch[0].dtype == torch.uint8
    assert batch[1][:, 0].tolist() == sorted(batch[1][:, 0].tolist())


def test_process_pool_scan_matches_the_thread_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {f"{case}{Path(name).suffix}": (writer, label) for case, (name, writer, label, _) in CASES.items()}
    images = make_set(tmp_path, files)
    im_files = datasets.list_image_files(images)
    label_files = img2label_paths(im_files)
    threads = datasets.scan_files(im_files, label_files, 3, show=False)
    monkeypatch.setattr(datasets, "PROCESS_POOL_MIN", 0)
    with datasets._check_pool(len(im_files)) as pool:
        assert type(pool) is multiprocessing.pool.Pool  # processes, not threads
    processes = datasets.scan_files(im_files, label_files, 3, show=False)
    assert processes.summary().line() == threads.summary().line()
    assert processes.summary().line() == "7 found, 1 missing, 1 empty, 9 corrupt, 1 duplicate rows removed"
    assert [len(lab) for lab in processes.labels] == [len(lab) for lab in threads.labels]


def test_image_caches_give_the_same_pixels(tmp_path: Path) -> None:
    images = make_set(tmp_path, {f"{i}.jpg": (_jpg, GOOD_LABEL) for i in range(3)})
    plain = YoloDataset(images, img_size=64, nc=3)
    ram = YoloDataset(images, img_size=64, nc=3, cache="ram")
    disk = YoloDataset(images, img_size=64, nc=3, cache="disk")
    assert all(im is not None for im in ram.ims) and all(im is None for im in disk.ims)
    assert sorted(p.name for p in images.glob("*.npy")) == ["0.npy", "1.npy", "2.npy"]
    for i in range(3):
        assert torch.equal(plain[i][0], ram[i][0]) and torch.equal(plain[i][0], disk[i][0])
    np.save(images / "1.npy", np.zeros((40, 48, 3), np.uint8))  # a damaged cache entry ...
    os.utime(images / "1.npy", ns=(0, 0))  # ... older than its image is ignored
    assert torch.equal(disk[1][0], plain[1][0])


def test_missing_data_is_downloaded_and_extracted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "mini.zip"
    with zipfile.ZipFile(source, "w") as z:  # the zip holds the data set's folder, as coco128.zip does
        z.writestr("mini/images/train/a.jpg", cv2.imencode(".jpg", np.zeros((20, 20, 3), np.uint8))[1].tobytes())
        z.writestr("mini/labels/train/a.txt", GOOD_LABEL)
    data = tmp_path / "cfg" / "mini.yaml"
    data.parent.mkdir()
    data.write_text(f"path: mini\ntrain: images/train\nval: images/train\nnc: 1\ndownload: {source.as_uri()}\n")
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    config = load_data_config(data)  # a file:// URL: the real download code, without a network
    assert config.root == tmp_path / "home" / "mini" and (config.train[0] / "a.jpg").is_file()
    assert not list((tmp_path / "home").glob("*.zip*"))  # the archive is removed after extraction
    assert YoloDataset(config.train, img_size=32, nc=1).scan.found == 1
