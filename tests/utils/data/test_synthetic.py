"""The built-in synthetic data set: deterministic, valid YOLO labels, generated once, atomic."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.data import synthetic
from utils.data.config import load_data_config
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


def test_tiny_dataset_fixture(tiny_dataset: Path) -> None:
    config = load_data_config(tiny_dataset)
    assert len(list(config.train[0].glob("*.jpg"))) == 24 and len(list(config.val[0].glob("*.jpg"))) == 12
