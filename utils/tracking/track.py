"""One tracked object (its Kalman state, its life cycle, the detection it was last matched to) and what a tracker
returns for a frame.

A track is born ``NEW`` from a detection no track took; a second detection in the next frame confirms it
(``TRACKED``, and only then does it get an ID, so IDs count objects, not one-frame flickers; on a video's first
frame tracks are confirmed at once). A confirmed track no detection takes is ``LOST``: it keeps its ID and its
predicted motion, and a later match brings it back; after the tracker's buffer of frames it is ``REMOVED``, as is a
``NEW`` track left unmatched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


class TrackState(IntEnum):
    NEW = 0
    TRACKED = 1
    LOST = 2
    REMOVED = 3


@dataclass(eq=False)
class Track:
    """A tracked object; ``row`` is the detection row (x1, y1, x2, y2, conf, cls, extra columns) of its last match."""

    mean: np.ndarray  # (8,) Kalman state
    covariance: np.ndarray  # (8, 8)
    row: np.ndarray
    start_frame: int
    frame: int  # the last frame a detection matched it
    state: TrackState = TrackState.NEW
    track_id: int = 0  # 0 until confirmed
    feature: np.ndarray | None = None  # the smoothed appearance feature (BoT-SORT with_reid)
    det_index: int = -1  # the detection it matched in the current frame, -1 when none

    @property
    def score(self) -> float:
        return float(self.row[4])

    @property
    def age(self) -> int:
        """Frames from its first detection to its last."""
        return self.frame - self.start_frame


@dataclass
class Tracked:
    """A frame's tracked objects: the detection rows they matched, untouched (extra columns such as mask
    coefficients or keypoints included), each one's track ID, and its index among the frame's detections."""

    rows: np.ndarray  # (m, 6 + extra)
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (m,)
    index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (m,) into the frame's detections

    def __len__(self) -> int:
        return len(self.ids)
