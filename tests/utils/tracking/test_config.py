"""Tracker YAMLs: the shipped ones, ultralytics' keys, and one line for every bad file."""

from __future__ import annotations

from pathlib import Path

import pytest

from utils.errors import UserError
from utils.tracking.config import TRACKERS_DIR, TrackerConfig, TrackerConfigError
from utils.tracking.registry import TRACKERS, build_tracker, load_tracker_config, tracker_names

ULTRALYTICS_BOTSORT = """\
tracker_type: botsort # tracker type, ['botsort', 'bytetrack']
track_high_thresh: 0.25
track_low_thresh: 0.1
new_track_thresh: 0.25
track_buffer: 30
match_thresh: 0.8
fuse_score: True
gmc_method: sparseOptFlow
proximity_thresh: 0.5
appearance_thresh: 0.8
with_reid: False
model: auto
"""


def test_the_shipped_trackers_load_by_name_and_file_name() -> None:
    assert tracker_names() == ("bytetrack", "botsort")
    assert sorted(p.stem for p in TRACKERS_DIR.glob("*.yaml")) == sorted(tracker_names())
    for name in tracker_names():
        config = load_tracker_config(name)
        assert config.tracker_type == name and config == load_tracker_config(f"{name}.yaml")
        assert isinstance(build_tracker(config), TRACKERS[name])
    default = TrackerConfig()
    byte = load_tracker_config("bytetrack")
    assert (byte.track_high_thresh, byte.track_low_thresh, byte.new_track_thresh, byte.track_buffer,
            byte.match_thresh, byte.fuse_score) == (default.track_high_thresh, default.track_low_thresh,
                                                    default.new_track_thresh, 30, 0.8, True)


def test_an_ultralytics_file_reads_unchanged_and_a_users_file_wins_over_the_name(tmp_path: Path,
                                                                                monkeypatch) -> None:
    path = tmp_path / "custom.yaml"
    path.write_text(ULTRALYTICS_BOTSORT.replace("track_buffer: 30", "track_buffer: 60"))
    config = load_tracker_config(path)
    assert config.tracker_type == "botsort" and config.track_buffer == 60 and config.source == str(path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "botsort.yaml").write_text(ULTRALYTICS_BOTSORT.replace("with_reid: False", "with_reid: True"))
    assert load_tracker_config("botsort.yaml").with_reid  # the file where the user is
    assert not load_tracker_config("botsort").with_reid  # the bare name: the shipped one


@pytest.mark.parametrize("text, expected", [
    ("tracker_type: bytetrack\ntrack_bufer: 30\n", "unknown key(s) 'track_bufer'"),
    ("tracker_type: bytetrack\ngmc_method: ecc\n", "gmc_method: not read by bytetrack"),
    ("tracker_type: deepsort\n", "tracker_type: 'deepsort' is not one of bytetrack, botsort"),
    ("track_buffer: 30\n", "tracker_type: None is not one of"),
    ("tracker_type: bytetrack\nmatch_thresh: 1.5\n", "match_thresh: 1.5 must be a number in [0, 1]"),
    ("tracker_type: bytetrack\nmatch_thresh: high\n", "match_thresh: 'high' must be a number"),
    ("tracker_type: bytetrack\ntrack_buffer: 2.5\n", "track_buffer: 2.5 must be an integer in [0, 100000]"),
    ("tracker_type: bytetrack\ntrack_buffer: true\n", "track_buffer: True must be an integer"),
    ("tracker_type: bytetrack\nfuse_score: 1\n", "fuse_score: 1 must be true or false"),
    ("tracker_type: botsort\ngmc_method: orb\n", "gmc_method: 'orb' is not one of sparseOptFlow, ecc, none"),
    ("tracker_type: botsort\nmodel: osnet_x0_25.pt\n", "only 'auto'"),
    ("tracker_type: bytetrack\ntrack_low_thresh: 0.5\ntrack_high_thresh: 0.3\n", "track_low_thresh 0.5 is above"),
    ("- tracker_type\n", "a tracker YAML is a mapping"),
    ("tracker_type: [unclosed\n", "not valid YAML"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)),
     "aliases are expanded"),
])
def test_a_bad_tracker_file_is_one_line_naming_the_file(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "tracker.yaml"
    path.write_text(text)
    with pytest.raises(TrackerConfigError) as error:
        load_tracker_config(path)
    message = str(error.value)
    assert expected in message and str(path) in message and "\n" not in message
    assert isinstance(error.value, UserError)


def test_gmc_null_means_none_and_a_missing_or_unknown_tracker_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "still.yaml"
    path.write_text("tracker_type: botsort\ngmc_method: null\n")
    assert load_tracker_config(path).gmc_method == "none"
    with pytest.raises(TrackerConfigError, match="--track sort: not a tracker; use bytetrack or botsort"):
        load_tracker_config("sort")
    with pytest.raises(TrackerConfigError, match="file not found"):
        load_tracker_config(tmp_path / "missing.yaml")
