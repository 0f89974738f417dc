"""Tracking in a detect run: one tracker per video, webcam or stream (a new video starts afresh), and each one's
MOT-challenge file.

A MOT-challenge file (``tracks/<video>.txt``) has one line per tracked object and frame:
``frame,id,x,y,w,h,conf,-1,-1,-1``, the frame 1-based (a video's own frame number, so ``--vid-stride`` leaves
gaps), x, y the box's top-left corner and w, h its size in the frame's pixels. Lines are written as frames come, so
a stream stopped with Ctrl-C keeps what it tracked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from utils.paths import derived_path, increment_path
from utils.tracking.bytetrack import ByteTracker
from utils.tracking.config import TrackerConfig
from utils.tracking.registry import build_tracker
from utils.tracking.track import Tracked


def mot_lines(frame_number: int, tracked: Tracked) -> list[str]:
    """MOT-challenge lines ``frame,id,x,y,w,h,conf,-1,-1,-1`` of one frame's tracked objects."""
    lines = []
    for (x1, y1, x2, y2, conf), track_id in zip(tracked.rows[:, :5], tracked.ids):
        lines.append(f"{frame_number},{int(track_id)},{x1:.2f},{y1:.2f},{x2 - x1:.2f},{y2 - y1:.2f},{conf:.4f},"
                     "-1,-1,-1")
    return lines


@dataclass
class _Stream:
    tracker: ByteTracker
    file: TextIO | None
    path: Path | None
    frames: int = 0


class TrackingSession:
    """The trackers of one run. ``concurrent`` sources (several live streams) keep a tracker per stream; otherwise
    frames come one video after another, and a stream not seen before ends the previous one."""

    def __init__(self, config: TrackerConfig, mot_dir: Path | None, concurrent: bool = False) -> None:
        self.config, self.mot_dir, self.concurrent = config, mot_dir, concurrent
        self.streams: dict[str, _Stream] = {}
        self.mot_files: list[Path] = []

    def update(self, stream: str, rows: np.ndarray, frame: np.ndarray | None, name: str,
               frame_number: int | None = None, fps: float = 0.0) -> Tracked:
        """Track one frame of ``stream`` (any key naming it for this run): its detection rows (k, 6 + extra) in
        the frame's pixels; ``name`` names its MOT file, ``frame_number`` its line's frame (default: the stream's
        count of frames), ``fps`` its frame rate (the tracker's buffer is in frames at 30 fps)."""
        state = self.streams.get(stream)
        if state is None:
            state = self._open(stream, name, fps)
        state.frames += 1
        tracked = state.tracker.update(rows, frame)
        if state.file is not None and len(tracked):
            state.file.write("".join(f"{line}\n" for line in mot_lines(frame_number or state.frames, tracked)))
            state.file.flush()
        return tracked

    def _open(self, stream: str, name: str, fps: float) -> _Stream:
        if not self.concurrent:
            self.close()
        file = path = None
        if self.mot_dir is not None:
            self.mot_dir.mkdir(parents=True, exist_ok=True)
            path = increment_path(derived_path(self.mot_dir, name or "stream", suffix=".txt"))
            file = path.open("x")  # a new file: never one already there
            self.mot_files.append(path)
        self.streams[stream] = state = _Stream(build_tracker(self.config, fps), file, path)
        return state

    def close(self) -> None:
        for state in self.streams.values():
            if state.file is not None:
                state.file.close()
        self.streams.clear()
