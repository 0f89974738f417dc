"""The trackers ``--track`` chooses from, by name: a tracker is its module and one line here."""

from __future__ import annotations

from pathlib import Path

from utils.tracking.botsort import BoTSORT
from utils.tracking.bytetrack import ByteTracker
from utils.tracking.config import TrackerConfig, load_config

TRACKERS: dict[str, type[ByteTracker]] = {
    "bytetrack": ByteTracker,
    "botsort": BoTSORT,
}


def tracker_names() -> tuple[str, ...]:
    return tuple(TRACKERS)


def load_tracker_config(spec: str | Path) -> TrackerConfig:
    """``--track``'s value (a tracker's name or a tracker YAML) as a checked TrackerConfig."""
    return load_config(spec, {name: cls.keys for name, cls in TRACKERS.items()})


def build_tracker(config: TrackerConfig, frame_rate: float = 30.0) -> ByteTracker:
    """A fresh tracker of the config's type for one video or stream at ``frame_rate`` frames per second."""
    return TRACKERS[config.tracker_type](config, frame_rate)
