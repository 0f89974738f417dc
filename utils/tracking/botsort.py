"""BoT-SORT (Aharon et al., 2022): ByteTrack's two-stage association with a Kalman filter over (cx, cy, w, h),
camera-motion compensation, and optional appearance features.

Before association every predicted track is moved by the camera's motion between the previous frame and this one
(``gmc_method``, utils/tracking/gmc.py), so a panning camera does not tear tracks from their objects. With
``with_reid`` each high-score box's appearance (utils/tracking/appearance.py) joins the cost: a pair's appearance
distance counts only when the boxes are close (IoU at least proximity_thresh) and alike (appearance similarity, the
cosine, at least appearance_thresh), and the pair costs the smaller of its IoU and appearance distances.
"""

from __future__ import annotations

import numpy as np

from utils.tracking.appearance import box_features, smoothed
from utils.tracking.bytetrack import ByteTracker
from utils.tracking.config import TrackerConfig
from utils.tracking.gmc import CameraMotion
from utils.tracking.matching import appearance_cost, fuse_score, iou_cost
from utils.tracking.track import Track


class BoTSORT(ByteTracker):
    """BoT-SORT for one video or stream."""

    keys = (*ByteTracker.keys, "gmc_method", "proximity_thresh", "appearance_thresh", "with_reid", "model")
    space = "xywh"
    still_when_unseen = (6, 7)  # width's and height's rates

    def __init__(self, config: TrackerConfig, frame_rate: float = 30.0) -> None:
        super().__init__(config, frame_rate)
        self.camera = CameraMotion(config.gmc_method)

    def _predict(self, frame: np.ndarray | None, rows: np.ndarray) -> None:
        super()._predict(frame, rows)
        if frame is None:
            return
        affine = self.camera.estimate(frame, rows[:, :4])
        if not self.tracks or np.allclose(affine, np.eye(2, 3)):
            return
        mean, covariance = self.kalman.warp(np.stack([t.mean for t in self.tracks]),
                                            np.stack([t.covariance for t in self.tracks]), affine)
        for track, m, c in zip(self.tracks, mean, covariance):
            track.mean, track.covariance = m, c

    def _features(self, frame: np.ndarray | None, boxes: np.ndarray) -> np.ndarray:
        if not self.config.with_reid or frame is None:
            return np.zeros((len(boxes), 0))
        return box_features(frame, boxes)

    def _cost(self, tracks: list[Track], rows: np.ndarray, features: np.ndarray) -> np.ndarray:
        iou = iou_cost(self._boxes(tracks), rows[:, :4])
        far = iou > 1.0 - self.config.proximity_thresh
        cost = fuse_score(iou, rows[:, 4]) if self.config.fuse_score else iou
        if not features.shape[1] or not tracks:
            return cost
        known = np.array([t.feature is not None for t in tracks])
        track_features = np.stack([t.feature if t.feature is not None else np.zeros(features.shape[1])
                                   for t in tracks])
        looks = appearance_cost(track_features, features)
        looks[far | (looks > 1.0 - self.config.appearance_thresh) | ~known[:, None]] = 1.0
        return np.minimum(cost, looks)

    def _remember(self, track: Track, feature: np.ndarray) -> None:
        if feature.any():
            track.feature = smoothed(track.feature, feature)

