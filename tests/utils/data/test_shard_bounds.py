"""Shards from strangers, bounded: the red-team's cases against the shard and remote readers (a negative tar size,
a stand-in image sized from the index, HTTP answers of 2 GB or gzip, --cache disk over its cap, brace ranges of a
million shards, an index at its cap, a linked index, missing, FIFO and 404 shards, a reader stuck for good). Each
ends in one line or a counted warning, under 1 GB and in seconds."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.helpers import RangeHandler, make_shard_set, serve_folder
from utils.data.config import DataError, load_data_config
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader, set_epoch
from utils.data.shards import MAX_INDEX_VALUES, ShardRefused, parse_sample
from utils.data.synthetic import SYNTHETIC_NAMES
from utils.distributed.signals import GracefulStop, StopRequested

N_IMAGES = 8
PATTERN = "shards/train-{000000..000001}.tar"
GB = 1 << 30


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 synthetic images as 2 shards of 4, and their data YAML (never changed: tests edit copies)."""
    return make_shard_set(tmp_path_factory.mktemp("bounds"), N_IMAGES, per_shard=4).parent


@pytest.fixture
def data(original: Path, tmp_path: Path) -> Path:
    """A copy of the shard set's folder (shards, index, shards.yaml) to damage."""
    shutil.copytree(original, tmp_path / "data")
    return tmp_path / "data"


def batches(yaml_file: Path, cache: str | None = None, workers: int = 0) -> list[list[str]]:
    """One epoch of 2-image batches at 64 px, every batch checked whole; the paths of each."""
    options = DatasetOptions(img_size=64, batch_size=2, augment=False, nc=3, seed=0, cache=cache)
    loader, _ = create_dataloader(load_data_config(yaml_file).train, options, workers=workers, shuffle=True)
    set_epoch(loader, 0)
    out = []
    for imgs, targets, paths, _ in loader:
        assert imgs.shape == (2, 3, 64, 64) and targets.shape[1] == 6
        out.append(list(paths))
    return out


@contextmanager
def peak_memory(limit: int) -> Iterator[None]:
    """Python and numpy allocations inside stay under ``limit`` bytes at their peak."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"peak {peak / 1e6:.0f} MB"


def index_of(folder: Path) -> dict:
    return json.loads((folder / "shards" / "train.index.json").read_text())


def write_yaml(path: Path, train: object) -> Path:
    path.write_text(yaml.safe_dump({"train": train, "val": train, "names": list(SYNTHETIC_NAMES)}))
    return path


def one_line(error: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(error.value)
    assert "\n" not in message and all(part in message for part in parts), message


# ------------------------------------------------------------------------------------------ tar members
def negative_size(header: bytes, size: int = -512) -> bytes:
    """A ustar header with its size field in GNU base-256 (negative here), checksum made valid again."""
    block = bytearray(header[:512])
    block[124:136] = b"\xff" + (256 ** 11 + size).to_bytes(11, "big")
    block[148:156] = b" " * 8
    block[148:155] = b"%06o\0" % (sum(block))
    return bytes(block) + header[512:]


@pytest.mark.timeout(60)
def test_a_negative_tar_size_is_a_counted_warning_not_a_loop(data: Path, yolo_log: list[str]) -> None:
    """The member of size -512 pointed the reader back at its own header, for ever (the run ignored SIGTERM for 13
    minutes): now the sample is refused with its warning and the epoch completes."""
    entry = index_of(data)["samples"][5]
    shard = data / "shards" / f"train-{entry[0]:06d}.tar"
    raw = shard.read_bytes()
    shard.write_bytes(raw[:entry[1]] + negative_size(raw[entry[1]:entry[1] + 512]) + raw[entry[1] + 512:])
    with pytest.raises(ShardRefused, match="negative size"):
        parse_sample(negative_size(raw[entry[1]:entry[1] + entry[2]]), entry[3], entry[4])
    assert sum(len(b) for b in batches(data / "shards.yaml")) == N_IMAGES
    assert [m for m in yolo_log if f"{entry[3]}.jpg: ignoring corrupt image" in m and "negative size" in m]


def test_a_refused_samples_stand_in_has_the_runs_size_not_the_index(data: Path, yolo_log: list[str]) -> None:
    """The index says the damaged sample is 2^20 x 2^20 (a grey stand-in of that size asked for 3 TiB): the
    stand-in is 64 x 64, the run's size."""
    index = index_of(data)
    index["samples"][2][5:7] = [1 << 20, 1 << 20]
    shard, offset = index["samples"][2][:2]
    (data / "shards" / "train.index.json").write_text(json.dumps(index))
    with open(data / "shards" / f"train-{shard:06d}.tar", "r+b") as f:
        f.seek(offset)
        f.write(b"\x01" * 512)
    with peak_memory(GB):
        assert sum(len(b) for b in batches(data / "shards.yaml")) == N_IMAGES
    assert len([m for m in yolo_log if "ignoring corrupt image" in m]) == 1


