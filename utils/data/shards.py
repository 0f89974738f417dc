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
from utils.data.regular_files import open_regular, read_capped, read_regular
from utils.data.shard_urls import ShardSpec
from utils.http_fetch import RangedFile
from utils.log import LOGGER
from utils.paths import IMG_SUFFIXES, confined

INDEX_FORMAT, INDEX_VERSION = "yolo-ddp shards", 1
MAX_INDEX_BYTES = 128 << 20
MAX_INDEX_VALUES = 12_000_000  # COCO train's index holds 6.2 M (118 k images, 860 k boxes); parsed, ~70 bytes each
NO_LABELS = np.zeros((0, 5), np.float32)  # shared by the samples without boxes (read-only)
NO_LABELS.setflags(write=False)
BLOCK = 512  # tar's block
KEY = re.compile(r"[A-Za-z0-9_]{1,64}")
SHARD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}\.tar")
EXTENSIONS = {suffix.lstrip(".") for suffix in IMG_SUFFIXES}
MAX_SAMPLE_BYTES = MAX_IMAGE_FILE_BYTES + MAX_LABEL_BYTES + 4 * BLOCK
HTTP_TIMEOUT_S = 60.0  # one http(s) range request: connecting and each read
SHARD_REASON = "shard "  # how the reason a whole shard is refused starts (a sample's starts "sample ")


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


def _entries(entries: list, shards: int, where: str) -> tuple[np.ndarray, ...]:
    """The sample entries ``[shard, offset, length, key, ext, w, h]`` as columns (five int64 arrays, then the keys
    and formats as object arrays), every value checked; ``entries`` is emptied as it is read."""
    if not all(type(e) is list and len(e) == 7 for e in entries):
        raise ShardRefused(f"{where}: a sample entry must be [shard, offset, length, key, ext, w, h]")
    columns = list(zip(*entries)) if entries else [()] * 7
    entries.clear()  # the parsed lists go now; their values live on in the columns
    try:
        if not all(type(v) is int for i in (0, 1, 2, 5, 6) for v in columns[i]):
            raise ValueError
        s, offset, length, w, h = (np.array(columns[i], np.int64) for i in (0, 1, 2, 5, 6))
    except (ValueError, OverflowError):
        raise ShardRefused(f"{where}: a sample entry holds a number that is not an integer of 64 bits") from None
    bad = ~((s >= 0) & (s < shards) & (offset >= 0) & (offset % BLOCK == 0) & (length >= 2 * BLOCK)
            & (length <= MAX_SAMPLE_BYTES) & (w > 0) & (w <= 1 << 20) & (h > 0) & (h <= 1 << 20))
    if bad.any():
        i = int(bad.argmax())
        raise ShardRefused(f"{where}: a sample entry is out of range (shard {s[i]}, offset {offset[i]}, length "
                           f"{length[i]}, size {w[i]} x {h[i]})")
    keys, exts = columns[3], columns[4]
    if not all(type(k) is str and KEY.fullmatch(k) for k in keys) or \
            not all(type(e) is str and e in EXTENSIONS for e in exts):
        raise ShardRefused(f"{where}: a sample key must be 1-64 letters, digits or _, its image one of "
                           f"{', '.join(sorted(EXTENSIONS))}")
    return s, offset, length, np.array(keys, object), np.array(exts, object), w, h


def parse_index(data: bytes, spec: ShardSpec, nc: int | None) -> ShardIndex:
    """The checked index of ``spec``'s shards from the index file's bytes. Structural damage raises ShardRefused;
    a sample whose labels fail the label checks is left out and counted corrupt, with its warning."""
    where = f"{spec.pattern} index"
    if len(data) > MAX_INDEX_BYTES:
        raise ShardRefused(f"{where}: larger than {MAX_INDEX_BYTES >> 20} MB")
    values = data.count(b",") + data.count(b"[") + data.count(b"{")  # what JSON would build: at most ~70 bytes each
    if values > MAX_INDEX_VALUES:
        raise ShardRefused(f"{where}: holds more than {MAX_INDEX_VALUES:,} values (numbers, names, lists)")
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
    """The samples of the shards the pattern names (``named``: index shard -> pattern position), labels checked.
    The parsed entries are dropped as they are read, so the document and the index are never both whole."""
    s, offset, length, keys, exts, w, h = _entries(entries, len(shards), where)
    position = np.full(len(shards), -1, np.int64)
    position[list(named)] = list(named.values())
    chosen = np.flatnonzero(position[s] >= 0)
    rows, kept, summary = [], [], ScanSummary(total=len(chosen))
    for i in chosen.tolist():
        label, labels[i] = labels[i], None
        try:
            if type(label) is not list or not all(type(r) is list and len(r) == 5 for r in label):
                raise ValueError("labels must be rows of 5 numbers")
            checked, duplicates, note = check_label_rows(np.array(label, np.float64), nc) if label else \
                (NO_LABELS, 0, "")
        except (ValueError, TypeError, OverflowError) as e:
            summary.corrupt += 1
            summary.warnings.append(f"{spec.pattern} sample {keys[i]}: ignoring corrupt labels: {str(e)[:120]}")
            continue
        summary.found += 1
        summary.empty += not len(checked)
        summary.duplicates += duplicates
        if note:
            summary.warnings.append(f"{spec.pattern} sample {keys[i]}: {note}")
        kept.append(i)
        rows.append(checked)
    labels.clear()
    if not rows:
        raise ShardRefused(f"{where}: no usable samples ({summary.line()})")
    kept = np.array(kept, np.int64)
    return ShardIndex(spec, names, position[s[kept]].astype(np.int32), offset[kept], length[kept],
                      keys[kept].tolist(), exts[kept].tolist(), np.stack([w[kept], h[kept]], 1).astype(np.float64),
                      rows, summary)


