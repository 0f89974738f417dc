"""Data YAMLs: paths, names and their errors, the shipped YAMLs, safe extraction and the download of a missing
data set."""

from __future__ import annotations

import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.helpers import GOOD_LABEL, make_set, serve_folder, write_jpg
from utils.data import config as data_config
from utils.data.config import DataError, load_data_config
from utils.data.datasets import YoloDataset
from utils.data.download import download_dataset, safe_extract
from utils.data.label_cache import list_image_files


def test_yaml_paths_names_and_errors(tmp_path: Path) -> None:
    images = make_set(tmp_path / "set", {"a.jpg": (write_jpg, GOOD_LABEL)})
    (tmp_path / "list.txt").write_text("./set/images/train/a.jpg\n")
    good = tmp_path / "d.yaml"
    good.write_text(f"path: {tmp_path}\ntrain: [set/images/train, list.txt]\nval: set/images/train\n"
                    "names: {0: cat, 1: dog}\n")
    config = load_data_config(good)
    assert config.nc == 2 and config.names == ["cat", "dog"] and config.train[0] == images
    assert list_image_files(config.train) == [str(images / "a.jpg")] * 2
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
    for name in ("coco128.yaml", "coco.yaml", "coco128-seg.yaml"):
        data = data_config._read_yaml(data_config.ROOT / "data" / name)
        nc, names = data_config._parse_names(data, Path(name))
        assert nc == 80 and len(names) == 80 and data["download"]
    seg = data_config._read_yaml(data_config.ROOT / "data" / "coco128-seg.yaml")
    assert seg["path"] == "coco128-seg" and seg["download"].endswith("/coco128-seg.zip")
    assert seg["names"] == data_config._read_yaml(data_config.ROOT / "data" / "coco128.yaml")["names"]


def test_a_downloaded_segment_set_reads_its_outlines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What coco128-seg.yaml does on first use: the zip fetched into the data home, its segment rows read."""
    served = tmp_path / "served"
    served.mkdir()
    with zipfile.ZipFile(served / "mini-seg.zip", "w") as z:
        z.writestr("mini-seg/images/train/a.jpg", cv2.imencode(".jpg", np.zeros((20, 20, 3), np.uint8))[1].tobytes())
        z.writestr("mini-seg/labels/train/a.txt", "0 0.1 0.1 0.9 0.1 0.5 0.8\n")
    data = tmp_path / "cfg" / "mini-seg.yaml"
    data.parent.mkdir()
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    with serve_folder(served) as url:
        data.write_text(f"path: mini-seg\ntrain: images/train\nval: images/train\nnc: 1\n"
                        f"download: {url}/mini-seg.zip\n")
        config = load_data_config(data)
    dataset = YoloDataset(config.train, img_size=32, nc=1, task="segment")
    assert dataset.scan.found == 1 and np.allclose(dataset.extras[0][0], [[0.1, 0.1], [0.9, 0.1], [0.5, 0.8]])


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


def mini_zip(path: Path, folder: str = "mini", extra: dict[str, str] | None = None) -> Path:
    """A zip holding a one-image data set's folder, as coco128.zip does."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{folder}/images/train/a.jpg", cv2.imencode(".jpg", np.zeros((20, 20, 3), np.uint8))[1].tobytes())
        z.writestr(f"{folder}/labels/train/a.txt", GOOD_LABEL)
        for name, content in (extra or {}).items():
            z.writestr(name, content)
    return path


def test_missing_data_is_downloaded_and_extracted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = tmp_path / "served"
    served.mkdir()
    mini_zip(served / "mini.zip")
    data = tmp_path / "cfg" / "mini.yaml"
    data.parent.mkdir()
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    with serve_folder(served) as url:  # a loopback server: the real download code, without a network
        data.write_text(f"path: mini\ntrain: images/train\nval: images/train\nnc: 1\ndownload: {url}/mini.zip\n")
        config = load_data_config(data)
    assert config.root == tmp_path / "home" / "mini" and (config.train[0] / "a.jpg").is_file()
    assert not list((tmp_path / "home").glob("*.zip*"))  # the archive is removed after extraction
    assert YoloDataset(config.train, img_size=32, nc=1).scan.found == 1