def test_missing_and_fifo_shards_are_counted_warnings(data: Path, yolo_log: list[str]) -> None:
    (data / "shards" / "train-000001.tar").unlink()
    (data / "shards" / "train-000000.tar").unlink()
    os.mkfifo(data / "shards" / "train-000000.tar")  # opened for reading, it would block for ever
    assert sum(len(b) for b in batches(data / "shards.yaml")) == N_IMAGES  # grey stand-ins keep every batch whole
    said = [m for m in yolo_log if m.startswith("WARNING: shard train-00000")]
    assert len(said) == 2 and "a FIFO" in " ".join(said) and "FileNotFoundError" in " ".join(said), said
    assert all("4 of its samples are trained as grey backgrounds" in m for m in said)


def test_an_index_that_links_elsewhere_is_refused(data: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (data / "shards" / "train.index.json").rename(elsewhere / "other.json")
    (data / "shards" / "train.index.json").symlink_to(elsewhere / "other.json")
    with pytest.raises(DataError) as refused:
        batches(data / "shards.yaml")
    one_line(refused, "the shard index", "leads outside")


# ------------------------------------------------------------------------------------------ brace ranges
@pytest.mark.timeout(60)
def test_a_million_shards_in_many_patterns_is_one_line_before_any_is_expanded(tmp_path: Path) -> None:
    million = "https://example.invalid/t{k}-{{000000..999999}}.tar"
    for count in (1000, 25):  # 42 KB of YAML ran out of memory; 25 patterns took 2.8 GB
        path = write_yaml(tmp_path / f"many{count}.yaml", [million.format(k=k) for k in range(count)])
        with peak_memory(64 << 20), pytest.raises(DataError) as refused:
            load_data_config(path)
        one_line(refused, f"names {count} shard patterns; a split in shards names one")
    path = write_yaml(tmp_path / "over.yaml", "https://example.invalid/t-{0000000..1000000}.tar")
    with pytest.raises(DataError) as refused:
        load_data_config(path)
    one_line(refused, "at most 1000000 shards")


@pytest.mark.timeout(60)
def test_a_local_range_of_a_million_takes_no_time(tmp_path: Path) -> None:
    """A 79-byte YAML naming shards/train-{000000..999999}.tar took 134 s (every path resolved): now the folder is
    resolved once and the names made when the index asks for them."""
    (tmp_path / "shards").mkdir()
    path = write_yaml(tmp_path / "d.yaml", "shards/train-{000000..999999}.tar")
    with peak_memory(64 << 20), pytest.raises(DataError) as refused:
        batches(path)
    one_line(refused)


# ------------------------------------------------------------------------------------------ the index
def tiny_samples_index(count: int, key_length: int) -> str:
    """An index of ``count`` minimal samples (long keys, no boxes): what costs the most memory for its bytes."""
    entries = ",".join(f'[0,{512 * i},1024,"{"k" * (key_length - 9)}{i:09d}","jpg",64,64]' for i in range(count))
    head = {"format": "yolo-ddp shards", "version": 1, "nc": 3, "names": ["a", "b", "c"], "count": count,
            "shards": [{"name": "train-000000.tar", "samples": count, "bytes": 1}]}
    return f'{json.dumps(head)[:-1]},"samples":[{entries}],"labels":[{",".join(["[]"] * count)}]}}'


def test_an_index_at_its_byte_cap_is_refused_by_its_value_count(data: Path) -> None:
    """A 126 MB index (under its 128 MB cap) of tiny samples peaked at 3.8 GB: its values are counted first."""
    text = tiny_samples_index(2_600_000, 10)
    assert 120e6 < len(text) < 128 << 20
    (data / "shards" / "train.index.json").write_text(text)
    del text
    with peak_memory(400 << 20), pytest.raises(DataError) as refused:
        batches(write_yaml(data / "d.yaml", "shards/train-000000.tar"))
    one_line(refused, f"holds more than {MAX_INDEX_VALUES:,} values")


def test_index_memory_is_in_proportion_to_its_size(data: Path) -> None:
    """The most an index within the caps takes per byte: 64-letter keys and no boxes, read at 8 x its size."""
    text = tiny_samples_index(60_000, 64)
    (data / "shards" / "train.index.json").write_text(text)
    from utils.data.shard_urls import parse_shard_spec
    from utils.data.shards import read_index
    from utils.paths import confined

    spec = parse_shard_spec("shards/train-000000.tar", data, lambda p: confined(p, data))
    with peak_memory(8 * len(text)):
        assert len(read_index(spec, 3)) == 60_000


# ------------------------------------------------------------------------------------------ over http
class Hostile(RangeHandler):
    """A shard server with one fault (``fault``): 'huge-index' announces and sends 2 GB for the index, 'gzip-index'
    sends it gzip-encoded (8 KB inflating to 8 MB), 'huge-ranges' answers each range with its bytes and then 2 GB
    more, 'stall' never answers a range, '404' has no shard 1."""

    fault = ""
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        index, ranged = self.path.endswith(".json"), "Range" in self.headers and self.path.endswith(".tar")
        if self.fault == "huge-index" and index:
            return self._send(200, b"{", {"Content-Length": str(2 << 30)}, stream=2 << 30)
        if self.fault == "gzip-index" and index:
            return self._send(200, gzip.compress(bytes(8 << 20)), {"Content-Encoding": "gzip"})
        if self.fault == "404" and self.path.endswith("train-000001.tar"):
            return self.send_error(404)
        if self.fault == "stall" and ranged:
            self.release.wait(120)
            return None
        if self.fault == "huge-ranges" and ranged:
            wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers["Range"])
            data = Path(self.translate_path(self.path)).read_bytes()
            start, end = int(wanted[1]), int(wanted[2])
            return self._send(206, data[start:end + 1], {"Content-Range": f"bytes {start}-{end}/{len(data)}",
                                                         "Content-Length": str(2 << 30)}, stream=2 << 30)
        return super().do_GET()

    def _send(self, status: int, body: bytes, headers: dict, stream: int = 0) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(body)
            sent = len(body)
            while sent < stream:  # zeros until the client hangs up
                self.wfile.write(bytes(1 << 16))
                sent += 1 << 16
        except OSError:
            pass


