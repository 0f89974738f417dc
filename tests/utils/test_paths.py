"""Run folders and where data sets live."""

from __future__ import annotations

from pathlib import Path

import pytest

from utils.paths import IMG_SUFFIXES, ROOT, VID_SUFFIXES, data_home, increment_path


def test_increment_path_takes_the_next_free_number(tmp_path: Path) -> None:
    assert increment_path(tmp_path / "exp") == tmp_path / "exp"
    (tmp_path / "exp").mkdir()
    assert increment_path(tmp_path / "exp") == tmp_path / "exp2"
    (tmp_path / "exp7").mkdir()
    assert increment_path(tmp_path / "exp", mkdir=True) == tmp_path / "exp8" and (tmp_path / "exp8").is_dir()
    assert increment_path(tmp_path / "exp", exist_ok=True) == tmp_path / "exp"


def test_data_home_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("YOLO_DATA_DIR", raising=False)
    assert data_home() == ROOT / "datasets"
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path))
    assert data_home() == tmp_path


def test_media_suffixes_are_lower_case_and_disjoint() -> None:
    assert ".jpg" in IMG_SUFFIXES and ".mp4" in VID_SUFFIXES and not IMG_SUFFIXES & VID_SUFFIXES
    assert all(s == s.lower() and s.startswith(".") for s in IMG_SUFFIXES | VID_SUFFIXES)


def test_confined_keeps_paths_from_files_inside_their_folder(tmp_path: Path) -> None:
    from utils.errors import UserError
    from utils.paths import confined

    (tmp_path / "data" / "images").mkdir(parents=True)
    assert confined("images", tmp_path / "data") == (tmp_path / "data" / "images").resolve()
    assert confined(tmp_path / "data" / "images" / "a.jpg", tmp_path / "data").name == "a.jpg"
    assert confined(".", tmp_path / "data") == (tmp_path / "data").resolve()
    for escape in ("..", "../x", "images/../../x", "/etc/passwd", str(tmp_path)):
        with pytest.raises(UserError, match="leads outside"):
            confined(escape, tmp_path / "data", "split")
    (tmp_path / "data" / "link").symlink_to(tmp_path)  # a symlink out of the folder is outside too
    with pytest.raises(UserError, match="leads outside"):
        confined("link/x", tmp_path / "data")


def test_confined_refuses_values_that_are_not_paths_in_one_line(tmp_path: Path) -> None:
    from utils.errors import UserError
    from utils.paths import confined

    class Mine(UserError):
        pass

    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    for value in ("a\x00b", "", 7, ["x"], None, "loop/x"):
        with pytest.raises(Mine, match="is not a usable path|leads outside") as info:
            confined(value, tmp_path, "split", Mine)  # type: ignore[arg-type]
        assert "\n" not in str(info.value) and str(info.value).startswith("split ")


def test_confined_to_any_accepts_one_of_several_folders(tmp_path: Path) -> None:
    from utils.errors import UserError
    from utils.paths import confined_to_any

    beside, home = tmp_path / "cfg", tmp_path / "home"
    beside.mkdir()
    home.mkdir()
    assert confined_to_any("set", [beside, home]) == (beside / "set").resolve()  # relative: to the first
    assert confined_to_any(home / "coco", [beside, home]) == (home / "coco").resolve()
    assert confined_to_any("../home/x", [beside, home]) == (home / "x").resolve()
    for escape in ("..", "../elsewhere", "/etc", str(tmp_path)):
        with pytest.raises(UserError, match=f"leads outside {beside} and {home}"):
            confined_to_any(escape, [beside, home], "path")


# ------------------------------------------------------------------------------------------------ run folders
BAD_NAMES = ["..", ".", "../victim", "a/b", "a\\b", "/abs", "x\x00y", "two\nlines", "", ".hidden", "n" * 129,
             "é" * 101, None, 7]


@pytest.mark.parametrize("name", BAD_NAMES, ids=range(len(BAD_NAMES)))
def test_a_run_name_that_is_not_one_folder_name_is_one_line(name: object, tmp_path: Path) -> None:
    from utils.paths import RunFolderError, new_run_folder

    with pytest.raises(RunFolderError, match=r"^--name .* give one folder name") as info:
        new_run_folder(tmp_path / "runs", name)
    assert "\n" not in str(info.value) and not (tmp_path / "runs").exists()  # refused before anything is made


