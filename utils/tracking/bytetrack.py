"""ByteTrack (Zhang et al., 2022): every detection box associated, high-score and low-score ones in two stages.

Per frame: all live tracks are predicted one frame ahead by a Kalman filter (xyah space); confirmed tracks (tracked
and lost) are paired with the high-score detections (conf >= track_high_thresh) by IoU, score-fused when
fuse_score, at most match_thresh; the tracked ones left over are paired with the low-score detections
(track_low_thresh < conf < track_high_thresh) by IoU alone (at most ``LOW_MATCH_THRESH``), which keeps an object
through occlusion and blur, when its score drops; tracked ones still unpaired become lost. Tracks born last frame
are paired with the high-score detections left (at most ``NEW_MATCH_THRESH``) and confirmed, or removed; the
high-score detections still left at or above new_track_thresh start tracks. Lost tracks older than the buffer
are removed, and of a tracked and a lost track on the same spot (IoU above ``DUPLICATE_IOU``) the younger goes.
"""

from __future__ import annotations

import numpy as np

from utils.tracking.config import TrackerConfig
from utils.tracking.kalman import KalmanBoxFilter, measurement_to_xyxy, xyxy_to_measurement
from utils.tracking.matching import assign, fuse_score, iou_cost, iou_matrix
from utils.tracking.track import Track, Tracked, TrackState

LOW_MATCH_THRESH = 0.5  # the low-score association's largest 1 - IoU
NEW_MATCH_THRESH = 0.7  # a track born last frame and a detection: the largest cost
DUPLICATE_IOU = 0.85
REFERENCE_FPS = 30.0  # track_buffer counts frames at this rate


