"""Decoding image files that may come from strangers: the one door every reader goes through (the label scan,
the datasets, their RAM and disk caches, detect.py's sources, the hub's paths, export's sample image).

OpenCV picks its decoder from a file's content, not its name, and decodes formats Pillow cannot measure (a 6 MB
Radiance HDR named ``.jpg`` decodes to 10000 x 10000 pixels). So the format is decided here from the first bytes
and only JPEG (and MPO), PNG, BMP, TIFF (and DNG) and WebP are decoded; their pixel count is read from the header
by Pillow, restricted to that one format, and more than Pillow's decompression-bomb limit
(``PIL.Image.MAX_IMAGE_PIXELS``) is refused before a pixel is decoded. Files are opened only when they are regular
files, and read past their header only up to what their pixels can need (``file_cap``: 8 bytes a pixel and 16 MB,
at most MAX_IMAGE_FILE_BYTES). Every refusal is an ``ImageRefused`` (a ValueError) of one line.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from utils.data.regular_files import FileRefused, open_regular, read_capped, size_text

# A file larger than this is not read (the largest image within the pixel limit, 16-bit RGBA uncompressed: 716 MB).
MAX_IMAGE_FILE_BYTES = 1 << 30
# Nor one larger than its pixels can need: 8 bytes a pixel (16-bit RGBA, uncompressed) and this much for metadata.
IMAGE_SLACK_BYTES = 16 << 20
LISTED = "JPEG, PNG, BMP, TIFF, WebP"
REDUCED = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}
# (first bytes, format): the formats decoded here. OpenCV chooses its decoder by the same signatures.
SIGNATURES = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"BM", "BMP"), (b"II*\x00", "TIFF"),
              (b"MM\x00*", "TIFF"), (b"II+\x00", "TIFF"), (b"MM\x00+", "TIFF"))
PIL_FORMATS = {"JPEG": ("JPEG", "MPO"), "PNG": ("PNG",), "BMP": ("BMP",), "TIFF": ("TIFF",), "WEBP": ("WEBP",)}
# What other content OpenCV (or a reader's user) might expect, to say what a refused file is.
OTHERS = ((b"#?RADIANCE", "Radiance HDR"), (b"#?RGBE", "Radiance HDR"), (b"PF", "PFM"), (b"Pf", "PFM"),
          (b"\x59\xa6\x6a\x95", "Sun raster"), (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"), (b"\xff\x4f\xff\x51",
          "JPEG 2000"), (b"GIF8", "GIF"), (b"\x76\x2f\x31\x01", "OpenEXR"), (b"8BPS", "Photoshop"))


class ImageRefused(ValueError):
    """An image that is not decoded (not a regular file, a format not listed, over the pixel limit, larger than the
    byte cap, damaged); the message says why in one line, without the path."""


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says: Pillow's format name ('JPEG', 'MPO', 'PNG', ...) and the stored size (w, h),
    before any EXIF orientation (which a PNG may keep after its pixels: utils.data.label_cache reads it)."""

    format: str
    size: tuple[int, int]


def content_kind(head: bytes) -> str:
    """The format the first bytes say, of those decoded here ('JPEG', 'PNG', 'BMP', 'TIFF', 'WEBP'); ImageRefused
    naming what the content is otherwise."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    for signature, kind in SIGNATURES:
        if head.startswith(signature):
            return kind
    if not head:
        raise ImageRefused("an empty file")
    other = next((name for signature, name in OTHERS if head.startswith(signature)), "")
    if not other and head[:1] == b"P" and head[1:2] in b"1234567" and head[2:3].isspace():
        other = "PNM"
    elif not other and head[4:8] == b"ftyp" and head[8:12] in (b"avif", b"avis", b"heic", b"mif1"):
        other = "AVIF" if head[8:11] == b"avi" else "HEIF"
    return _refuse_kind(other)


def _refuse_kind(other: str) -> str:
    raise ImageRefused(f"not an image this project reads ({LISTED}): its content is "
                       f"{other or 'of no known image format'}")


def pixel_limit_refusal(width: int, height: int) -> str:
    """Why an image of ``width`` x ``height`` is refused (more pixels than Pillow's ``Image.MAX_IMAGE_PIXELS``, the
    decompression-bomb limit: a 20 kB PNG may decode to gigabytes), or '' when it is within the limit."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        return f"{width}x{height} is more pixels than the decompression-bomb limit of {limit}"
    return ""


def exif_size(img: Image.Image) -> tuple[int, int]:
    """(w, h) after the EXIF orientation is applied (rotations by 90 degrees swap the sides)."""
    with contextlib.suppress(Exception):
        if img.getexif().get(0x0112) in (5, 6, 7, 8):
            return img.size[1], img.size[0]
    return img.size


