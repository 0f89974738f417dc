"""Tar shards of a split in the WebDataset layout: the writer, the index beside them, and reading one sample.

Each sample is two tar members under one key, its image and its YOLO labels side by side (``000000042.jpg``,
``000000042.txt``), so any WebDataset reader can read the shards too. ``<name>.index.json`` beside the shards holds
what start-up needs without reading a shard (a pattern may name some of its shards: a split of those): the
class names, each shard's name and sample count, and per sample
its shard, byte offset and length in it, key, image format and size (w, h) and its label rows, so autoanchor, the
label plots and the start-up fingerprint read the index, never the shards, and a reader fetches exactly the bytes of
the samples it needs (byte ranges, one sample or a run of them).

Shards come from strangers: the index is read with a byte cap and checked field by field (labels by the same
checks as label files, a bad row makes its sample corrupt, counted), and a sample's members must be plain files
named ``<key>.<ext>`` of bounded size (no ``..``, no absolute name, no link, device or folder, no extension
headers); its image is decoded by utils.data.image_io (pixel count from the header first).
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from utils.data.errors import DataError
from utils.data.image_io import MAX_IMAGE_FILE_BYTES
from utils.data.label_cache import MAX_LABEL_BYTES, ScanSummary, check_label_rows
from utils.data.regular_files import read_regular
from utils.data.shard_urls import ShardSpec
from utils.log import LOGGER
from utils.paths import IMG_SUFFIXES

INDEX_FORMAT, INDEX_VERSION = "yolo-ddp shards", 1
MAX_INDEX_BYTES = 128 << 20
BLOCK = 512  # tar's block
KEY = re.compile(r"[A-Za-z0-9_]{1,64}")
SHARD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}\.tar")
EXTENSIONS = {suffix.lstrip(".") for suffix in IMG_SUFFIXES}
MAX_SAMPLE_BYTES = MAX_IMAGE_FILE_BYTES + MAX_LABEL_BYTES + 4 * BLOCK


class ShardRefused(ValueError):
    """A sample or index that is not read; the message says why in one line."""


def padded(size: int) -> int:
    """Bytes a member of ``size`` bytes takes in a tar after its header (data padded to whole blocks)."""
    return -(-size // BLOCK) * BLOCK


# ------------------------------------------------------------------------------------------------ writing
@dataclass
class SampleSource:
    """One sample to write: its image file, its label text (YOLO rows), the rows and the image size (w, h)."""

    image: Path
    label_text: str
    rows: np.ndarray
    size: tuple[int, int]


def shard_names(prefix: str, count: int) -> list[str]:
    """``train-000000.tar`` ... for ``count`` shards."""
    return [f"{prefix}-{i:06d}.tar" for i in range(count)]


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def write_shards(samples: Sequence[SampleSource], out: Path, prefix: str, per_shard: int,
                 names: Sequence[str]) -> Path:
    """Write ``samples`` into ``out/<prefix>-NNNNNN.tar`` (``per_shard`` samples each; plain ustar members, no
    owners, time 0) and ``out/<prefix>.index.json``; each file to a temporary name, then renamed. Returns the index
    path. The caller has claimed the targets (nothing of the user's is replaced)."""
    count = -(-len(samples) // per_shard)
    shards, entries, labels = [], [], []
    for s, name in enumerate(shard_names(prefix, count)):
        target = out / name
        tmp = target.with_name(f"{name}.tmp{os.getpid()}")
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            chunk = samples[s * per_shard:(s + 1) * per_shard]
            for i, sample in enumerate(chunk, s * per_shard):
                key, ext, start = f"{i:09d}", sample.image.suffix.lower().lstrip("."), tar.offset
                _add_member(tar, f"{key}.{ext}", read_regular(sample.image, MAX_IMAGE_FILE_BYTES))
                _add_member(tar, f"{key}.txt", sample.label_text.encode())
                entries.append([s, start, tar.offset - start, key, ext, int(sample.size[0]), int(sample.size[1])])
                labels.append(np.asarray(sample.rows, np.float32).tolist())
        os.replace(tmp, target)
        shards.append({"name": name, "samples": len(chunk), "bytes": target.stat().st_size})
    index = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "nc": len(names), "names": list(names),
             "count": len(samples), "shards": shards, "samples": entries, "labels": labels}
    path = out / f"{prefix}.index.json"
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(index, separators=(",", ":")))
    os.replace(tmp, path)
    return path


