"""detect.py --track: IDs across a video's frames, per video and per stream, in the label files, the MOT-challenge
files and the drawn frames, for detectors and segmenters; bad tracker files are one line."""

from __future__ import annotations

import re
from pathlib import Path

import cv2
import numpy as np
import pytest

import detect
from tests.helpers import box_masks_segmenter, serve_folder, write_video
from tests.test_detect import scene
from utils.cli import run_main
from utils.plots.annotate import draw_detections

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MOT_LINE = re.compile(r"^(\d+),(\d+),(-?[\d.]+),(-?[\d.]+),([\d.]+),([\d.]+),([\d.]+),-1,-1,-1$")


@pytest.fixture
def low_tracker(tmp_path: Path) -> Path:
    """ByteTrack with thresholds an untrained model's scores reach (a tracker YAML of the user's)."""
    path = tmp_path / "low.yaml"
    path.write_text("tracker_type: bytetrack\ntrack_high_thresh: 0.001\ntrack_low_thresh: 0.0\n"
                    "new_track_thresh: 0.001\nmatch_thresh: 0.9\nfuse_score: false\n")
    return path


def still_video(path: Path, frames: int = 5, seed: int = 0) -> Path:
    """A video whose frames are the same image: a detector finds the same boxes in each, so IDs must hold."""
    return write_video(path, [scene(seed)] * frames)


def run_track(weights: Path, source: Path, tracker: Path | str, tmp_path: Path, *extra: str) -> detect.DetectResult:
    return detect.main(detect.parse_opt(["--weights", str(weights), "--source", str(source), "--img-size", "64",
                                         "--conf-thres", "0.001", "--max-det", "5", "--track", str(tracker),
                                         "--project", str(tmp_path / "runs"), *extra]))


def mot_rows(path: Path) -> list[tuple[int, ...]]:
    rows = []
    for line in path.read_text().splitlines():
        match = MOT_LINE.match(line)
        assert match, line
        rows.append(tuple(float(v) for v in match.groups()))
    return rows


def test_a_videos_objects_keep_their_ids_in_labels_mot_file_and_video(tiny_weights: Path, low_tracker: Path,
                                                                      tmp_path: Path) -> None:
    video = still_video(tmp_path / "clip.mp4")
    result = run_track(tiny_weights, video, low_tracker, tmp_path, "--save-txt", "--save-conf")
    assert len(result.track_ids) == len(result.detections) == 5
    first = result.track_ids[0]
    assert len(first) == 5 and sorted(first.tolist()) == [1, 2, 3, 4, 5]
    for (_, det), ids in zip(result.detections, result.track_ids):
        np.testing.assert_array_equal(ids, first)  # the same boxes in every frame: the same IDs, in order
        np.testing.assert_allclose(det, result.detections[0][1], atol=1e-4)
    label = (result.save_dir / "labels" / "clip_3.txt").read_text().splitlines()
    assert [int(line.split()[-1]) for line in label] == first.tolist()  # cls x y w h conf id: the ID last
    assert all(len(line.split()) == 7 for line in label)
    assert result.mot_files == [result.save_dir / "tracks" / "clip.txt"]
    rows = mot_rows(result.mot_files[0])
    assert [r[0] for r in rows] == [f for f in range(1, 6) for _ in range(5)]
    frame3 = [r for r in rows if r[0] == 3]
    det = result.detections[2][1]
    for (_, track_id, x, y, w, h, conf), box, ids_row in zip(frame3, det, first):
        assert track_id == ids_row
        np.testing.assert_allclose([x, y, x + w, y + h, conf], box[:5], atol=0.01)
    assert (result.save_dir / "clip.mp4").stat().st_size > 0


def test_each_video_starts_afresh_and_its_file_never_overwrites(tiny_weights: Path, low_tracker: Path,
                                                                 tmp_path: Path) -> None:
    folder = tmp_path / "videos"
    folder.mkdir()
    still_video(folder / "a.mp4", 3, seed=0)
    still_video(folder / "b.mp4", 4, seed=1)
    result = run_track(tiny_weights, folder, low_tracker, tmp_path, "--nosave")
    assert [p.name for p in result.mot_files] == ["a.txt", "b.txt"]
    assert sorted(result.track_ids[3].tolist()) == [1, 2, 3, 4, 5]  # b's first frame: IDs from 1 again
    assert [r[0] for r in mot_rows(result.mot_files[1])][-1] == 4
    again = run_track(tiny_weights, folder, low_tracker, tmp_path, "--nosave", "--name", "exp", "--exist-ok")
    assert [p.name for p in again.mot_files] == ["a2.txt", "b2.txt"]  # the earlier files are kept
    assert result.mot_files[0].read_text() == again.mot_files[0].read_text()


