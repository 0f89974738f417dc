"""ByteTrack and BoT-SORT on hand-made detection rows: each behaviour the papers describe, and ours at the edges."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest

from utils.tracking.config import TrackerConfig
from utils.tracking.registry import build_tracker, load_tracker_config
from utils.tracking.track import TrackState

BYTETRACK = load_tracker_config("bytetrack")
BOTSORT = load_tracker_config("botsort")


def box(cx: float, cy: float, conf: float = 0.9, cls: float = 0, size: float = 20, *extra: float) -> list[float]:
    return [cx - size / 2, cy - size / 2, cx + size / 2, cy + size / 2, conf, cls, *extra]


def track(config: TrackerConfig, frames: list[list[list[float]]], images: list[np.ndarray] | None = None,
          frame_rate: float = 30.0) -> list[dict[int, int]]:
    """Per frame {detection index: track ID} of what the tracker reports."""
    tracker = build_tracker(config, frame_rate)
    out = []
    for t, rows in enumerate(frames):
        tracked = tracker.update(np.array(rows, np.float64), None if images is None else images[t])
        out.append(dict(zip(tracked.index.tolist(), tracked.ids.tolist())))
    return out


@pytest.mark.parametrize("config", [BYTETRACK, BOTSORT], ids=["bytetrack", "botsort"])
def test_two_objects_crossing_keep_their_ids(config: TrackerConfig) -> None:
    frames = [[box(20 + 4 * t, 50), box(140 - 4 * t, 58)] for t in range(30)]  # they pass each other at t = 15
    result = track(config, frames)
    assert all(r == {0: 1, 1: 2} for r in result), result


def test_a_low_score_detection_keeps_its_object_tracked_through_the_second_association() -> None:
    frames = [[box(20 + 3 * t, 50, conf=0.15 if 10 <= t < 15 else 0.9)] for t in range(25)]
    with_low = track(BYTETRACK, frames)
    assert all(r == {0: 1} for r in with_low), with_low
    high_only = track(replace(BYTETRACK, track_low_thresh=0.25), frames)  # no detection below the high threshold
    assert all(high_only[t] == {} for t in range(10, 15)) and high_only[20] == {0: 1}  # lost, then found again


def test_new_tracks_need_a_second_frame_after_the_first_and_ids_count_objects() -> None:
    frames = [[box(20 + 2 * t, 30)] for t in range(8)]
    frames[3].append(box(100, 100, conf=0.5))  # a one-frame false detection
    for t in range(5, 8):
        frames[t].append(box(60, 100 + t))  # an object arriving at frame 5
    result = track(BYTETRACK, frames)
    assert result[0] == {0: 1} and result[3] == {0: 1}  # the false one never shows, never takes an ID
    assert result[5] == {0: 1} and result[6] == {0: 1, 1: 2} and result[7] == {0: 1, 1: 2}
    below = [[box(20, 30), box(80, 30, conf=0.2)] for _ in range(3)]  # under new_track_thresh: never a track
    assert track(BYTETRACK, below) == [{0: 1}] * 3


@pytest.mark.parametrize("buffer, fps, same", [(30, 30.0, True), (5, 30.0, False), (16, 15.0, False),
                                               (24, 15.0, True)])
def test_a_lost_track_waits_its_buffer_in_frames_at_30_fps(buffer: int, fps: float, same: bool) -> None:
    """Hidden for 10 frames: found again when the buffer, scaled to the frame rate, covers them."""
    frames = [[] if 10 <= t < 20 else [box(20 + 2 * t, 50)] for t in range(26)]
    result = track(replace(BYTETRACK, track_buffer=buffer), frames, frame_rate=fps)
    assert result[9] == {0: 1} and result[9 + 11] == ({0: 1} if same else {})
    assert result[25] == {0: 1 if same else 2}


def test_a_track_lost_past_its_buffer_is_removed() -> None:
    tracker = build_tracker(replace(BYTETRACK, track_buffer=3))
    tracker.update(np.array([box(20, 20)]))
    states = []
    for _ in range(5):
        tracker.update(np.zeros((0, 6)))
        states.append([t.state for t in tracker.tracks])
    assert states[0] == [TrackState.LOST] and states[2] == [TrackState.LOST] and states[3] == []


@pytest.mark.parametrize("config", [BYTETRACK, BOTSORT], ids=["bytetrack", "botsort"])
def test_extra_columns_come_back_untouched(config: TrackerConfig) -> None:
    """Mask coefficients or keypoints after the class: the rows the tracker returns are the detections' own."""
    rng = np.random.default_rng(0)
    tracker = build_tracker(config)
    for t in range(5):
        rows = np.array([box(20 + 2 * t, 30, 0.9, 1, 20, *rng.normal(size=5)),
                         box(90, 60 + t, 0.8, 2, 24, *rng.normal(size=5))])
        tracked = tracker.update(rows)
        assert tracked.rows.shape == (2, 11)
        np.testing.assert_array_equal(tracked.rows, rows[tracked.index])
        assert sorted(tracked.ids.tolist()) == [1, 2]