def test_new_run_folders_are_new_marked_and_numbered(tmp_path: Path) -> None:
    from utils.paths import RUN_MARKER, is_run_folder, new_run_folder

    project = tmp_path / "deep" / "runs"  # made when missing
    first = new_run_folder(project, "exp")
    assert first == project / "exp" and is_run_folder(first) and (first / RUN_MARKER).is_file()
    assert new_run_folder(project, "exp") == project / "exp2"
    (project / "exp7").mkdir()  # a folder of someone else's takes a number too, and is never adopted
    assert new_run_folder(project, "exp") == project / "exp8" and not is_run_folder(project / "exp7")
    (project / "exp9").symlink_to(tmp_path)  # so does a symlink, never followed
    assert new_run_folder(project, "exp") == project / "exp10"
    assert new_run_folder(project, "my run (b) 实验") == project / "my run (b) 实验"
    assert new_run_folder(project, "exp", exist_ok=True) == project / "exp"  # ours: reused


def test_exist_ok_never_adopts_a_folder_it_did_not_make(tmp_path: Path) -> None:
    from utils.paths import RunFolderError, is_run_folder, new_run_folder

    project = tmp_path / "runs"
    (project / "mine").mkdir(parents=True)
    (project / "mine" / "results.csv").write_text("my results")
    (project / "link").symlink_to(tmp_path)
    (project / "forged").mkdir()
    (project / "forged" / ".yolo-run").write_text("something else\n")
    for name in ("mine", "link", "forged"):
        with pytest.raises(RunFolderError, match=r"^--exist-ok: .* was not made by this project") as info:
            new_run_folder(project, name, exist_ok=True)
        assert "\n" not in str(info.value)
    assert (project / "mine" / "results.csv").read_text() == "my results" and not is_run_folder(project / "mine")
    assert new_run_folder(project, "new", exist_ok=True) == project / "new"  # missing: made (and marked)
    assert is_run_folder(project / "new")


def test_exist_ok_says_it_reuses_only_a_folder_a_run_made() -> None:
    """--exist-ok's help (and so docs/flags.md, which tests/test_docs.py keeps equal to it) names the marker."""
    from utils.cli import FLAGS
    from utils.paths import RUN_MARKER

    help_text = FLAGS["exist_ok"][1]["help"]
    assert RUN_MARKER in help_text and "only if a run of this project made it" in help_text
    assert "instead of incrementing" not in help_text


def test_a_project_that_cannot_be_a_folder_is_one_line(tmp_path: Path) -> None:
    from utils.paths import RunFolderError, new_run_folder

    (tmp_path / "a-file").write_text("x")
    for project, expected in ((tmp_path / "a-file", "cannot be a folder"), ("bad\x00project", "not a usable path"),
                              (tmp_path / "a-file" / "under", "cannot be a folder")):
        with pytest.raises(RunFolderError, match=expected) as info:
            new_run_folder(project, "exp")
        assert "\n" not in str(info.value)
    assert (tmp_path / "a-file").read_text() == "x"


def test_only_an_unused_run_folder_of_ours_is_discarded(tmp_path: Path) -> None:
    from utils.paths import discard_if_unused, discarded_on_failure, new_run_folder

    unused = new_run_folder(tmp_path, "exp")
    (unused / "labels").mkdir()  # an empty folder it made is nothing written
    with pytest.raises(KeyError), discarded_on_failure(unused):
        raise KeyError("a start that failed")
    assert not unused.exists()
    used = new_run_folder(tmp_path, "exp")
    (used / "opt.yaml").write_text("epochs: 1\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    assert not discard_if_unused(used) and not discard_if_unused(theirs) and not discard_if_unused(None)
    assert (used / "opt.yaml").is_file() and theirs.is_dir()
    kept = new_run_folder(tmp_path, "kept")
    with discarded_on_failure(kept):
        pass  # no failure: kept
    assert kept.is_dir()


def test_derived_paths_stay_inside_their_run_folder(tmp_path: Path) -> None:
    from utils.paths import derived_path, safe_stem

    run = tmp_path / "run"
    run.mkdir()
    assert derived_path(run, "labels", "bus", suffix=".txt") == (run / "labels" / "bus.txt").resolve()
    assert derived_path(run, "..") == (run / "_").resolve()  # the stem of an image named '...jpg'
    assert derived_path(run, "../../etc/passwd").parent == run.resolve()
    assert derived_path(run, "a\x00b/c", suffix=".png").name == "a_b_c.png"
    assert safe_stem("..", "image3") == "image3" and safe_stem(".hidden", "x") == "hidden"
    assert safe_stem("straße 1", "x") == "straße 1" and len(safe_stem("n" * 300, "x")) == 100
    (run / "escape").symlink_to(tmp_path)  # a symlink inside the run folder does not lead out either
    from utils.paths import RunFolderError

    with pytest.raises(RunFolderError, match="leads outside"):
        derived_path(run, "escape", "x")
