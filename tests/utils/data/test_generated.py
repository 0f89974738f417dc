"""Generated sets delete only what they made (utils/data/generated.py), for every generator that uses it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from utils.data import generated
from utils.data.config import DataError, load_data_config
from utils.data.generated import MANIFEST, MARKER, GeneratedSet, file_record
from utils.data.synthetic import ensure_synthetic
from utils.errors import UserError
from utils.tasks.segment.synthetic import ensure_synthetic_seg

SMALL = {"n_train": 3, "n_val": 2, "img_size": 64, "seed": 1}
GENERATORS = {"detect": ensure_synthetic, "segment": ensure_synthetic_seg}


def _tree(root: Path) -> dict[str, bytes | str | None]:
    """Every entry under ``root``: a file's bytes, None for a folder, a symlink's target."""
    return {p.relative_to(root).as_posix(): (str(p.readlink()) if p.is_symlink() else None if p.is_dir() else
                                             p.read_bytes()) for p in sorted(root.rglob("*"))}


def _thesis_folder(folder: Path) -> dict[str, bytes | None]:
    """A user's folder: a thesis, a photo folder, and a ``synthetic.json`` claiming a segment set (an old set they
    added files to, or a stranger's bundle unpacked there)."""
    (folder / "my_photos").mkdir(parents=True)
    (folder / "my_photos" / "holiday.jpg").write_bytes(b"\xff\xd8 a photo")
    (folder / "my_thesis.tex").write_text("\\documentclass{article}")
    (folder / MANIFEST).write_text(json.dumps({"version": 1, "task": "segment", "spec": {}, "names": []}))
    return _tree(folder)