@contextlib.contextmanager
def opened_image(file: io.BufferedIOBase | io.BytesIO) -> Iterator[Image.Image]:
    """Pillow's lazy image (the header read, no pixel decoded) of a listed format decided from the content; the
    pixel limit checked. ImageRefused otherwise."""
    start = file.tell()
    kind = content_kind(file.read(16))
    file.seek(start)
    try:
        with warnings.catch_warnings():  # Pillow only warns between its limit and twice it; refused below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(file, formats=PIL_FORMATS[kind])
    except Image.DecompressionBombError:
        raise ImageRefused(f"more pixels than the decompression-bomb limit of {Image.MAX_IMAGE_PIXELS}") from None
    except Exception as e:  # Pillow raises many types for damaged headers
        raise ImageRefused(f"cannot read the {kind} header ({type(e).__name__})") from None
    with img:
        if refusal := pixel_limit_refusal(*img.size):
            raise ImageRefused(refusal)
        yield img


def image_header(file: io.BufferedIOBase | io.BytesIO) -> ImageHeader:
    """The header of an image file open for reading (its position is left where it was)."""
    start = file.tell()
    try:
        with opened_image(file) as img:
            return ImageHeader(img.format or "", img.size)
    finally:
        file.seek(start)


def file_cap(header: ImageHeader) -> int:
    """The most bytes a file with this header is read up to: what its pixels can need, within MAX_IMAGE_FILE_BYTES
    (so a small image followed by a gigabyte of anything is refused, not read)."""
    return min(MAX_IMAGE_FILE_BYTES, IMAGE_SLACK_BYTES + 8 * header.size[0] * header.size[1])


def size_refusal(nbytes: int, header: ImageHeader) -> str:
    """Why a file of ``nbytes`` with this header is refused (larger than file_cap), or ''."""
    if nbytes <= file_cap(header):
        return ""
    return f"{size_text(nbytes)}, more than a {header.size[0]}x{header.size[1]} image can need"


def decode_image(data: bytes) -> np.ndarray:
    """BGR uint8 (h, w, 3) pixels of an image file's bytes (EXIF orientation applied); ImageRefused when its
    content is not a listed format, its header declares too many pixels or it does not decode."""
    header = image_header(io.BytesIO(data))
    if refusal := size_refusal(len(data), header):
        raise ImageRefused(refusal)
    return _decoded(data, header)


def _decoded(data: bytes, header: ImageHeader, reduce: int = 1) -> np.ndarray:
    jpeg = header.format in ("JPEG", "MPO")
    if jpeg and not data.endswith(b"\xff\xd9"):
        data += b"\xff\xd9"  # a truncated JPEG: the end marker libjpeg's file reader supplies, not its memory reader
    image = cv2.imdecode(np.frombuffer(data, np.uint8), REDUCED.get(reduce, cv2.IMREAD_COLOR) if jpeg else
                         cv2.IMREAD_COLOR)
    if image is None:
        raise ImageRefused("the image data cannot be decoded (damaged file)")
    return image


def read_image(path: str | Path, reduce: int = 1) -> np.ndarray:
    """BGR uint8 pixels of an image file (see decode_image); also refused: anything but a regular file (a FIFO
    would block for ever), a file larger than its pixels can need (file_cap). The header is read first, from the
    file: nothing more is read of a file it refuses. Never raises anything but ImageRefused.

    ``reduce`` 2, 4 or 8: a JPEG is decoded at that fraction of its sides (ceil(side / reduce)) by libjpeg's DCT
    scaling, which skips most of the work of the pixels it does not make (the entropy decoding is still done); other
    formats are decoded whole whatever ``reduce`` asks."""
    try:
        with open_regular(path) as f:
            header = image_header(f)
            if refusal := size_refusal(os.fstat(f.fileno()).st_size, header):
                raise ImageRefused(refusal)
            data = read_capped(f, file_cap(header))
    except FileRefused as e:
        raise ImageRefused(str(e)) from None
    except OSError as e:
        raise ImageRefused(f"cannot read the file ({e.strerror or type(e).__name__})") from None
    return _decoded(data, header, reduce)


def reduction(size: int, needed: int) -> int:
    """The largest of 8, 4, 2 that keeps a side of ``size`` at least ``needed`` after read_image's ``reduce``; 1 when
    none does (the source is less than twice as large as it is needed)."""
    return next((k for k in (8, 4, 2) if size >= k * needed), 1)


def read_cached_array(path: str | Path, shape: tuple[int, ...]) -> np.ndarray | None:
    """A ``.npy`` of uint8 pixels (``--cache disk``) when it holds exactly ``shape`` (h, w, 3) and nothing else;
    None otherwise (missing, another shape or type, short, not a regular file), so the image is decoded instead.
    The header is checked before any memory is taken for the data."""
    try:
        with open_regular(path) as f:
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_2_0(f) if version >= (2, 0) else \
                np.lib.format.read_array_header_1_0(f)
            if header != (tuple(shape), False, np.dtype(np.uint8)):
                return None
            image = np.empty(shape, np.uint8)
            if os.fstat(f.fileno()).st_size - f.tell() != image.size:
                return None
            if f.readinto(memoryview(image.reshape(-1))) != image.size:
                return None
    except (OSError, ValueError):
        return None
    return image
