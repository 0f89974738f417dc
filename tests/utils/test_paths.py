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