@pytest.mark.parametrize("spec, words", [
    ({"url": "https://host/x.zip", "dir": "/abs/elsewhere"}, "must be a folder inside the data set"),
    ({"url": "https://host/x.zip", "dir": "../../x"}, "download 'dir' '../../x' leads outside"),
    ({"url": "https://host/x.zip", "dir": "images/../../x"}, "leads outside"),
    ("file:///etc/passwd", "only http:// and https://"),
    ("ftp://host/x.zip", "only http:// and https://"),
    ("https://host/.bashrc", "not a plain name"),
    ("https://host/%2Ebashrc", "not a plain name"),
    ([{"url": "https://host/ok.zip"}, {"url": "https://host/x.zip", "dir": "/abs"}], "inside the data set"),
])
def test_download_entries_that_would_write_elsewhere_are_refused_before_fetching(tmp_path: Path, spec: object,
                                                                              words: str) -> None:
    root = tmp_path / "home" / "set"
    with pytest.raises(DataError, match=words) as info:
        download_dataset(spec, root, homes=[tmp_path / "home"])
    assert "\n" not in str(info.value)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == []  # nothing fetched or made


def test_downloads_stay_in_the_data_home_and_under_the_byte_cap(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    mini_zip(served / "mini.zip")
    mini_zip(served / "sneaky.zip", extra={"bashrc": "echo owned"})  # a member beside the data set's folder
    (served / "big.bin").write_bytes(bytes(5000))
    home = tmp_path / "home"
    with serve_folder(served) as url:
        with pytest.raises(DataError, match="must live under"):
            download_dataset(f"{url}/mini.zip", tmp_path / "elsewhere" / "mini", homes=[home])
        with pytest.raises(DataError, match="would be written outside"):
            download_dataset(f"{url}/sneaky.zip", home / "mini", homes=[home])
        with pytest.raises(DataError, match="more than the cap of 4096"):
            download_dataset({"url": f"{url}/big.bin", "dir": "extra"}, home / "mini", max_bytes=4096, homes=[home])
        assert download_dataset(f"{url}/mini.zip", home / "mini", homes=[home]) == [home.resolve()]
    assert not (tmp_path / "elsewhere").exists() and not (home / "bashrc").exists()
    assert sorted(p.name for p in home.rglob("*") if p.is_file()) == ["a.jpg", "a.txt"]  # no partial files


def test_extracting_into_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file where a folder is needed")
    with pytest.raises(DataError, match="cannot extract") as info:
        safe_extract(mini_zip(tmp_path / "m.zip"), tmp_path / "blocker" / "out")
    assert "\n" not in str(info.value)


def test_yaml_aliases_and_odd_splits_are_one_line(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefg", "bcdefgh"))
    (tmp_path / "bomb.yaml").write_text(bomb + "train: x\nval: x\nnames: [*h]\n")  # 9**8 = 43M strings if expanded
    with pytest.raises(DataError, match="aliases are expanded"):
        load_data_config(tmp_path / "bomb.yaml")
    (tmp_path / "long.yaml").write_text(f"train: x\nval: x\nnames: [{'n' * 500}]\n")
    with pytest.raises(DataError, match="1..128 printable characters"):
        load_data_config(tmp_path / "long.yaml")
    make_set(tmp_path / "set", {"a.jpg": (write_jpg, GOOD_LABEL)})
    (tmp_path / "test.yaml").write_text(f"path: {tmp_path}\ntrain: set/images/train\nval: set/images/train\n"
                                        "test: [[set/images/train], {a: 1}]\nnc: 1\n")
    with pytest.raises(DataError, match="'test' must be a path or a list of paths") as info:
        load_data_config(tmp_path / "test.yaml")
    assert "\n" not in str(info.value)


def test_a_download_never_lands_beside_the_data_set_or_replaces_a_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 2 of issue 31: a YAML without ``path`` in a project's data folder, a missing split and a download
    of ``train.py`` must not replace the project's train.py (the root's parent) nor any file in the root."""
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    served = tmp_path / "served"
    served.mkdir()
    (served / "train.py").write_text("print('replaced')")
    mini_zip(served / "mini.zip", extra={"mini/keep.txt": "from the archive"})
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("the user's train.py")
    data = project / "data" / "d.yaml"
    with serve_folder(served) as url:
        data.write_text(f"train: images/train\nval: images/train\nnc: 1\ndownload: {url}/train.py\n")
        with pytest.raises(DataError, match="does not exist"):  # fetched into the root, where no split appears
            load_data_config(data)
        assert (project / "data" / "train.py").read_text() == "print('replaced')"
        (project / "data" / "train.py").write_text("the user's data/train.py")
        with pytest.raises(DataError, match="already exists") as info:
            load_data_config(data)
        assert "\n" not in str(info.value)
        with pytest.raises(DataError, match="already exists"):
            download_dataset({"url": f"{url}/train.py", "dir": "."}, project / "data", homes=[project])
        root = tmp_path / "home" / "mini"
        (root / "images" / "train").mkdir(parents=True)
        (root / "images" / "train" / "a.jpg").write_bytes(b"the user's image")
        (root / "keep.txt").write_text("the user's file")
        download_dataset(f"{url}/mini.zip", root, homes=[tmp_path / "home"])
        assert (root / "labels" / "train" / "a.txt").is_file()  # what was missing is extracted ...
    assert (project / "train.py").read_text() == "the user's train.py"
    assert (project / "data" / "train.py").read_text() == "the user's data/train.py"
    assert (root / "images" / "train" / "a.jpg").read_bytes() == b"the user's image"  # ... nothing replaced
    assert (root / "keep.txt").read_text() == "the user's file"
    assert not [p for p in tmp_path.rglob(".*part*")]


def test_every_path_of_a_data_yaml_stays_in_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    make_set(tmp_path / "cfg" / "set", {"a.jpg": (write_jpg, GOOD_LABEL)})
    make_set(tmp_path / "private", {"b.jpg": (write_jpg, GOOD_LABEL)})
    (tmp_path / "cfg" / "set" / "out").symlink_to(tmp_path / "private")
    data = tmp_path / "cfg" / "d.yaml"
    cases = {
        "path: ../private\ntrain: images/train\nval: images/train\n": "path '../private' leads outside",
        f"path: {tmp_path / 'private'}\ntrain: images/train\nval: images/train\n": "leads outside",
        "path: set\ntrain: ../../private/images/train\nval: images/train\n": "'train' entry .* leads outside",
        f"path: set\ntrain: images/train\nval: {tmp_path / 'private' / 'images' / 'train'}\n": "'val' entry",
        "path: set\ntrain: images/train\nval: out/images/train\n": "leads outside",  # a symlink out
        "path: set\ntrain: images/train\nval: {coco: ../../x.json, images: images/train}\n": "leads outside",
        "path: set\ntrain: images/train\nval: images/train\ndownload: {url: 'http://127.0.0.1:9/x.zip', dir: out}\n"
        "test: images/missing\n": "leads outside",
        "path: \"a\\0b\"\ntrain: images/train\nval: images/train\n": "not a usable path",
    }
    for text, words in cases.items():
        data.write_text(text + "nc: 1\n")
        with pytest.raises(DataError, match=words) as info:
            load_data_config(data)
        assert "\n" not in str(info.value)
    data.write_text(f"path: {tmp_path / 'cfg' / 'set'}\ntrain: images/train\nval: [images/train]\nnc: 1\n")
    assert load_data_config(data).val == [(tmp_path / "cfg" / "set" / "images" / "train").resolve()]
