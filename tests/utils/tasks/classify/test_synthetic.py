"""utils/tasks/classify/synthetic.py: the built-in classification set written deterministically into class
folders, read back, and made by ensure_synthetic_cls through the generated-set mechanism (never over a user's
file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from utils.data.generated import GeneratedSetError
from utils.data.synthetic import make_spec
from utils.tasks.classify.folders import scan_classification
from utils.tasks.classify.synthetic import ensure_synthetic_cls, write_cls_set
from utils.tasks.classify.synthetic import split_counts as cls_counts


def test_synthetic_classification_set(tmp_path: Path) -> None:
    spec = make_spec(7, 4, 64, seed=3)
    names = write_cls_set(tmp_path / "a", spec)
    write_cls_set(tmp_path / "b", spec)
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)
    data = scan_classification(tmp_path / "a")
    assert data.names == ["circle", "square", "triangle"] and len(data.train) == 7 and len(data.val) == 4
    counts = cls_counts(spec)
    assert data.train.counts().tolist() == [counts[f"train/{n}"] for n in data.names] == [3, 2, 2]


def test_ensure_makes_the_set_once_and_never_into_a_users_folder(tmp_path: Path) -> None:
    root = ensure_synthetic_cls(tmp_path / "set", n_train=6, n_val=3, img_size=32)
    first = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg"))
    assert len(first) == 9 and (root / "synthetic.json").is_file()
    stamp = (root / first[0]).stat().st_mtime_ns
    assert ensure_synthetic_cls(tmp_path / "set", n_train=6, n_val=3, img_size=32) == root  # reused as it is
    assert (root / first[0]).stat().st_mtime_ns == stamp
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(GeneratedSetError, match="notes.txt"):
        ensure_synthetic_cls(mine, n_train=6, n_val=3, img_size=32)
    assert (mine / "notes.txt").read_text() == "keep" and sorted(mine.iterdir()) == [mine / "notes.txt"]