@contextmanager
def hostile_server(folder: Path, fault: str) -> Iterator[str]:
    handler = type("Handler", (Hostile,), {"fault": fault, "release": threading.Event()})
    with serve_folder(folder, handler) as url:
        try:
            yield url
        finally:
            handler.release.set()


@pytest.mark.parametrize("fault, expected", [("huge-index", "the server announces 2147483648 bytes, more than the "
                                                            "cap"),
                                             ("gzip-index", "the server sent a gzip-encoded body")])
def test_an_http_index_answered_with_2_gb_or_gzip_is_one_line(data: Path, tmp_path: Path, fault: str,
                                                               expected: str) -> None:
    with hostile_server(data, fault) as url, peak_memory(64 << 20), pytest.raises(DataError) as refused:
        batches(write_yaml(tmp_path / "d.yaml", f"{url}/{PATTERN}"))
    one_line(refused, "cannot read the shard index", expected)


def test_http_ranges_answered_with_2_gb_read_only_their_bytes(data: Path, tmp_path: Path) -> None:
    """Each range request is answered with its bytes and 2 GB more (announced): the reader takes its bytes only,
    and the epoch is the local one."""
    local = batches(data / "shards.yaml")
    with hostile_server(data, "huge-ranges") as url, peak_memory(256 << 20):
        assert batches(write_yaml(tmp_path / "d.yaml", f"{url}/{PATTERN}")) == local


def test_a_404_shard_is_a_counted_warning(data: Path, tmp_path: Path, yolo_log: list[str]) -> None:
    with hostile_server(data, "404") as url:
        assert sum(len(b) for b in batches(write_yaml(tmp_path / "d.yaml", f"{url}/{PATTERN}"))) == N_IMAGES
    said = [m for m in yolo_log if m.startswith("WARNING: shard train-000001.tar cannot be read")]
    assert len(said) == 1 and "HTTP 404" in said[0] and "4 of its samples" in said[0]


def test_cache_disk_stops_at_its_cap_and_leaves_no_file(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         yolo_log: list[str]) -> None:
    """A shard larger than --cache disk's cap (a 48 MB shard was kept over a 32 MB cap and filled the disk): copied
    up to the cap, refused (its samples counted), its temporary file removed."""
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    shard_bytes = min(p.stat().st_size for p in (data / "shards").glob("*.tar"))
    options = DatasetOptions(img_size=64, batch_size=2, augment=False, nc=3, seed=0, cache="disk")
    with serve_folder(data, RangeHandler) as url:
        loader, _ = create_dataloader(load_data_config(write_yaml(tmp_path / "d.yaml", f"{url}/{PATTERN}")).train,
                                      options, workers=0, shuffle=True)
        loader.dataset.cache_cap = shard_bytes // 2
        set_epoch(loader, 0)
        assert sum(len(paths) for _, _, paths, _ in loader) == N_IMAGES
    said = [m for m in yolo_log if "larger than --cache disk's cap" in m]
    assert len(said) == 2 and all("4 of its samples" in m for m in said)
    assert [p.name for p in (tmp_path / "home").rglob("*") if p.is_file()] == [".lock"]  # nothing kept, no .tmp


@pytest.mark.timeout(60)  # before: the reader waited for ever
def test_a_stop_signal_ends_a_reader_stuck_for_good(data: Path, tmp_path: Path) -> None:
    """The server never answers a shard's range: a SIGTERM ends the wait within the grace period."""
    with hostile_server(data, "stall") as url:
        options = DatasetOptions(img_size=64, batch_size=2, augment=False, nc=3, seed=0)
        loader, _ = create_dataloader(load_data_config(write_yaml(tmp_path / "d.yaml", f"{url}/{PATTERN}")).train,
                                      options, workers=0, shuffle=True)
        set_epoch(loader, 0)
        with GracefulStop(stuck_s=1.0):
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            with pytest.raises(StopRequested, match="no step ended within 1 s"):
                next(iter(loader))