def test_an_object_stepping_out_of_the_frame_and_back_keeps_its_id() -> None:
    """The lost track waits inside the frame's edge (the frame tells the tracker its size)."""
    image = np.zeros((100, 160, 3), np.uint8)
    xs = [120 + 3 * t for t in range(11)] + [None] * 6 + [150 - 3 * t for t in range(6)]
    frames = [[] if x is None else [box(x, 50)] for x in xs]
    result = track(BYTETRACK, frames, [image] * len(frames))
    assert result[10] == {0: 1} and result[-1] == {0: 1}
    assert track(BYTETRACK, frames)[-1] == {0: 2}  # without the frame's size the track runs off beyond it


def textured_world(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    world = cv2.resize(rng.uniform(40, 200, (30, 40, 3)), (400, 300)).astype(np.uint8)
    for _ in range(150):
        x, y = int(rng.integers(0, 400)), int(rng.integers(0, 300))
        cv2.rectangle(world, (x, y), (x + 6, y + 5), tuple(int(v) for v in rng.integers(0, 255, 3)), -1)
    return world


def test_botsort_compensates_a_camera_jump_that_bytetrack_cannot() -> None:
    """Still objects filmed by a camera that jumps 14 pixels at frame 6: their boxes jump the other way."""
    world = textured_world()
    objects = [(150.0, 120.0), (230.0, 170.0), (180.0, 200.0)]
    for x, y in objects:
        cv2.circle(world, (int(x), int(y)), 7, (0, 0, 255), -1)
    images, frames = [], []
    for t in range(12):
        left = 60 + (14 if t >= 6 else 0)
        images.append(np.ascontiguousarray(world[50:250, left:left + 240]))
        frames.append([box(x - left, y - 50, size=14) for x, y in objects])
    assert track(BOTSORT, frames, images)[-1] == {0: 1, 1: 2, 2: 3}
    assert track(replace(BOTSORT, gmc_method="none"), frames, images)[-1] == {0: 4, 1: 5, 2: 6}
    assert track(BYTETRACK, frames, images)[-1] == {0: 4, 1: 5, 2: 6}


def test_botsort_appearance_pairs_a_weak_look_alike_detection() -> None:
    """A sure object seen once at a low score, a little off: IoU weighed by 0.3 is too weak to pair, its colour
    histogram matches (with_reid), so the track goes on through that frame instead of missing it."""
    image = np.full((120, 160, 3), 80, np.uint8)
    cv2.rectangle(image, (40, 40), (60, 60), (0, 200, 255), -1)
    cv2.rectangle(image, (45, 42), (65, 62), (0, 200, 255), -1)
    frames = [[box(50, 50)], [box(50, 50)], [box(55, 52, conf=0.3)], [box(55, 52)]]
    plain = track(replace(BOTSORT, gmc_method="none"), frames, [image] * 4)
    reid = track(replace(BOTSORT, gmc_method="none", with_reid=True), frames, [image] * 4)
    assert plain[2] == {} and plain[3] == {0: 1}  # lost for a frame, then found again
    assert reid[2] == {0: 1} and reid[3] == {0: 1}