# ------------------------------------------------------------------------------------------------ the index
@dataclass
class ShardIndex:
    """A split's checked index: per usable sample its shard, byte range, key, format, size (w, h) and labels;
    samples in shard order, then in their order in the shard."""

    spec: ShardSpec
    names: list[str]
    shard: np.ndarray  # (n,) int32
    offset: np.ndarray  # (n,) int64 byte offset of the sample's first member header
    length: np.ndarray  # (n,) int64 bytes of the sample's members
    keys: list[str]
    exts: list[str]
    shapes: np.ndarray  # (n, 2) float64 w, h
    labels: list[np.ndarray]  # (k, 5) float32 per sample
    summary: ScanSummary = field(default_factory=ScanSummary)

    def __len__(self) -> int:
        return len(self.keys)

    def member_names(self) -> list[str]:
        """A name per sample for plots and the fingerprint: ``<shard>/<key>.<ext>``."""
        shards = [Path(url).name for url in self.spec.urls]
        return [f"{shards[s]}/{k}.{e}" for s, k, e in zip(self.shard.tolist(), self.keys, self.exts)]


def _field(doc: Any, key: str, kind: type | tuple, where: str) -> Any:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ShardRefused(f"{where}: '{key}' is missing or not a {getattr(kind, '__name__', 'value')}")
    return value


def _entry(entry: Any, shards: list[dict], where: str) -> tuple[int, int, int, str, str, int, int]:
    """One sample's [shard, offset, length, key, ext, w, h], each value checked."""
    if not isinstance(entry, list) or len(entry) != 7:
        raise ShardRefused(f"{where}: a sample entry must be [shard, offset, length, key, ext, w, h]")
    s, offset, length, key, ext, w, h = entry
    ints = (s, offset, length, w, h)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        raise ShardRefused(f"{where}: a sample entry holds a non-integer number")
    if not (0 <= s < len(shards) and offset >= 0 and offset % BLOCK == 0 and 2 * BLOCK <= length <= MAX_SAMPLE_BYTES
            and 0 < w <= 1 << 20 and 0 < h <= 1 << 20):
        raise ShardRefused(f"{where}: a sample entry is out of range (shard {s}, offset {offset}, length {length})")
    if not isinstance(key, str) or not KEY.fullmatch(key) or ext not in EXTENSIONS:
        raise ShardRefused(f"{where}: a sample key must be 1-64 letters, digits or _, its image one of "
                           f"{', '.join(sorted(EXTENSIONS))}")
    return s, offset, length, key, ext, w, h


def parse_index(data: bytes, spec: ShardSpec, nc: int | None) -> ShardIndex:
    """The checked index of ``spec``'s shards from the index file's bytes. Structural damage raises ShardRefused;
    a sample whose labels fail the label checks is left out and counted corrupt, with its warning."""
    where = f"{spec.pattern} index"
    if len(data) > MAX_INDEX_BYTES:
        raise ShardRefused(f"{where}: larger than {MAX_INDEX_BYTES >> 20} MB")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise ShardRefused(f"{where}: not a JSON document") from None
    if _field(doc, "format", str, where) != INDEX_FORMAT or _field(doc, "version", int, where) != INDEX_VERSION:
        raise ShardRefused(f"{where}: not a version {INDEX_VERSION} index of python -m utils.data.convert --to shards")
    names = _field(doc, "names", list, where)
    if not names or not all(isinstance(n, str) and 0 < len(n) <= 128 and n.isprintable() for n in names):
        raise ShardRefused(f"{where}: 'names' must list the class names as plain strings")
    shards, entries = _field(doc, "shards", list, where), _field(doc, "samples", list, where)
    labels = _field(doc, "labels", list, where)
    position = {}
    for i, shard in enumerate(shards):
        name = _field(shard, "name", str, where)
        if not SHARD_NAME.fullmatch(name) or name in position:
            raise ShardRefused(f"{where}: shard name {name[:60]!r} is not a plain unique .tar name")
        position[name] = i
    missing = [Path(url).name for url in spec.urls if Path(url).name not in position]
    if missing:
        raise ShardRefused(f"{where}: the index has no shard {missing[0][:60]!r}")
    if len(entries) != len(labels) or len(entries) != sum(_field(s, "samples", int, where) for s in shards):
        raise ShardRefused(f"{where}: the sample, label and shard counts disagree")
    named = {position[Path(url).name]: j for j, url in enumerate(spec.urls)}  # index shard -> the pattern's
    return _checked(spec, [str(n) for n in names], entries, labels, shards, named, nc, where)


