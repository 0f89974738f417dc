"""Tar shards: python -m utils.data.convert --to shards, the index, local shards streamed per rank and worker
(every sample once per epoch, an exact mid-epoch resume at another world size), and shards from strangers."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers import RangeHandler, gcs_server, make_shard_set, s3_server, serve_folder
from utils.data import loader as loader_module
from utils.data.config import DataError, load_data_config
from utils.data.convert import main as convert_main
from utils.data.datasets import DatasetOptions, YoloDataset
from utils.data.loader import close_mosaic, create_dataloader, set_epoch, set_start, set_weights
from utils.data.shard_urls import ShardSpecError, expand_braces, index_name, parse_shard_spec
from utils.data.shards import ShardRefused, parse_sample
from utils.data.stream import EpochPlan, SamplePool, buffer_order, rank_positions
from utils.data.synthetic import SYNTHETIC_NAMES
from utils.hyp import load_hyp

N_IMAGES = 16
PATTERN = "shards/train-{000000..000003}.tar"


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 synthetic images written as 4 shards of 4 and a data YAML naming them (train and val)."""
    return make_shard_set(tmp_path_factory.mktemp("shards"), N_IMAGES, per_shard=4)


def _loader(data: Path, rank: int = 0, world: int = 1, workers: int = 0, batch: int = 2, epoch: int = 1,
            start: int = 0, augment: bool = True, cache: str | None = None):
    options = DatasetOptions(img_size=64, batch_size=batch, augment=augment, nc=3, seed=3, cache=cache)
    loader, split = create_dataloader(load_data_config(data).train, options, workers=workers, shuffle=True)
    loader.dataset.rank, loader.dataset.world = rank, world  # as the rank of a ``world``-process job computes it
    set_epoch(loader, epoch)
    set_start(loader, start)
    return loader, split


def _epoch(loader, batches: int | None = None, pixels: list | None = None) -> list[list[str]]:
    out = []
    for i, (imgs, targets, paths, _) in enumerate(loader):
        if batches is not None and i == batches:
            break
        assert imgs.shape[1:] == (3, 64, 64) and targets.shape[1] == 6
        out.append(list(paths))
        if pixels is not None:
            pixels.append((imgs.clone(), targets.clone()))
    return out


def test_convert_writes_webdataset_shards_and_their_index(shard_set: Path) -> None:
    folder = shard_set.parent / "shards"
    index = json.loads((folder / "train.index.json").read_text())
    assert index["count"] == N_IMAGES and index["names"] == list(SYNTHETIC_NAMES)
    assert [s["samples"] for s in index["shards"]] == [4, 4, 4, 4]
    with tarfile.open(folder / "train-000001.tar") as tar:  # any tar reader sees key.jpg and key.txt side by side
        names = tar.getnames()
        label = tar.extractfile("000000004.txt").read().decode()
    assert names[:2] == ["000000004.jpg", "000000004.txt"] and len(names) == 8
    original = YoloDataset(shard_set.parent.parent / "synthetic" / "images" / "train", img_size=64, nc=3)
    rows = np.array([r.split() for r in label.splitlines()], np.float32)
    assert rows.tobytes() == original.labels[4].tobytes()  # the same labels, bit for bit
    assert np.array(index["labels"][4], np.float32).tobytes() == original.labels[4].tobytes()
    # the command never replaces a file it did not write
    (folder.parent / "other").mkdir()
    (folder.parent / "other" / "train-000000.tar").write_text("mine")
    assert convert_main(["--from", "yolo", "--to", "shards", "--images", str(original.im_files[0].rsplit("/", 1)[0]),
                         "--names", *SYNTHETIC_NAMES, "--out", str(folder.parent / "other")]) == 2
    assert (folder.parent / "other" / "train-000000.tar").read_text() == "mine"