# ------------------------------------------------------------------------------------------------ opening
Opener = Callable[..., BinaryIO]  # (url, start=0, end=None): a file of the bytes of url from start to end


def opener(spec: ShardSpec, max_block: int = 4 << 20) -> Opener:
    """A function opening one of ``spec``'s URLs for binary reading. Local files: as regular files only (no FIFO,
    device or folder), links resolved and kept inside the data set's folder. http(s): by byte ranges, each body
    read with the cap of its range, never inflated (utils.http_fetch.RangedFile). Object stores through fsspec
    (s3fs for s3://, gcsfs for gs://; credentials from the environment as each client reads them). Given the byte
    range a reader needs (``start``, ``end``), a remote file fetches no more than that, in blocks of at most
    ``max_block`` bytes."""
    if spec.local:
        return lambda url, start=0, end=None: open_regular(confined(url, spec.root or Path(url).parent, "a shard",
                                                                    DataError))
    protocol = spec.urls[0].split("://", 1)[0].lower()
    if protocol in ("http", "https"):
        return lambda url, start=0, end=None: RangedFile(url, start, end, block=max_block, timeout=HTTP_TIMEOUT_S)
    try:
        import fsspec

        fs = fsspec.filesystem(protocol, skip_instance_cache=True)  # the environment as it is now
    except ImportError as e:
        package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}.get(protocol, protocol)
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


def open_index(spec: ShardSpec) -> BinaryIO:
    """The index file of ``spec``; a local one only when it is a regular file whose links stay in its folder (an
    index that is a link to a file elsewhere is refused)."""
    if spec.local:
        index = Path(spec.index_url)
        return open_regular(confined(index, index.parent, "the shard index", DataError))
    if spec.index_url.split("://", 1)[0].lower() in ("http", "https"):
        return RangedFile(spec.index_url, timeout=HTTP_TIMEOUT_S, cap=MAX_INDEX_BYTES)
    return opener(spec)(spec.index_url)


def read_index(spec: ShardSpec, nc: int | None, prefix: str = "") -> ShardIndex:
    """The checked index of ``spec`` (one DataError line when it cannot be read or is refused), its scan line and
    warnings logged as a label scan's are."""
    try:
        with open_index(spec) as f:  # a local file's size is checked first: no buffer of the cap for a small one
            data = read_capped(f, MAX_INDEX_BYTES) if spec.local else f.read(MAX_INDEX_BYTES + 1)
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
        if info.size < 0:  # a base-256 size field can be negative: the next header would be this one again
            raise ShardRefused(f"sample {key}: member {info.name!r} has a negative size ({info.size})")
        if info.size > MAX_IMAGE_FILE_BYTES or start + info.size > len(data):
            raise ShardRefused(f"sample {key}: member {info.name!r} of {info.size} bytes exceeds the sample's range")
        if info.name.endswith(f".{ext}") and image is None:
            image = data[start:start + info.size]
        position = start + padded(info.size)  # > the last position: every header read moves on
    if image is None:
        raise ShardRefused(f"sample {key}: no {ext} member")
    return image


def read_samples(index: ShardIndex, ids: Sequence[int], open_url: Opener) -> Iterable[tuple[int, bytes | str]]:
    """(id, image bytes) for each sample id, in the order given (ascending within a shard reads sequentially); a
    refused sample gives (id, the reason) instead, and so does every sample of a shard that cannot be opened or
    read (missing, not a regular file, HTTP 404, refused by --cache disk), with one reason for the shard. One file
    per run of ids in a shard, opened for the run's bytes."""
    runs = [0] + [k for k in range(1, len(ids)) if index.shard[ids[k]] != index.shard[ids[k - 1]]] + [len(ids)]
    for first, stop in zip(runs, runs[1:]):
        run = ids[first:stop]
        url = index.spec.urls[int(index.shard[run[0]])]
        start, end = int(index.offset[run[0]]), int(index.offset[run[-1]] + index.length[run[-1]])
        done = 0
        try:
            with open_url(url, start, end) as handle:
                for i in run:
                    yield i, _read_one(index, i, handle)
                    done += 1
        except Exception as e:  # noqa: BLE001 (a local file, urllib and the fsspec backends each raise their own)
            reason = (f"{SHARD_REASON}{Path(url).name} cannot be read ({type(e).__name__}: {str(e)[:160]}): "
                      f"{len(run) - done} of its samples are trained as grey backgrounds without boxes")
            yield from ((i, reason) for i in run[done:])


def _read_one(index: ShardIndex, i: int, handle: BinaryIO) -> bytes | str:
    """Sample ``i``'s image bytes from its shard's open file, or why it is refused."""
    offset, length = int(index.offset[i]), int(index.length[i])
    if handle.tell() != offset:
        handle.seek(offset)
    data = handle.read(length)
    try:
        if len(data) != length:
            raise ShardRefused(f"sample {index.keys[i]}: the shard ends inside it")
        return parse_sample(data, index.keys[i], index.exts[i])
    except ShardRefused as e:
        return str(e)