def _checked(spec: ShardSpec, names: list[str], entries: list, labels: list, shards: list, named: dict[int, int],
             nc: int | None, where: str) -> ShardIndex:
    """The samples of the shards the pattern names (``named``: index shard -> pattern position), labels checked."""
    rows, keep, summary = [], [], ScanSummary()
    for entry, label in zip(entries, labels):
        fields = _entry(entry, shards, where)
        if fields[0] not in named:
            continue
        fields = (named[fields[0]], *fields[1:])
        summary.total += 1
        try:
            if not isinstance(label, list) or not all(isinstance(r, list) and len(r) == 5 for r in label):
                raise ValueError("labels must be rows of 5 numbers")
            table = np.array(label, np.float64).reshape(-1, 5)
            checked, duplicates, note = check_label_rows(table, nc) if len(table) else \
                (np.zeros((0, 5), np.float32), 0, "")
        except (ValueError, TypeError, OverflowError) as e:
            summary.corrupt += 1
            summary.warnings.append(f"{spec.pattern} sample {fields[3]}: ignoring corrupt labels: {str(e)[:120]}")
            continue
        summary.found += 1
        summary.empty += not len(checked)
        summary.duplicates += duplicates
        if note:
            summary.warnings.append(f"{spec.pattern} sample {fields[3]}: {note}")
        keep.append(fields)
        rows.append(checked)
    if not keep:
        raise ShardRefused(f"{where}: no usable samples ({summary.line()})")
    columns = list(zip(*keep))
    return ShardIndex(spec, names, np.array(columns[0], np.int32), np.array(columns[1], np.int64),
                      np.array(columns[2], np.int64), list(columns[3]), list(columns[4]),
                      np.array(list(zip(columns[5], columns[6])), np.float64), rows, summary)


# ------------------------------------------------------------------------------------------------ opening
Opener = Callable[..., BinaryIO]  # (url, start=0, end=None): a file of the bytes of url from start to end


def opener(spec: ShardSpec, max_block: int = 4 << 20) -> Opener:
    """A function opening one of ``spec``'s URLs for binary reading: local files as regular files, URLs through
    fsspec (s3fs for s3://, gcsfs for gs://; credentials from the environment as each client reads them). Given the
    byte range a reader needs (``start``, ``end``), a remote file fetches no more than that, in blocks of at most
    ``max_block`` bytes."""
    if spec.local:
        from utils.data.regular_files import open_regular

        return lambda url, start=0, end=None: open_regular(url)
    protocol = spec.urls[0].split("://", 1)[0].lower()
    try:
        import fsspec

        fs = fsspec.filesystem(protocol, skip_instance_cache=True)  # the environment as it is now
    except ImportError as e:
        package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}.get(protocol, "aiohttp")
        raise DataError(f"{spec.pattern}: shards at {protocol}:// need fsspec and {package} (pip install fsspec "
                        f"{package}): {str(e)[:100]}") from None

    def open_url(url: str, start: int = 0, end: int | None = None) -> BinaryIO:
        if end is None:
            return fs.open(url, "rb", block_size=max_block)
        try:  # the range's end as the size: no request for the size, nothing read past the range
            return fs.open(url, "rb", block_size=max(min(max_block, end - start), BLOCK), size=end)
        except TypeError:  # a backend without ``size``
            return fs.open(url, "rb", block_size=max(min(max_block, end - start), BLOCK))

    return open_url