def test_index_gives_labels_and_sizes_without_reading_a_shard(shard_set: Path, yolo_log: list[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    loader, split = _loader(shard_set)
    monkeypatch.setattr(loader_module, "_SHM_WARNED", set())
    for _ in range(2):
        set_weights(loader, np.ones(len(split)))
    assert len([m for m in yolo_log if "--image-weights does not apply to streamed shards" in m]) == 1
    original = YoloDataset(shard_set.parent.parent / "synthetic" / "images" / "train", img_size=64, nc=3)
    assert len(split) == N_IMAGES and split.scan.line() == "16 found, 0 missing, 0 empty, 0 corrupt"
    assert np.array_equal(split.shapes, original.shapes)
    assert all(np.array_equal(a, b) for a, b in zip(split.labels, original.labels))
    assert len(loader) == N_IMAGES // 2  # batches of 2 on one rank


def test_every_sample_once_per_epoch_over_ranks_and_workers(shard_set: Path) -> None:
    single = _epoch(_loader(shard_set, workers=0, batch=4)[0])  # the total batch of the 2 ranks below
    assert sorted(p for b in single for p in b) == sorted(_loader(shard_set)[1].im_files)  # each once
    ranks = [_epoch(_loader(shard_set, rank=r, world=2, workers=2)[0]) for r in (0, 1)]
    union = [p for rank in ranks for b in rank for p in b]
    assert sorted(union) == sorted(set(union)) and len(union) == N_IMAGES
    # the global order does not depend on the world size: rank r of 2 has positions r, r + 2, ...
    flat = [p for b in single for p in b]
    assert [p for b in ranks[0] for p in b] == flat[0::2] and [p for b in ranks[1] for p in b] == flat[1::2]
    again = _epoch(_loader(shard_set, epoch=2, batch=4)[0])
    assert again != single  # another epoch, another order
    loader = _loader(shard_set, batch=4, workers=2)[0]  # persistent workers follow the epoch set in the rank
    assert _epoch(loader) == single
    set_epoch(loader, 2)
    assert _epoch(loader) == again
    assert close_mosaic(loader) and not loader.dataset.mosaic  # the workers restart without mosaic
    assert _epoch(loader) == again


def test_mid_epoch_resume_at_another_world_size_is_exact(shard_set: Path) -> None:
    whole = [p for b in _epoch(_loader(shard_set, batch=4)[0]) for p in b]  # total batch 4 throughout
    done = [p for r in (0, 1) for b in _epoch(_loader(shard_set, rank=r, world=2, batch=2)[0], batches=2) for p in b]
    assert sorted(done) == sorted(whole[:8])  # 2 global steps of 4 over 2 ranks: the first 8 of the global order
    rest = [p for r in range(4) for b in _epoch(_loader(shard_set, rank=r, world=4, batch=1, start=8)[0]) for p in b]
    assert sorted(done + rest) == sorted(whole) and len(rest) == N_IMAGES - 8


def test_plan_parts_and_shuffle_buffer() -> None:
    order = buffer_order(50, 4, np.random.default_rng(0))
    assert sorted(order.tolist()) == list(range(50)) and all(order[m] < m + 4 for m in range(50))
    plan = EpochPlan(np.repeat(np.arange(5), 7), parts=6, seed=0, epoch=0, shuffle=True)
    assert sorted(plan.sample(p) for p in range(35)) == list(range(35))
    assert rank_positions(7, 2, 1, 2) == [3, 5, 2]  # 5 left over 2 ranks: padded by wrapping
    assert rank_positions(7, 2, 1, 2, pad=False) == [3, 5]


def test_mosaic_takes_its_partners_from_the_worker_pool() -> None:
    pool = SamplePool(DatasetOptions(img_size=64, augment=True, hyp={**load_hyp(), "mosaic": 1.0}, seed=0))
    for c in range(3):  # class c only in image c
        pool.add(f"img{c}", np.full((48, 64, 3), 60 * c, np.uint8), np.array([[c, 0.5, 0.5, 0.6, 0.6]], np.float32))
    classes = set()
    for position in range(6):
        img, targets, path, shapes = pool[(2, (0, position))]
        assert path == "img2" and shapes is None and img.shape == (3, 64, 64)
        classes |= set(targets[:, 1].int().tolist())
    assert len(classes) > 1  # the mosaics hold other images of the pool too
    pool.mosaic = False  # close_mosaic
    img, targets, path, shapes = pool[(2, (0, 0))]
    assert set(targets[:, 1].int().tolist()) == {2} and shapes is not None


def test_shard_patterns_and_urls(tmp_path: Path) -> None:
    assert expand_braces("s3://b/t-{08..11}.tar") == ["s3://b/t-08.tar", "s3://b/t-09.tar", "s3://b/t-10.tar",
                                                      "s3://b/t-11.tar"]
    assert index_name("train-{000000..000511}.tar") == index_name("a/train-000007.tar") == "train.index.json"
    spec = parse_shard_spec("s3://bucket/coco/train-{0..1}.tar", tmp_path, None)
    assert spec.index_url == "s3://bucket/coco/train.index.json" and not spec.local
    for url in ("s3://AKIAXX:secretvalue@bucket/t-{0..1}.tar", "https://host/t.tar?X-Amz-Signature=secretvalue",
                "ftp://host/t.tar", "s3://bucket/t-{1..0}.tar"):
        with pytest.raises(ShardSpecError) as refused:
            parse_shard_spec(url, tmp_path, None)
        assert "secretvalue" not in str(refused.value)
    yaml_file = tmp_path / "d.yaml"
    yaml_file.write_text(yaml.safe_dump({"train": "../t-{0..1}.tar", "val": "t.tar", "nc": 1}))
    with pytest.raises(DataError, match="leads outside"):
        load_data_config(yaml_file)


def _member(name: str, data: bytes, kind: bytes = tarfile.REGTYPE, size: int | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = len(data) if size is None else size, kind
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    return info.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


def test_sample_members_from_strangers_are_refused() -> None:
    jpg = b"\xff\xd8\xff" + bytes(100)
    assert parse_sample(_member("000000001.jpg", jpg) + _member("000000001.txt", b""), "000000001", "jpg") == jpg
    for data, reason in ((_member("../000000001.jpg", jpg), "unexpected member name"),
                         (_member("/000000001.jpg", jpg), "unexpected member name"),
                         (_member("000000001.jpg", b"", tarfile.SYMTYPE), "not a plain file"),
                         (_member("000000001.jpg", b"", tarfile.CHRTYPE), "not a plain file"),
                         (_member("000000001.jpg", jpg, size=1 << 20), "exceeds the sample's range"),
                         (b"\x01" * 512, "damaged tar header"),
                         (_member("000000001.txt", b"0 0.5 0.5 0.1 0.1\n"), "no jpg member")):
        with pytest.raises(ShardRefused, match=reason):
            parse_sample(data, "000000001", "jpg")


def test_a_damaged_index_is_one_line_and_bad_labels_are_counted(shard_set: Path, tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    for shard in (shard_set.parent / "shards").glob("*.tar"):
        (folder / shard.name).write_bytes(shard.read_bytes())
    index = json.loads((shard_set.parent / "shards" / "train.index.json").read_text())
    index["labels"][0] = [[7, 0.5, 0.5, 0.1, 0.1]]  # class 7 of 3
    index["labels"][1] = [[0, 0.5, 0.5, "x", 0.1]]
    (folder / "train.index.json").write_text(json.dumps(index))
    data = tmp_path / "d.yaml"
    data.write_text(yaml.safe_dump({"train": PATTERN, "val": PATTERN, "names": list(SYNTHETIC_NAMES)}))
    loader, split = _loader(data)
    assert split.scan.line() == "14 found, 0 missing, 0 empty, 2 corrupt" and len(split) == 14
    assert len([p for b in _epoch(loader) for p in b]) == 14
    data.write_text(yaml.safe_dump({"train": "shards/train-{000001..000002}.tar", "val": PATTERN, "nc": 3}))
    assert _loader(data)[1].im_files[0] == "train-000001.tar/000000004.jpg" and len(_loader(data)[1]) == 8  # a subset
    data.write_text(yaml.safe_dump({"train": "shards/train-{000003..000004}.tar", "val": PATTERN, "nc": 3}))
    with pytest.raises(DataError, match="the index has no shard 'train-000004.tar'"):
        _loader(data)
    data.write_text(yaml.safe_dump({"train": PATTERN, "val": PATTERN, "names": list(SYNTHETIC_NAMES)}))
    for damage in ({**index, "samples": index["samples"][:3]}, {**index, "version": 9}, "not json"):
        (folder / "train.index.json").write_text(json.dumps(damage) if isinstance(damage, dict) else damage)
        with pytest.raises(DataError) as refused:
            _loader(data)
        assert "\n" not in str(refused.value)


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """moto's S3 server on loopback, its endpoint and test credentials in the environment; the data home in tmp."""
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    with s3_server() as env:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        yield env


def test_shards_stream_from_s3_and_stay_in_the_disk_cache(shard_set: Path, s3_env: dict, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket="yolo-shards")
    for path in (shard_set.parent / "shards").iterdir():
        client.upload_file(str(path), "yolo-shards", f"coco/{path.name}")
    data = tmp_path / "s3.yaml"
    data.write_text(yaml.safe_dump({"train": "s3://yolo-shards/coco/train-{000000..000003}.tar",
                                    "val": "s3://yolo-shards/coco/train-{000000..000003}.tar",
                                    "names": list(SYNTHETIC_NAMES)}))
    local_pixels, remote_pixels = [], []
    local = _epoch(_loader(shard_set, batch=4, workers=2)[0], pixels=local_pixels)
    assert _epoch(_loader(data, batch=4, workers=2)[0], pixels=remote_pixels) == local  # the same batches, bit for bit
    assert all(a[0].equal(b[0]) and a[1].equal(b[1]) for a, b in zip(local_pixels, remote_pixels))
    # --cache disk: each shard fetched once into the data home, read from there while the server is unreachable
    loader = _loader(data, batch=4, cache="disk")[0]
    assert _epoch(loader) == local
    cached = sorted((tmp_path / "home" / "shards").rglob("*.shard"))
    assert len(cached) == 4
    for path in (shard_set.parent / "shards").glob("*.tar"):  # gone from the bucket: read from the cache
        client.delete_object(Bucket="yolo-shards", Key=f"coco/{path.name}")
    set_epoch(loader, 1)
    assert _epoch(loader) == local
    # under a cap of two shards' bytes, the least recently used are removed
    for path in (shard_set.parent / "shards").glob("*.tar"):
        client.upload_file(str(path), "yolo-shards", f"coco/{path.name}")
    for path in cached:
        path.unlink()
    loader = _loader(data, batch=4, cache="disk")[0]
    loader.dataset.cache_cap = 2 * max(p.stat().st_size for p in (shard_set.parent / "shards").glob("*.tar"))
    assert _epoch(loader) == local
    assert len(list((tmp_path / "home" / "shards").rglob("*.shard"))) == 2


def test_shards_stream_from_gcs(shard_set: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import fsspec

    with gcs_server() as env:  # the emulator's address in the environment, as a client finds it there
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        fs = fsspec.filesystem("gs", skip_instance_cache=True)
        fs.mkdir("yolo-shards")
        for path in (shard_set.parent / "shards").iterdir():
            fs.put_file(str(path), f"yolo-shards/coco/{path.name}")
        data = tmp_path / "gs.yaml"
        data.write_text(yaml.safe_dump({"train": "gs://yolo-shards/coco/train-{000000..000003}.tar",
                                        "val": "gs://yolo-shards/coco/train-000000.tar",
                                        "names": list(SYNTHETIC_NAMES)}))
        local_pixels, remote_pixels = [], []
        local = _epoch(_loader(shard_set, batch=4, augment=False)[0], pixels=local_pixels)
        remote = _epoch(_loader(data, batch=4, augment=False)[0], pixels=remote_pixels)
    assert remote == local and len({p for b in remote for p in b}) == N_IMAGES  # every image once, in the same order
    assert all(a[0].equal(b[0]) and a[1].equal(b[1]) for a, b in zip(local_pixels, remote_pixels))  # and its labels


def test_a_damaged_sample_is_a_warning_and_training_goes_on(shard_set: Path, tmp_path: Path,
                                                             yolo_log: list[str]) -> None:
    folder = tmp_path / "data" / "shards"
    folder.mkdir(parents=True)
    for path in (shard_set.parent / "shards").iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    shard, offset = json.loads((folder / "train.index.json").read_text())["samples"][5][:2]
    with open(folder / f"train-{shard:06d}.tar", "r+b") as f:
        f.seek(offset)
        f.write(b"\x01" * 512)  # sample 5's first member header
    data = tmp_path / "data" / "d.yaml"
    data.write_text(yaml.safe_dump({"train": PATTERN, "val": PATTERN, "names": list(SYNTHETIC_NAMES)}))
    batches = _epoch(_loader(data, batch=4, augment=False)[0])
    assert len([p for b in batches for p in b]) == N_IMAGES  # every batch whole
    warnings = [m for m in yolo_log if "000000005.jpg: ignoring corrupt image: sample 000000005: a damaged" in m]
    assert len(warnings) == 1


def test_shards_stream_over_http_byte_ranges(shard_set: Path, tmp_path: Path) -> None:
    local = _epoch(_loader(shard_set, batch=4)[0])
    with serve_folder(shard_set.parent, RangeHandler) as url:
        data = tmp_path / "http.yaml"
        data.write_text(yaml.safe_dump({"train": f"{url}/{PATTERN}", "val": f"{url}/shards/train-000000.tar",
                                        "names": list(SYNTHETIC_NAMES)}))
        assert _epoch(_loader(data, batch=4)[0]) == local


def test_s3_errors_are_one_line(s3_env: dict, tmp_path: Path) -> None:
    data = tmp_path / "s3.yaml"
    data.write_text(yaml.safe_dump({"train": "s3://no-such-bucket/train-{0..1}.tar", "val": "s3://x/v.tar",
                                    "nc": 3}))
    with pytest.raises(DataError, match="cannot read the shard index train.index.json") as refused:
        _loader(data)
    assert "\n" not in str(refused.value) and "testing" not in str(refused.value)
