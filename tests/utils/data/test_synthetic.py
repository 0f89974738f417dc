"""The built-in synthetic data set: deterministic, valid YOLO labels, generated once, atomic."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.data import synthetic
from utils.data.config import DataError, load_data_config
from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic, is_valid, make_spec

SMALL = {"n_train": 6, "n_val": 3, "img_size": (64, 80), "seed": 3}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    a = _files(ensure_synthetic(tmp_path / "a", **SMALL))
    b = _files(ensure_synthetic(tmp_path / "b", **SMALL))
    c = _files(ensure_synthetic(tmp_path / "c", **{**SMALL, "seed": 4}))
    assert a == b
    assert a.keys() == c.keys() and a != c
    assert sum(k.startswith("images/train") for k in a) == 6 and sum(k.startswith("labels/val") for k in a) == 3


def test_labels_are_valid_and_enclose_the_shapes(tmp_path: Path) -> None:
    root = ensure_synthetic(tmp_path / "s", **SMALL)
    for label_file in sorted((root / "labels" / "train").glob("*.txt")):
        img = cv2.imread(str(root / "images" / "train" / f"{label_file.stem}.jpg"))
        h, w = img.shape[:2]
        assert 64 <= h <= 80 and 64 <= w <= 80
        rows = np.loadtxt(label_file, ndmin=2)
        assert 1 <= len(rows) <= 4
        assert set(rows[:, 0].astype(int)) <= set(range(len(SYNTHETIC_NAMES)))
        assert (rows[:, 1:] >= 0).all() and (rows[:, 1:] <= 1).all()
        assert (rows[:, 3:] * [w, h] >= 0.2 * min(h, w) - 1).all()  # not tiny: >= min_object of the short side


def test_skipped_when_valid_and_regenerated_when_damaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = ensure_synthetic(tmp_path / "s", **SMALL)
    calls = []
    real = synthetic.generate
    monkeypatch.setattr(synthetic, "generate", lambda *a: calls.append(a) or real(*a))
    ensure_synthetic(tmp_path / "s", **SMALL)
    assert calls == []
    (root / "images" / "train" / "00000.jpg").unlink()
    assert not is_valid(root, make_spec(**SMALL))
    ensure_synthetic(tmp_path / "s", **SMALL)
    assert len(calls) == 1 and is_valid(root, make_spec(**SMALL))
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary folder was renamed into place


def test_default_folder_is_named_by_version_and_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path))
    root = ensure_synthetic(**SMALL)
    key = make_spec(**SMALL).key()
    assert root.parent == tmp_path and root.name == f"synthetic-v{synthetic.SYNTHETIC_VERSION}-{key}"
    assert make_spec(**SMALL).key() != make_spec(**{**SMALL, "n_train": 7}).key()


def test_synthetic_yaml_generates_on_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "syn.yaml"
    data.write_text("synthetic: {n_train: 4, n_val: 2, img_size: 64, seed: 1}\ntrain: images/train\n"
                    "val: images/val\nnc: 3\nnames: [circle, square, triangle]\n")
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    config = load_data_config(data)
    assert config.nc == 3 and config.names == SYNTHETIC_NAMES
    assert len(list(config.train[0].glob("*.jpg"))) == 4 and len(list(config.val[0].glob("*.jpg"))) == 2


def test_bad_params_are_rejected() -> None:
    with pytest.raises(ValueError):
        make_spec(img_size=(100, 50))
    with pytest.raises(ValueError):
        make_spec(n_train=0)
    # a data YAML's parameters: a billion images, 10^6-pixel sides, inf, NaN, strings (issue 31: bounded input)
    for bad in ({"n_train": 10**9}, {"img_size": [32, 10**6]}, {"img_size": float("inf")}, {"img_size": "abc"},
                {"seed": -1}, {"n_train": True}, {"max_object": float("nan")}, {"max_objects": 10**6}):
        with pytest.raises(ValueError):
            make_spec(**bad)


def test_a_yaml_asking_for_a_huge_set_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    data = tmp_path / "big.yaml"
    for params in ("{n_train: 1000000000}", "{img_size: .inf}", "{img_size: [32, 100000]}", "{1: 2}"):
        data.write_text(f"synthetic: {params}\ntrain: images/train\nval: images/val\nnc: 3\n")
        with pytest.raises(DataError, match="bad 'synthetic' parameters") as info:
            load_data_config(data)
        assert "\n" not in str(info.value)
    assert not (tmp_path / "home").exists()


def test_tiny_dataset_fixture(tiny_dataset: Path) -> None:
    config = load_data_config(tiny_dataset)
    assert len(list(config.train[0].glob("*.jpg"))) == 24 and len(list(config.val[0].glob("*.jpg"))) == 12


def _user_files(folder: Path) -> dict[str, bytes]:
    """A folder holding someone's files, some named as the generator names its own."""
    files = {"notes.txt": b"my notes", "images/train/00000.jpg": b"my photo",
             "labels/train/00000.txt": b"0 .5 .5 .1 .1\n"}
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return files


