"""Two gloo processes (torchrun): the synthetic set and the label cache are built once, then shared; a split's
label scan is shared by the ranks and equals one process's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import GOOD_LABEL, run_job, torchrun_cmd, write_jpg, write_truncated_jpg
from tests.scripts.data_ddp_worker import digest
from utils.data import label_cache
from utils.data.ram_cache import shm_dir


@pytest.mark.ddp
def varied_split(root: Path, n_good: int = 14) -> Path:
    """A YOLO txt split of 21 images: good ones, and one each missing, empty, two of corrupt labels, a duplicate row,
    a truncated JPEG (repaired into the cache folder) and a file that is no image."""
    images, labels = root / "images", root / "labels"
    images.mkdir(parents=True)
    labels.mkdir()
    for i in range(n_good):
        write_jpg(images / f"good{i:02d}.jpg", h=20 + i, w=30)
        (labels / f"good{i:02d}.txt").write_text(f"{i % 3} 0.5 0.5 0.{i + 1:02d} 0.25\n")
    for name, text in [("missing", None), ("empty", ""), ("columns", "0 0.5 0.5 0.2\n"), ("class", "7 .5 .5 .2 .2\n"),
                       ("twice", GOOD_LABEL * 2), ("truncated", GOOD_LABEL), ("noimage", GOOD_LABEL)]:
        (write_truncated_jpg if name == "truncated" else write_jpg)(images / f"{name}.jpg")
        if text is not None:
            (labels / f"{name}.txt").write_text(text)
    (images / "noimage.jpg").write_bytes(b"not an image")
    return images


def test_two_ranks_build_the_cache_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    images = varied_split(tmp_path / "varied")
    code, output = run_job(torchrun_cmd(2, "-m", "tests.scripts.data_ddp_worker", str(tmp_path / "data"), str(out),
                                        str(images)))
    assert code == 0, output[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["generate"] for r in ranks] == [1, 0]  # local rank 0 generated, rank 1 found it valid
    assert [r["save_cache"] for r in ranks] == [1, 0]  # one cache write; rank 1 read it
    assert (tmp_path / "data" / "labels" / "train.cache").is_file()
    assert [r["found"] for r in ranks] == [10, 10]
    assert not set(ranks[0]["order"][:5]) & set(ranks[1]["order"][:5])  # ranks see disjoint halves of the epoch
    # 5 images each in batches of 2: the last batch of one is padded with an image from the epoch's start
    assert len(ranks[0]["order"]) == len(ranks[1]["order"]) == 6
    assert {ranks[0]["order"][5], ranks[1]["order"][5]} <= set(ranks[0]["order"][:5]) | set(ranks[1]["order"][:5])
    # --cache ram: one copy on the machine, mapped by both ranks, every image of the epoch read from it
    assert ranks[0]["cached"] == ranks[1]["cached"] == 10 and [r["decoded_in_epoch"] for r in ranks] == [0, 0]
    assert len(ranks[0]["cache_files"]) == 1 and ranks[0]["cache_files"] == ranks[1]["cache_files"]
    assert not list(shm_dir().glob("yolo-ram-*"))  # the name was removed once mapped: nothing left behind
    assert output.count("images and labels... 10 found") == 1  # the summary is printed once (rank 0)
    # the varied split: each rank checked its share (11 + 10), both ended with the same scan, rank 0 cached it, and
    # it equals the scan of one process, field by field
    assert [r["shared_checked"] for r in ranks] == [[11], [10]]
    im_files = label_cache.list_image_files(images)
    label_files = label_cache.img2label_paths(im_files)
    cached = label_cache.load_cache(label_cache.cache_path_for(label_files),
                                    label_cache.files_hash(im_files, label_files, 3))
    alone = label_cache.scan_files(im_files, label_files, 3, show=False,
                                   repair_dir=label_cache.cache_dir_for(label_files) / "repaired")
    assert cached is not None and digest(cached) == digest(alone)
    assert ranks[0]["shared_digest"] == ranks[1]["shared_digest"] == digest(alone)
    assert alone.summary().line() == "17 found, 1 missing, 1 empty, 3 corrupt, 1 duplicate rows removed"
    assert sum(bool(r) for r in alone.repaired) == 1
