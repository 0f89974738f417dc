"""Images are decoded by content, never by name: every reader (the label scan, the datasets and their caches,
detect.py's sources) decodes through utils.data.image_io, which decodes only the formats it lists, decides the
format from the first bytes and the pixel count from the header, and opens only regular files."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from tests.helpers import GOOD_LABEL, make_set, write_jpg
from tests.utils.data.special_files import fifos
from utils.data.config import DataError
from utils.data.datasets import YoloDataset
from utils.data.image_io import ImageRefused, read_image
from utils.data.sources import LoadImages, SourceError

PICTURE = (np.random.default_rng(0).random((48, 64, 3)) * 255).astype(np.uint8)
# Formats OpenCV decodes by their content whatever the file's name, and this project does not list.
UNLISTED = {".hdr": "Radiance HDR", ".ppm": "PNM", ".pfm": "PFM", ".ras": "Sun raster", ".jp2": "JPEG 2000",
            ".gif": "GIF", ".avif": "AVIF"}
LISTED = {".jpg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".tiff": "TIFF", ".webp": "WEBP"}


def encoded(suffix: str) -> bytes:
    """PICTURE encoded by OpenCV in the format of ``suffix`` (float formats from the float picture)."""
    ok, buffer = cv2.imencode(suffix, PICTURE.astype(np.float32) / 255 if suffix in (".hdr", ".pfm") else PICTURE)
    assert ok
    return buffer.tobytes()


@pytest.mark.parametrize("suffix", list(UNLISTED))
def test_formats_opencv_decodes_by_content_but_not_listed_are_refused_everywhere(tmp_path: Path, suffix: str,
                                                                                  yolo_log: list[str]) -> None:
    data = encoded(suffix)
    assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).shape == (48, 64, 3)  # OpenCV would
    images = make_set(tmp_path, {"good.jpg": (write_jpg, GOOD_LABEL), "named.jpg": (lambda p: p.write_bytes(data),
                                                                                    GOOD_LABEL)})
    with pytest.raises(ImageRefused, match=f"its content is {UNLISTED[suffix]}"):
        read_image(images / "named.jpg")
    dataset = YoloDataset(images, img_size=64, nc=3)
    assert dataset.scan.line() == "1 found, 0 missing, 0 empty, 1 corrupt"
    assert any(f"named.jpg: ignoring corrupt image/label: not an image this project reads (JPEG, PNG, BMP, TIFF, "
               f"WebP): its content is {UNLISTED[suffix]}" in line for line in yolo_log)
    yolo_log.clear()
    source = LoadImages(images, img_size=64)
    assert [Path(f.path).name for f in source] == ["good.jpg"] and source.skipped == 1
    assert [line for line in yolo_log if "named.jpg" in line] == [
        f"WARNING: skipping unreadable image {images / 'named.jpg'}: not an image this project reads (JPEG, PNG, BMP, "
        f"TIFF, WebP): its content is {UNLISTED[suffix]}"]


@pytest.mark.parametrize("suffix", list(LISTED))
def test_listed_formats_are_read_by_content_and_measured_from_their_header(tmp_path: Path, suffix: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / ("image.png" if suffix != ".png" else "image.jpg")  # the name says another format
    path.write_bytes(encoded(suffix))
    image = read_image(path)
    assert image.shape == (48, 64, 3) and image.dtype == np.uint8
    if suffix != ".jpg":
        assert np.array_equal(image, PICTURE)  # lossless formats: exactly the pixels written
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 48 - 1)  # users may lower the limit
    with pytest.raises(ImageRefused, match="64x48 is more pixels than the decompression-bomb limit of 3071"):
        read_image(path)


def test_truncated_or_garbled_listed_images_are_refused_in_one_line(tmp_path: Path) -> None:
    for name, data in {"cut.png": encoded(".png")[:40], "text.jpg": b"\xff\xd8\xff" + b"x" * 50,
                       "empty.bmp": b"", "riff.webp": b"RIFF\x00\x00\x00\x00WAVEfmt "}.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ImageRefused) as info:
            read_image(tmp_path / name)
        assert "\n" not in str(info.value) and str(info.value), name


def test_an_image_changed_after_the_scan_is_refused_when_training_reads_it(tmp_path: Path) -> None:
    images = make_set(tmp_path, {"a.jpg": (write_jpg, GOOD_LABEL), "b.jpg": (write_jpg, GOOD_LABEL)})
    dataset = YoloDataset(images, img_size=64, nc=3)
    (images / "a.jpg").write_bytes(encoded(".hdr"))  # after the scan: the scan's verdict no longer holds
    with pytest.raises(DataError, match="a.jpg: not an image this project reads .JPEG, PNG, BMP, TIFF, WebP.: its "
                                        "content is Radiance HDR$"):
        dataset.load_image(0)


def test_a_disk_cache_array_that_does_not_hold_the_image_is_not_used(tmp_path: Path) -> None:
    images = make_set(tmp_path, {"a.jpg": (write_jpg, GOOD_LABEL)})
    dataset = YoloDataset(images, img_size=64, nc=3, cache="disk")
    npy = dataset._npy_path(0)
    decoded = read_image(images / "a.jpg")
    assert np.array_equal(dataset._read(0), decoded)
    for planted in (np.zeros((8, 8, 3), np.uint8), np.zeros((40, 48, 3), np.float32), np.zeros((40, 48), np.uint8)):
        np.save(npy, planted)  # newer than the image: would be read as it is
        assert np.array_equal(dataset._read(0), decoded)
    with open(npy, "wb") as f:  # a header declaring 30 GB that no data backs: never allocated
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (99999, 99999, 3)})
    assert np.array_equal(dataset._read(0), decoded)


def radiance_hdr(path: Path, side: int) -> Path:
    """A Radiance HDR of side x side pixels in run-length scanlines: 10000 px a side in 6.4 MB (issue 31's file)."""
    runs = [(127, b"\x80")] * (side // 127) + [(side % 127, b"\x80")] * bool(side % 127)
    channel = b"".join(bytes([128 + n]) + value for n, value in runs)
    line = bytes([2, 2, side >> 8, side & 255]) + channel * 4
    path.write_bytes(f"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y {side} +X {side}\n".encode() + line * side)
    return path


PEAK = """
import resource, sys
from utils.data.image_io import ImageRefused, read_image
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    read_image(sys.argv[1])
    print("decoded")
except ImageRefused as e:
    print("refused:", e)
print("grew_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_bombs_by_content_and_padding_are_refused_with_little_memory(tmp_path: Path) -> None:
    """Peak memory in a child process: the 6.4 MB HDR of 10000 x 10000 named .jpg (2 GB when OpenCV decoded it), a
    1 GB sparse file, and a small JPEG followed by 200 MB are refused having read at most their header."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    hdr = radiance_hdr(tmp_path / "photo.jpg", 10_000)
    assert 6_300_000 < hdr.stat().st_size < 6_500_000
    sparse = tmp_path / "sparse.jpg"
    with open(sparse, "wb") as f:
        f.truncate(1 << 30)
    padded = tmp_path / "padded.jpg"
    padded.write_bytes(encoded(".jpg"))
    with open(padded, "r+b") as f:
        f.truncate(200 << 20)
    expected = {hdr: "its content is Radiance HDR", sparse: "its content is of no known image format",
                padded: "209.7 MB, more than a 64x48 image can need"}
    for path, reason in expected.items():
        out = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, cwd=ROOT,
                             timeout=120).stdout
        assert reason in out.split("refused: ")[1] and int(out.split("grew_kb")[1]) < 16 * 1024, out


@pytest.mark.timeout(60)
def test_fifos_in_place_of_images_are_refused_not_waited_on(tmp_path: Path, yolo_log: list[str]) -> None:
    images = make_set(tmp_path / "set", {"good.jpg": (write_jpg, GOOD_LABEL)})
    (tmp_path / "set" / "labels" / "train" / "pipe.txt").write_text(GOOD_LABEL)
    listing = tmp_path / "list.txt"
    listing.write_text(f"{images / 'good.jpg'}\n{images / 'pipe.jpg'}\n")
    with fifos(images / "pipe.jpg", tmp_path / "video.mp4", tmp_path / "still.jpg"):
        with pytest.raises(ImageRefused, match="^not a regular file .a FIFO.$"):
            read_image(images / "pipe.jpg")
        dataset = YoloDataset(listing, img_size=64, nc=3)  # a YOLO .txt list naming the FIFO
        assert dataset.scan.line() == "1 found, 0 missing, 0 empty, 1 corrupt"
        assert any("pipe.jpg: ignoring corrupt image/label: not a regular file (a FIFO)" in line for line in yolo_log)
        source = LoadImages(listing, img_size=64)  # detect.py --source list.txt
        assert [Path(f.path).name for f in source] == ["good.jpg"] and source.skipped == 1
        (tmp_path / "media.txt").write_text(f"{tmp_path / 'still.jpg'}\n{tmp_path / 'video.mp4'}\n")
        with pytest.raises(SourceError, match="video.mp4 is not a regular file .a FIFO.$"):
            LoadImages(tmp_path / "media.txt", img_size=64)
    assert os.listdir(images) == ["good.jpg"]