def read_index(spec: ShardSpec, nc: int | None, prefix: str = "") -> ShardIndex:
    """The checked index of ``spec`` (one DataError line when it cannot be read or is refused), its scan line and
    warnings logged as a label scan's are."""
    try:
        with opener(spec)(spec.index_url) as f:
            data = f.read(MAX_INDEX_BYTES + 1)
        index = parse_index(data, spec, nc)
    except ShardRefused as e:
        raise DataError(str(e)) from None
    except DataError:
        raise
    except Exception as e:  # fsspec backends raise their own types (missing files, credentials, network)
        raise DataError(f"{spec.pattern}: cannot read the shard index {Path(spec.index_url).name} "
                        f"({type(e).__name__}: {str(e)[:160]})") from None
    LOGGER.info(f"{prefix}Reading '{spec.pattern}' shard index... {index.summary.line()}")
    for message in index.summary.warnings:
        LOGGER.warning(f"{prefix}WARNING: {message}")
    return index


# ------------------------------------------------------------------------------------------------ one sample
def parse_sample(data: bytes, key: str, ext: str) -> bytes:
    """The image bytes of one sample's members (``data``: the sample's byte range). Each member must be a plain
    ustar file named ``<key>.<ext>`` or ``<key>.txt``, within the range; ShardRefused otherwise."""
    position, image = 0, None
    while position + BLOCK <= len(data):
        block = data[position:position + BLOCK]
        if block == bytes(BLOCK):
            break
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
        except (tarfile.HeaderError, UnicodeDecodeError):
            raise ShardRefused(f"sample {key}: a damaged tar header") from None
        if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise ShardRefused(f"sample {key}: member {info.name[:60]!r} is not a plain file (a link, device, folder "
                               "or extension header)")
        if info.name not in (f"{key}.{ext}", f"{key}.txt"):
            raise ShardRefused(f"sample {key}: unexpected member name {info.name[:60]!r}")
        start = position + BLOCK
        if info.size > MAX_IMAGE_FILE_BYTES or start + info.size > len(data):
            raise ShardRefused(f"sample {key}: member {info.name!r} of {info.size} bytes exceeds the sample's range")
        if info.name.endswith(f".{ext}") and image is None:
            image = data[start:start + info.size]
        position = start + padded(info.size)
    if image is None:
        raise ShardRefused(f"sample {key}: no {ext} member")
    return image


def read_samples(index: ShardIndex, ids: Sequence[int], open_url: Opener) -> Iterable[tuple[int, bytes | str]]:
    """(id, image bytes) for each sample id, in the order given (ascending within a shard reads sequentially); a
    refused sample gives (id, the reason) instead. One file per run of ids in a shard, opened for the run's bytes."""
    runs = [0] + [k for k in range(1, len(ids)) if index.shard[ids[k]] != index.shard[ids[k - 1]]] + [len(ids)]
    for first, stop in zip(runs, runs[1:]):
        run = ids[first:stop]
        start, end = int(index.offset[run[0]]), int(index.offset[run[-1]] + index.length[run[-1]])
        with open_url(index.spec.urls[int(index.shard[run[0]])], start, end) as handle:
            for i in run:
                offset, length = int(index.offset[i]), int(index.length[i])
                if handle.tell() != offset:
                    handle.seek(offset)
                data = handle.read(length)
                try:
                    if len(data) != length:
                        raise ShardRefused(f"sample {index.keys[i]}: the shard ends inside it")
                    yield i, parse_sample(data, index.keys[i], index.exts[i])
                except ShardRefused as e:
                    yield i, str(e)