def test_still_images_are_one_sequence(tiny_weights: Path, low_tracker: Path, tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i:06d}.png"), scene(0))
    result = run_track(tiny_weights, folder, low_tracker, tmp_path, "--nosave")
    assert [p.name for p in result.mot_files] == ["images.txt"]
    assert {r[0] for r in mot_rows(result.mot_files[0])} == {1, 2, 3}
    np.testing.assert_array_equal(result.track_ids[2], result.track_ids[0])


def test_each_stream_has_its_own_tracker(tiny_weights: Path, low_tracker: Path, tmp_path: Path) -> None:
    (tmp_path / "served").mkdir()
    still_video(tmp_path / "served" / "v.mp4", 4)
    with serve_folder(tmp_path / "served") as url:
        listing = tmp_path / "two.streams"
        listing.write_text(f"{url}/v.mp4\n{url}/v.mp4\n")
        result = run_track(tiny_weights, listing, low_tracker, tmp_path, "--nosave")
    assert sorted(p.name for p in result.mot_files) == ["stream1.txt", "stream2.txt"]
    for path in result.mot_files:  # both streams see the same frames: the same IDs, each counted from 1
        assert {r[1] for r in mot_rows(path)} == {1, 2, 3, 4, 5}


def test_a_segmenters_masks_follow_the_tracked_detections(tiny_seg_weights: Path, low_tracker: Path,
                                                          tmp_path: Path) -> None:
    weights = box_masks_segmenter(tiny_seg_weights, tmp_path / "weights")
    result = run_track(weights, still_video(tmp_path / "seg.mp4", 3), low_tracker, tmp_path, "--save-txt")
    for (_, det), outlines, ids in zip(result.detections, result.extras["outlines"], result.track_ids):
        assert len(det) == len(outlines) == len(ids) > 0
        for row, outline in zip(det, outlines):
            assert np.abs(np.concatenate((outline.min(0), outline.max(0))) - row[:4]).max() <= 4.5
    lines = (result.save_dir / "labels" / "seg_2.txt").read_text().splitlines()
    assert sorted(int(line.split()[-1]) for line in lines) == sorted(result.track_ids[1].tolist())


def test_track_lowers_the_default_confidence_threshold_only() -> None:
    assert detect.parse_opt(["--track", "bytetrack"]).conf_thres == detect.TRACK_CONF_THRES == 0.1
    assert detect.parse_opt([]).conf_thres == detect.CONF_THRES == 0.25
    assert detect.parse_opt(["--track", "botsort", "--conf-thres", "0.3"]).conf_thres == 0.3


def test_track_alone_takes_ultralytics_default_tracker() -> None:
    assert detect.parse_opt(["--track"]).track == detect.DEFAULT_TRACKER == "botsort"
    opt = detect.parse_opt(["--track", "--save-txt"])  # before another flag
    assert (opt.track, opt.save_txt, opt.conf_thres) == ("botsort", True, detect.TRACK_CONF_THRES)
    assert detect.parse_opt(["--track", "bytetrack"]).track == "bytetrack" and detect.parse_opt([]).track == ""


def test_a_bad_tracker_is_one_line_before_any_work(tiny_weights: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("tracker_type: bytetrack\nmatch_thres: 0.8\n")
    for tracker, expected in ((bad, "unknown key(s) 'match_thres'"), ("sort", "--track sort: not a tracker")):
        opt = detect.parse_opt(["--weights", str(tiny_weights), "--source", str(tmp_path / "none.mp4"), "--track",
                                str(tracker), "--project", str(tmp_path / "runs")])
        assert run_main(detect.main, opt, "detect") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0] and err[0].startswith("detect: error:")
    assert not (tmp_path / "runs").exists()


def test_python_api_takes_track(tiny_weights: Path, tmp_path: Path) -> None:
    result = detect.run(weights=str(tiny_weights), source=str(still_video(tmp_path / "v.mp4", 2)), img_size=64,
                        track="botsort", project=str(tmp_path / "runs"), nosave=True)
    assert len(result.track_ids) == 2 and [p.name for p in result.mot_files] == ["v.txt"]


def test_ids_are_drawn_in_the_label() -> None:
    from utils.plots.annotate import _label_text

    canvas = np.full((60, 400, 3), 255, np.uint8)
    plain = draw_detections(canvas.copy(), [[10, 30, 50, 55]], [0], [0.91], ["person"], 1)
    with_id = draw_detections(canvas.copy(), [[10, 30, 50, 55]], [0], [0.91], ["person"], 1, ids=[7])
    assert _label_text(0, 0.91, ["person"], False, 7) == "id:7 person 0.91"
    assert _label_text(0, 0.91, ["person"], True, 7) == "id:7 person"
    tag_width = [int((img[:30] != 255).any(-1).any(0).sum()) for img in (plain, with_id)]
    assert tag_width[1] > tag_width[0]  # the longer tag is drawn