class ByteTracker:
    """ByteTrack for one video or stream: ``update(rows, frame)`` once per frame, in order."""

    keys: tuple[str, ...] = ("tracker_type", "track_high_thresh", "track_low_thresh", "new_track_thresh",
                             "track_buffer", "match_thresh", "fuse_score")
    space = "xyah"
    still_when_unseen = (7,)  # state components whose rate an unseen track forgets: its height's

    def __init__(self, config: TrackerConfig, frame_rate: float = REFERENCE_FPS) -> None:
        self.config = config
        self.kalman = KalmanBoxFilter(self.space)
        rate = frame_rate if frame_rate and frame_rate > 0 else REFERENCE_FPS
        self.max_lost = round(rate / REFERENCE_FPS * config.track_buffer)
        self.frame_id = 0
        self.next_id = 1
        self.tracks: list[Track] = []  # every live track: new, tracked and lost

    # --------------------------------------------------------------------------------------------------- the frame
    def update(self, rows: np.ndarray, frame: np.ndarray | None = None) -> Tracked:
        """Track a frame's detection rows (k, 6 + extra): x1, y1, x2, y2 in the frame's pixels, conf, cls, then any
        columns, carried along untouched. ``frame`` (BGR) is what camera-motion and appearance read, when used."""
        rows = np.asarray(rows, np.float64)
        rows = rows.reshape(len(rows), -1) if rows.size else np.zeros((0, 6))
        config, self.frame_id = self.config, self.frame_id + 1
        for track in self.tracks:
            track.det_index = -1
        scores = rows[:, 4]
        high = np.flatnonzero(scores >= config.track_high_thresh)
        low = np.flatnonzero((scores > config.track_low_thresh) & (scores < config.track_high_thresh))
        features = self._features(frame, rows[high, :4])
        self._predict(frame, rows)
        if frame is not None:
            self._wait_at_edges(frame.shape[:2])

        confirmed = [t for t in self.tracks if t.state in (TrackState.TRACKED, TrackState.LOST)]
        pairs, left_tracks, left_high = assign(self._cost(confirmed, rows[high], features), config.match_thresh)
        self._matched(confirmed, pairs, rows, high, features)

        still = [confirmed[i] for i in left_tracks if confirmed[i].state == TrackState.TRACKED]
        pairs, left_tracks, _ = assign(iou_cost(self._boxes(still), rows[low, :4]), LOW_MATCH_THRESH)
        self._matched(still, pairs, rows, low, None)
        for i in left_tracks:
            still[i].state = TrackState.LOST

        high, features = high[left_high], features[left_high]
        newborn = [t for t in self.tracks if t.state == TrackState.NEW]
        pairs, left_new, left_high = assign(self._cost(newborn, rows[high], features), NEW_MATCH_THRESH)
        self._matched(newborn, pairs, rows, high, features)
        for i in left_new:
            newborn[i].state = TrackState.REMOVED

        self._start_tracks(rows, high[left_high], features[left_high])
        for track in self.tracks:
            if track.state == TrackState.LOST and self.frame_id - track.frame > self.max_lost:
                track.state = TrackState.REMOVED
        self._remove_duplicates()
        self.tracks = [t for t in self.tracks if t.state != TrackState.REMOVED]
        return self._output(rows)

    def _output(self, rows: np.ndarray) -> Tracked:
        shown = [t for t in self.tracks if t.state == TrackState.TRACKED and t.det_index >= 0]
        index = np.array([t.det_index for t in shown], np.int64)
        return Tracked(rows[index], np.array([t.track_id for t in shown], np.int64), index)

    # --------------------------------------------------------------------------------------------------- its steps
    def _predict(self, frame: np.ndarray | None, rows: np.ndarray) -> None:
        """Every live track one frame ahead (BoT-SORT also compensates the camera's motion here)."""
        if not self.tracks:
            return
        mean = np.stack([t.mean for t in self.tracks])
        covariance = np.stack([t.covariance for t in self.tracks])
        lost = np.array([t.state != TrackState.TRACKED for t in self.tracks])
        for k in self.still_when_unseen:  # an unseen track's size stops changing (it would shrink or grow unchecked)
            mean[lost, k] = 0.0
        mean, covariance = self.kalman.predict(mean, covariance)
        for track, m, c in zip(self.tracks, mean, covariance):
            track.mean, track.covariance = m, c

    def _wait_at_edges(self, shape: tuple[int, int]) -> None:
        """An unseen track whose predicted box leaves the frame (``shape`` (h, w)) stops just inside its edge: an
        object that steps out and back is found again where it left, not beyond the frame where no detection can
        be."""
        limits = np.array([shape[1], shape[0]], np.float64)
        for track in self.tracks:
            if track.state == TrackState.TRACKED:
                continue
            box = measurement_to_xyxy(track.mean[None], self.space)[0]
            size = box[2:] - box[:2]
            low = np.minimum(size / 2, limits / 2)  # the centre's range that keeps the box inside
            centre = np.clip(track.mean[:2], low, limits - low)
            if not np.array_equal(centre, track.mean[:2]):
                track.mean[:2], track.mean[4:6] = centre, 0.0

    def _features(self, frame: np.ndarray | None, boxes: np.ndarray) -> np.ndarray:
        """Appearance features of the high-score boxes ((n, 0) when the tracker uses none)."""
        return np.zeros((len(boxes), 0))

    def _cost(self, tracks: list[Track], rows: np.ndarray, features: np.ndarray) -> np.ndarray:
        """The cost of pairing ``tracks`` with high-score detection ``rows``: 1 - IoU, score-fused when asked."""
        cost = iou_cost(self._boxes(tracks), rows[:, :4])
        return fuse_score(cost, rows[:, 4]) if self.config.fuse_score else cost

    def _boxes(self, tracks: list[Track]) -> np.ndarray:
        """The tracks' predicted corner boxes (n, 4)."""
        if not tracks:
            return np.zeros((0, 4))
        return measurement_to_xyxy(np.stack([t.mean for t in tracks]), self.space)

    def _matched(self, tracks: list[Track], pairs: np.ndarray, rows: np.ndarray, det_index: np.ndarray,
                 features: np.ndarray | None) -> None:
        """Correct each paired track with its detection; a lost one comes back, a new one is confirmed."""
        if not len(pairs):
            return
        paired = [tracks[i] for i in pairs[:, 0]]
        chosen = det_index[pairs[:, 1]]
        mean, covariance = self.kalman.update(np.stack([t.mean for t in paired]),
                                              np.stack([t.covariance for t in paired]),
                                              xyxy_to_measurement(rows[chosen, :4], self.space))
        for k, track in enumerate(paired):
            track.mean, track.covariance = mean[k], covariance[k]
            track.row, track.frame, track.det_index = rows[chosen[k]].copy(), self.frame_id, int(chosen[k])
            if features is not None and features.shape[1]:
                self._remember(track, features[pairs[k, 1]])
            if track.track_id == 0:
                track.track_id, self.next_id = self.next_id, self.next_id + 1
            track.state = TrackState.TRACKED

    def _remember(self, track: Track, feature: np.ndarray) -> None:
        """Keep a matched box's appearance on its track (BoT-SORT)."""

    def _start_tracks(self, rows: np.ndarray, det_index: np.ndarray, features: np.ndarray) -> None:
        """A track for each unpaired high-score detection sure enough (new_track_thresh); on the first frame they
        are confirmed at once, later they wait for a second detection."""
        keep = rows[det_index, 4] >= self.config.new_track_thresh
        det_index, features = det_index[keep], features[keep]
        if not len(det_index):
            return
        mean, covariance = self.kalman.initiate(xyxy_to_measurement(rows[det_index, :4], self.space))
        for k, i in enumerate(det_index):
            track = Track(mean[k], covariance[k], rows[i].copy(), self.frame_id, self.frame_id, det_index=int(i))
            if features.shape[1]:
                self._remember(track, features[k])
            if self.frame_id == 1:
                track.state, track.track_id, self.next_id = TrackState.TRACKED, self.next_id, self.next_id + 1
            self.tracks.append(track)

    def _remove_duplicates(self) -> None:
        """A track born while another was lost, over the lost one's spot, is that object twice: keep the one
        followed longer. (A lost track behind an object tracked all along is not a duplicate: it stays.)"""
        tracked = [t for t in self.tracks if t.state == TrackState.TRACKED]
        lost = [t for t in self.tracks if t.state == TrackState.LOST]
        if not tracked or not lost:
            return
        overlap = iou_matrix(self._boxes(tracked), self._boxes(lost))
        for i, j in zip(*np.nonzero(overlap > DUPLICATE_IOU)):
            if tracked[i].start_frame > lost[j].frame:
                younger = tracked[i] if tracked[i].age < lost[j].age else lost[j]
                younger.state = TrackState.REMOVED