@pytest.mark.parametrize("task", list(GENERATORS))
def test_a_data_yaml_at_path_dot_never_empties_the_users_folder(task: str, tmp_path: Path) -> None:
    """Issue 44: ``synthetic: {task: segment}`` with ``path: .`` deleted the YAML's whole folder when it held a
    ``synthetic.json`` whose task is segment; now refused in one line, everything kept."""
    folder = tmp_path / "thesis"
    before = _thesis_folder(folder)
    data = folder / "data.yaml"
    data.write_text(f"path: .\nsynthetic: {{task: {task}, n_train: 2, n_val: 1, img_size: 64}}\n"
                    "train: images/train\nval: images/val\nnc: 3\n")
    before["data.yaml"] = data.read_bytes()
    with pytest.raises(DataError, match="thesis is not empty and holds .* but no .yolo-generated file") as info:
        load_data_config(data)
    assert "\n" not in str(info.value) and _tree(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis"]  # no temporary folder left


@pytest.mark.slow
def test_train_py_at_path_dot_never_empties_the_users_folder(tmp_path: Path, in_process: Callable[..., int],
                                                              tiny_cfg_file: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    """The same case through train.py: exit code 2, one line, the folder as it was, no run folder left."""
    from tests.helpers import train_args

    folder = tmp_path / "thesis"
    before = _thesis_folder(folder)
    data = folder / "data.yaml"
    data.write_text("path: .\nsynthetic: {task: segment, n_train: 4, n_val: 2, img_size: 64}\n"
                    "train: images/train\nval: images/val\nnc: 3\nnames: [circle, square, triangle]\n")
    before["data.yaml"] = data.read_bytes()
    code = in_process(train_args(data, tiny_cfg_file, tmp_path / "runs", epochs=1))
    err = capsys.readouterr().err
    assert code == 2 and "no .yolo-generated file" in err and err.count("\n") == 1, err
    assert _tree(folder) == before
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no empty run folder


@pytest.mark.parametrize("task", list(GENERATORS))
def test_a_forged_marker_and_manifest_remove_nothing_of_the_users(task: str, tmp_path: Path) -> None:
    """A stranger's bundle with our marker and a manifest listing its files with the right hashes: files outside
    the generator's own names, or outside the folder, are never removed."""
    ensure = GENERATORS[task]
    outside = tmp_path / "outside.txt"
    outside.write_text("elsewhere")
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "my_thesis.tex").write_text("thesis")
    (folder / "images" / "train").mkdir(parents=True)
    (folder / "images" / "train" / "00000.jpg").write_bytes(b"a photo named as ours")
    listed = {name: file_record(folder / name) for name in ("my_thesis.tex", "images/train/00000.jpg")}
    listed["../outside.txt"] = file_record(outside)
    (folder / MANIFEST).write_text(json.dumps({"version": 1, "task": task, "files": listed}))
    (folder / MARKER).write_text(json.dumps({"generator": f"synthetic-{task}"}))
    before = _tree(folder)
    with pytest.raises(UserError, match="'my_thesis.tex', a file the generator did not make") as info:
        ensure(folder, **SMALL)
    assert "\n" not in str(info.value) and _tree(folder) == before and outside.read_text() == "elsewhere"


@pytest.mark.parametrize("task", list(GENERATORS))
def test_regeneration_removes_exactly_its_own_unchanged_files(task: str, tmp_path: Path) -> None:
    ensure = GENERATORS[task]
    root = ensure(tmp_path / "set", **SMALL)
    manifest = json.loads((root / MANIFEST).read_text())
    assert json.loads((root / MARKER).read_text()) == {"generator": f"synthetic-{task}"}
    assert manifest["generator"] == f"synthetic-{task}" and len(manifest["files"]) == 2 * (3 + 2)
    assert manifest["files"]["images/train/00000.jpg"] == file_record(root / "images" / "train" / "00000.jpg")
    (root / "labels" / "train.cache").write_bytes(b"made by the label scan")
    bigger = {**SMALL, "n_train": 4}
    ensure(root, **bigger)  # other parameters: the earlier set (and its cache) replaced in place
    assert len(list((root / "images" / "train").iterdir())) == 4 and not (root / "labels" / "train.cache").exists()
    cases: dict[str, Callable[[Path], None]] = {
        "a file of the user's": lambda r: (r / "images" / "mine.txt").write_text("mine"),
        "an edited image": lambda r: (r / "images" / "val" / "00000.jpg").write_bytes(b"edited"),
        "an empty folder of the user's": lambda r: (r / "my_photos").mkdir(),
        "a symlink to elsewhere": lambda r: (r / "labels" / "val.cache").symlink_to(tmp_path / "outside"),
    }
    for what, change in cases.items():
        fresh = tmp_path / what.replace(" ", "_").replace("'", "")
        ensure(fresh, **SMALL)
        change(fresh)
        before = _tree(fresh)
        with pytest.raises(UserError, match="did not make") as info:
            ensure(fresh, **bigger)
        assert "\n" not in str(info.value) and _tree(fresh) == before, what


def test_a_complete_set_of_the_first_version_is_still_used_and_a_broken_one_refused(tmp_path: Path) -> None:
    """Sets written before the marker existed: reused when complete (nothing written into them), refused when they
    would have to be regenerated (they carry no marker), never emptied."""
    root = ensure_synthetic_seg(tmp_path / "old", **SMALL)
    manifest = json.loads((root / MANIFEST).read_text())
    (root / MARKER).unlink()
    (root / MANIFEST).write_text(json.dumps({k: manifest[k] for k in ("version", "task", "spec", "names")}))
    before = _tree(root)
    assert ensure_synthetic_seg(root, **SMALL) == root and _tree(root) == before
    (root / "images" / "val" / "00001.jpg").unlink()
    before = _tree(root)
    with pytest.raises(UserError, match="no .yolo-generated file"):
        ensure_synthetic_seg(root, **SMALL)
    assert _tree(root) == before


def test_a_generator_writing_a_name_it_does_not_own_is_a_defect(tmp_path: Path) -> None:
    rogue = GeneratedSet("rogue", re.compile(r"images/\d+\.jpg"))

    def write(folder: Path) -> None:
        (folder / "images").mkdir()
        (folder / "images" / "1.jpg").write_bytes(b"x")
        (folder / "notes.txt").write_text("not a name it owns")

    with pytest.raises(RuntimeError, match="'notes.txt', not one of its own names"):
        rogue.generate(tmp_path / "set", {"version": 1}, write)
    assert list(tmp_path.iterdir()) == []  # the temporary folder went too
    assert generated.LABEL_CACHES.fullmatch("labels/train.cache.d/npy/00000.npy")