def test_a_data_yaml_never_deletes_a_folder_it_points_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 1 of issue 31: ``synthetic:`` with ``path:`` at a user's folder must not regenerate the set there."""
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path / "home"))
    project = tmp_path / "project"
    files = _user_files(project / "mine")
    yaml_text = ("synthetic: {n_train: 2, n_val: 1, img_size: 64, seed: 1}\ntrain: images/train\nval: images/val\n"
                 "nc: 3\n")
    data = project / "syn.yaml"
    for path in (project / "mine", "mine", "."):  # absolute, relative, and the YAML's own folder
        data.write_text(f"path: {path}\n" + yaml_text)
        with pytest.raises(DataError, match="not empty|did not make") as info:
            load_data_config(data)
        assert "\n" not in str(info.value)
    outside = tmp_path / "elsewhere"
    outside_files = _user_files(outside)
    for path in (outside, "../elsewhere", "../.."):  # out of the YAML's folder and the data home
        data.write_text(f"path: {path}\n" + yaml_text)
        with pytest.raises(DataError, match="leads outside"):
            load_data_config(data)
    assert _files(project / "mine") == files and _files(outside) == outside_files
    assert sorted(p.name for p in project.iterdir()) == ["mine", "syn.yaml"]  # no temporary folder left


def test_generation_goes_only_into_new_empty_or_its_own_folders(tmp_path: Path) -> None:
    from utils.errors import UserError

    (tmp_path / "empty").mkdir()
    assert is_valid(ensure_synthetic(tmp_path / "empty", **SMALL), make_spec(**SMALL))
    user = tmp_path / "user"
    files = _user_files(user)
    (user / synthetic.MANIFEST).write_text('{"version": 1, "spec": {}, "names": []}')  # a manifest is not proof
    files[synthetic.MANIFEST] = (user / synthetic.MANIFEST).read_bytes()
    with pytest.raises(UserError, match="did not make") as info:
        ensure_synthetic(user, **SMALL)
    assert "\n" not in str(info.value) and _files(user) == files
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UserError, match="not a folder"):
        ensure_synthetic(tmp_path / "a-file", **SMALL)
    assert (tmp_path / "a-file").read_text() == "x"


def test_its_own_set_is_regenerated_but_files_added_or_changed_there_are_kept(tmp_path: Path) -> None:
    """Only files the generator wrote (still as written) and the label caches made for them are removed."""
    from utils.errors import UserError

    root = ensure_synthetic(tmp_path / "s", **SMALL)
    (root / "labels" / "train.cache").write_bytes(b"cache")  # what the label scan writes beside the set
    (root / "labels" / "train.cache.d" / "npy").mkdir(parents=True)
    (root / "labels" / "train.cache.d" / "npy" / "00000.npy").write_bytes(b"array")
    other = {**SMALL, "n_train": 4}
    assert is_valid(ensure_synthetic(root, **other), make_spec(**other))  # other parameters: regenerated in place
    assert not (root / "labels" / "train.cache").exists() and not (root / "labels" / "train.cache.d").exists()
    (root / "mine.txt").write_text("kept")
    (root / "images" / "val" / "00000.jpg").write_bytes(b"edited by the user")
    with pytest.raises(UserError, match="did not make or that changed") as info:
        ensure_synthetic(root, **SMALL)
    assert "mine.txt" in str(info.value) or "00000.jpg" in str(info.value)
    assert (root / "mine.txt").read_text() == "kept"
    assert (root / "images" / "val" / "00000.jpg").read_bytes() == b"edited by the user"
    assert not list(tmp_path.glob(".*"))  # no temporary folder left behind


def test_a_leftover_with_the_temporary_name_is_not_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    mine = tmp_path / f".s.tmp{os.getpid()}"  # the name the generator once used for its own temporary folder
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    ensure_synthetic(tmp_path / "s", **SMALL)
    assert (mine / "keep.txt").read_text() == "mine"
