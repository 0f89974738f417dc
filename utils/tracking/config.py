"""Tracker YAMLs (``data/trackers/*.yaml`` or a file of the user's): found by name or path, read by the bounded
reader, every key known to the tracker it names and every value in its range, else one ``TrackerConfigError`` line.

The keys are the ones ultralytics users know (tracker_type, track_high_thresh, track_low_thresh, new_track_thresh,
track_buffer, match_thresh, fuse_score; BoT-SORT's gmc_method, proximity_thresh, appearance_thresh, with_reid,
model), so their files read here unchanged. Which keys a tracker reads is its own (``keys`` on its class); a key no
tracker reads, or one the named tracker does not read, is refused rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from utils.errors import UserError
from utils.paths import ROOT
from utils.safe_yaml import YamlError, load_yaml, shown

TRACKERS_DIR = ROOT / "data" / "trackers"
GMC_METHODS = ("sparseOptFlow", "ecc", "none")
MAX_TRACK_BUFFER = 100_000  # frames a lost track is kept (at 30 fps); more is a typo, not a setting


class TrackerConfigError(UserError, ValueError):
    """A tracker YAML that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class TrackerConfig:
    """One tracker's settings; the defaults are ultralytics' published ones."""

    tracker_type: str = "bytetrack"
    track_high_thresh: float = 0.25  # detections at or above: the first association
    track_low_thresh: float = 0.1  # above this and below the high one: the second association
    new_track_thresh: float = 0.25  # an unmatched detection at or above starts a track
    track_buffer: int = 30  # frames (at 30 fps) a lost track is kept before it is removed
    match_thresh: float = 0.8  # the first association's largest cost (1 - IoU, score-fused when fuse_score)
    fuse_score: bool = True  # weigh the IoU by the detection's confidence in the first association
    gmc_method: str = "sparseOptFlow"  # BoT-SORT: camera-motion compensation (sparseOptFlow, ecc, none)
    proximity_thresh: float = 0.5  # BoT-SORT: appearance is consulted only for pairs with at least this IoU
    appearance_thresh: float = 0.8  # BoT-SORT: and at least this appearance similarity (cosine)
    with_reid: bool = False  # BoT-SORT: match on appearance features too (colour histograms of each box)
    model: str = "auto"  # BoT-SORT: the appearance features' source; "auto" (each box's colour histogram) only
    source: str = ""  # the file it was read from (not a key)


PROBABILITIES = ("track_high_thresh", "track_low_thresh", "new_track_thresh", "match_thresh", "proximity_thresh",
                 "appearance_thresh")
FLAGS = ("fuse_score", "with_reid")
KEYS = tuple(f.name for f in fields(TrackerConfig) if f.name != "source")


def find_tracker_file(spec: str | Path, names: tuple[str, ...]) -> Path:
    """``--track``'s value as a file: a tracker's name (``bytetrack``, ``botsort.yaml``) is its file in
    data/trackers unless a file of that name exists where the user is; any other value must be a YAML file."""
    text = str(spec)
    bare = text.removesuffix(".yaml").removesuffix(".yml")
    path = Path(text).expanduser()
    if bare in names and not path.is_file():
        return TRACKERS_DIR / f"{bare}.yaml"
    if path.suffix not in (".yaml", ".yml"):
        raise TrackerConfigError(f"--track {text}: not a tracker; use {' or '.join(names)}, or a tracker YAML file")
    if not path.is_file():
        raise TrackerConfigError(f"--track {text}: file not found (give a path, or one of {', '.join(names)})")
    return path


def _number(value: Any, key: str, source: str, low: float, high: float, integer: bool = False) -> float | int:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and (not integer or isinstance(value, int))
    if not ok or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise TrackerConfigError(f"{source}: {key}: {shown(value)} must be {kind} in [{low:g}, {high:g}]")
    return int(value) if integer else float(value)


def _checked(key: str, value: Any, source: str) -> Any:
    """One key's value checked (and typed) or a TrackerConfigError naming the file and key."""
    if key in PROBABILITIES:
        return _number(value, key, source, 0.0, 1.0)
    if key == "track_buffer":
        return _number(value, key, source, 0, MAX_TRACK_BUFFER, integer=True)
    if key in FLAGS:
        if not isinstance(value, bool):
            raise TrackerConfigError(f"{source}: {key}: {shown(value)} must be true or false")
        return value
    if key == "gmc_method":
        value = "none" if value is None else value
        if value not in GMC_METHODS:
            raise TrackerConfigError(f"{source}: gmc_method: {shown(value)} is not one of {', '.join(GMC_METHODS)}")
        return value
    if key == "model" and value != "auto":
        raise TrackerConfigError(f"{source}: model: {shown(value)}: only 'auto' (appearance from each box's colour "
                                 "histogram) is supported; no ReID weights are loaded")
    return value


def parse_config(raw: Any, source: str, tracker_keys: Mapping[str, tuple[str, ...]]) -> TrackerConfig:
    """A TrackerConfig from a YAML mapping; ``tracker_keys`` maps each registered tracker_type to the keys its
    tracker reads. Missing keys take the defaults; unknown ones, keys of another tracker and bad values are refused."""
    if not isinstance(raw, dict):
        raise TrackerConfigError(f"{source}: a tracker YAML is a mapping of keys (tracker_type: bytetrack, ...)")
    kind = raw.get("tracker_type")
    if kind not in tracker_keys:
        raise TrackerConfigError(f"{source}: tracker_type: {shown(kind)} is not one of {', '.join(tracker_keys)}")
    unknown = [str(k) for k in raw if k not in KEYS]
    if unknown:
        raise TrackerConfigError(f"{source}: unknown key(s) {', '.join(shown(k) for k in unknown)}; a tracker YAML "
                                 f"holds {', '.join(KEYS)}")
    foreign = [k for k in raw if k not in tracker_keys[kind]]
    if foreign:
        raise TrackerConfigError(f"{source}: {', '.join(foreign)}: not read by {kind} (its keys: "
                                 f"{', '.join(tracker_keys[kind])})")
    values = {k: _checked(k, v, source) for k, v in raw.items()}
    config = TrackerConfig(**values, source=source)
    if config.track_low_thresh > config.track_high_thresh:
        raise TrackerConfigError(f"{source}: track_low_thresh {config.track_low_thresh:g} is above "
                                 f"track_high_thresh {config.track_high_thresh:g}")
    return config


def load_config(spec: str | Path, tracker_keys: Mapping[str, tuple[str, ...]]) -> TrackerConfig:
    """The TrackerConfig ``--track`` names: a registered tracker's name, or a tracker YAML file."""
    path = find_tracker_file(spec, tuple(tracker_keys))
    try:
        raw = load_yaml(path)
    except YamlError as e:
        raise TrackerConfigError(str(e)) from None
    return parse_config(raw, str(path), tracker_keys)
