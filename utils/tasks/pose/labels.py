"""Keypoints in data (the pose task's ``labels`` part): a pose data set's keypoint shape, flip index and OKS sigmas
from its YAML, YOLO keypoint label rows, COCO JSON keypoints, and the label lines detect.py writes, all as checked
arrays.

A pose data YAML adds to a detection one ``kpt_shape: [K, D]`` (K keypoints per object, D = 2 for x, y or 3 for x,
y, visibility), optionally ``flip_idx`` (K indices: which keypoint a left-right flip turns each one into, e.g. left
eye <-> right eye; without it the horizontal flip cannot be used) and ``kpt_sigmas`` (K per-keypoint OKS sigmas;
default COCO's for 17 keypoints, 1/K each otherwise, as ultralytics does).

A YOLO pose label row is ``class cx cy w h`` then K x (x, y[, v]), normalised to [0, 1]; v is 0 (not labelled), 1
(labelled, occluded) or 2 (visible); an unlabelled keypoint is written 0 0 0. Keypoints are stored as (n, K, 3)
float32 whatever D is: x, y normalised and v (2 for every keypoint of a D = 2 set; 0 with x = y = 0 when unlabelled).
A COCO JSON annotation holds the same as ``keypoints`` [x1, y1, v1, ...] in pixels, with ``num_keypoints``: read
in pixels (``coco_keypoints``), then normalised against the image's size once it is known (``normalise_keypoints``),
as annotation splits check their boxes. ``check_pose_sample`` is the label scan's check of a YOLO image/label pair.

An object's keypoints travel from the scan as one (K + 1, 3) array: its K keypoints, then a row ``[area share, 0,
0]``, the share of its box that its area fills, which OKS weighs distances by: a COCO annotation's ``area`` over its
box's, or AREA_SHARE for a YOLO row (which has no area; ultralytics' convention). ``reader(task_options)`` is the
LabelReader of a data set's ``kpt_shape`` (its caches are kept per shape).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from utils.data.annotations import ImageEntry, LabelReader, checked_entry
from utils.data.coco_json import parse_coco_with
from utils.data.errors import DataError
from utils.data.label_cache import COORD_TOLERANCE, check_image, check_label_rows, read_label_rows, unique_objects
from utils.tasks.pose.head import MAX_KEYPOINTS

# COCO's person keypoints (pycocotools' kpt_oks_sigmas, the category's names and 1-based skeleton, made 0-based).
COCO_KEYPOINT_NAMES = ("nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
                       "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
                       "right_knee", "left_ankle", "right_ankle")
COCO_SIGMAS = tuple(s / 10 for s in (.26, .25, .25, .35, .35, .79, .79, .72, .72, .62, .62, 1.07, 1.07, .87, .87,
                                     .89, .89))
COCO_FLIP_INDEX = (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15)
COCO_SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8), (7, 9),
                 (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))
VISIBLE = 2.0  # the visibility a keypoint of a set without visibilities gets
MAX_VISIBILITY = 2.0
AREA_SHARE = 0.53  # an object's area over its box's when its labels give none (COCO's people fill about that)


@dataclass(frozen=True)
class KeypointSpec:
    """A pose data set's keypoints: ``shape`` (K, D), ``flip_index`` (K indices, or None: no horizontal flip) and
    ``sigmas`` (K OKS sigmas)."""

    shape: tuple[int, int]
    flip_index: tuple[int, ...] | None
    sigmas: tuple[float, ...]

    @property
    def count(self) -> int:
        return self.shape[0]

    @property
    def dims(self) -> int:
        return self.shape[1]


def keypoint_sigmas(count: int, given: Sequence[float] | None = None) -> np.ndarray:
    """The OKS sigmas of ``count`` keypoints (float64): ``given`` when there are some, COCO's for 17, else 1/K."""
    if given is not None:
        return np.asarray(given, dtype=np.float64)
    return np.asarray(COCO_SIGMAS if count == len(COCO_SIGMAS) else [1.0 / count] * count, dtype=np.float64)


def _shown(value: object) -> str:
    return str(value)[:60]


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def keypoint_spec(data: Mapping, source: str = "data YAML") -> KeypointSpec | None:
    """The keypoints a data YAML (already read) declares, checked; None when it has no ``kpt_shape`` (not a pose
    set). DataError (one line, naming ``source``) for a malformed shape, flip index or sigma list."""
    shape = data.get("kpt_shape")
    if shape is None:
        return None
    if not (isinstance(shape, list) and len(shape) == 2 and all(_integer(v) for v in shape)
            and 1 <= shape[0] <= MAX_KEYPOINTS and shape[1] in (2, 3)):
        raise DataError(f"{source}: kpt_shape must be [keypoints, 2 or 3] with 1..{MAX_KEYPOINTS} keypoints, got "
                        f"{_shown(shape)}")
    count = shape[0]
    flip = data.get("flip_idx")
    if flip is not None:
        if not (isinstance(flip, list) and len(flip) == count and all(_integer(i) and 0 <= i < count for i in flip)):
            raise DataError(f"{source}: flip_idx must list {count} keypoint indices in 0..{count - 1}, got "
                            f"{_shown(flip)}")
        if sorted(flip) != list(range(count)) or any(flip[flip[i]] != i for i in range(count)):
            raise DataError(f"{source}: flip_idx must pair keypoints (a permutation that undoes itself: "
                            f"flip_idx[flip_idx[i]] == i), got {_shown(flip)}")
        flip = tuple(flip)
    sigmas = data.get("kpt_sigmas")
    if sigmas is not None:
        if not (isinstance(sigmas, list) and len(sigmas) == count
                and all(isinstance(s, (int, float)) and not isinstance(s, bool) and np.isfinite(s) and s > 0
                        for s in sigmas)):
            raise DataError(f"{source}: kpt_sigmas must list {count} positive numbers, got {_shown(sigmas)}")
    return KeypointSpec((count, shape[1]), flip, tuple(float(s) for s in keypoint_sigmas(count, sigmas)))


def check_keypoints(points: np.ndarray, dims: int, where: str = "") -> np.ndarray:
    """(n, K, D) float64 normalised -> (n, K, 3) float32: coordinates within [0, 1] (clipped inside the tolerance),
    visibilities in [0, 2] (2 for a D = 2 set); an unlabelled keypoint (v 0) is 0 0 0. ValueError with the reason."""
    if not np.isfinite(points).all():
        raise ValueError(f"{where}non-finite keypoint values")
    coords = points[..., :2]
    if (coords < -COORD_TOLERANCE).any() or (coords > 1 + COORD_TOLERANCE).any():
        bad = coords[(coords < -COORD_TOLERANCE) | (coords > 1 + COORD_TOLERANCE)][0]
        raise ValueError(f"{where}keypoint coordinate {bad:g} outside the image")
    out = np.empty((*points.shape[:2], 3), np.float32)
    out[..., :2] = coords.clip(0, 1)
    if dims == 3:
        visibility = points[..., 2]
        if (visibility < 0).any() or (visibility > MAX_VISIBILITY).any():
            raise ValueError(f"{where}keypoint visibility {visibility[(visibility < 0) | (visibility > 2)][0]:g} "
                             f"(0 unlabelled, 1 occluded, 2 visible)")
        out[..., 2] = visibility
    else:
        out[..., 2] = VISIBLE
    out[out[..., 2] == 0] = 0.0
    return out


@dataclass
class PoseLabels:
    """A pose label file's objects: ``labels`` (n, 5) float32 ``class cx cy w h`` and ``keypoints`` (n, K, 3)."""

    labels: np.ndarray
    keypoints: np.ndarray
    duplicates: int = 0
    note: str = ""


def parse_pose_rows(rows: Sequence[Sequence[str]], shape: Sequence[int], nc: int | None) -> PoseLabels:
    """Rows of a YOLO pose label file -> checked boxes and keypoints; ValueError (the reason, with the row) for a row
    of the wrong width, a value that is not a finite number, a box or class that fails the checks every label meets
    (utils.data.label_cache), a keypoint outside the image or a visibility outside 0..2. Exact repeats are kept once."""
    count, dims = int(shape[0]), int(shape[1])
    width = 5 + count * dims
    if not rows:
        return PoseLabels(np.zeros((0, 5), np.float32), np.zeros((0, count, 3), np.float32))
    for number, row in enumerate(rows, 1):
        if len(row) != width:
            raise ValueError(f"row {number}: a pose row needs 5 + {count} x {dims} = {width} columns, got {len(row)}")
    try:
        values = np.array(rows, dtype=np.float64)
    except ValueError:
        raise ValueError("non-numeric label values") from None
    check_label_rows(values[:, :5], nc)  # class and box checks, the same messages as box files
    labels = values[:, :5].astype(np.float32)
    labels[:, 1:] = labels[:, 1:].clip(0, 1)
    keypoints = check_keypoints(values[:, 5:].reshape(len(values), count, dims), dims)
    kept, points, duplicates, note = unique_objects(labels, list(keypoints))
    return PoseLabels(kept, np.stack(points).astype(np.float32), duplicates, note)


def read_pose_label_file(path: str | Path, shape: Sequence[int], nc: int | None) -> tuple[PoseLabels, str]:
    """Parse and check one YOLO pose label file -> (labels, state 'found', 'missing' or 'empty'); invalid content
    raises ValueError with the reason (the sample is then corrupt)."""
    rows, state = read_label_rows(path)
    if state != "found":
        return parse_pose_rows([], shape, nc), state
    return parse_pose_rows(rows, shape, nc), "found"


def check_pose_sample(args: tuple[str, str, int | None, Path | None], shape: Sequence[int]) -> tuple:
    """``label_cache.check_sample`` for YOLO pose labels of ``shape`` (K, D): its six values and, seventh, each
    object's (K + 1, 3) keypoints and area share (normalised); a corrupt pair never raises (``functools.partial``
    it with the shape)."""
    im_file, label_file, nc, repair_dir = args
    try:
        image_shape, image_note, repaired = check_image(im_file, repair_dir)
        parsed, state = read_pose_label_file(label_file, shape, nc)
    except (ValueError, OverflowError, TypeError) as e:
        return (np.zeros((0, 5), np.float32), (0, 0), "corrupt", 0, f"{im_file}: ignoring corrupt image/label: {e}",
                "", [])
    notes = "; ".join(n for n in (image_note, parsed.note) if n)
    return (parsed.labels, image_shape, state, parsed.duplicates, f"{im_file}: {notes}" if notes else "", repaired,
            [with_area(points) for points in parsed.keypoints])


def with_area(keypoints: np.ndarray, share: float = AREA_SHARE) -> np.ndarray:
    """An object's keypoints (K, 3) and the share of its box its area fills -> the (K + 1, 3) array objects travel
    as (see the module docstring)."""
    return np.concatenate((np.asarray(keypoints, np.float32), np.array([[share, 0, 0]], np.float32)))


def coco_keypoints(annotation: Mapping, count: int) -> np.ndarray:
    """A COCO annotation's ``keypoints`` [x1, y1, v1, ...] -> (K, 3) float64 in the image's pixels (0 0 0 where v is
    0); an annotation without keypoints gives K unlabelled ones. ValueError with the reason for a list of the wrong
    length, a value that is not a finite number, or a visibility outside 0..2. ``normalise_keypoints`` then places
    them in the image (it reads the image's size)."""
    values = annotation.get("keypoints")
    if values is None:
        return np.zeros((count, 3))
    if not isinstance(values, list) or len(values) != 3 * count:
        raise ValueError(f"'keypoints' must list {count} x (x, y, v) = {3 * count} numbers, got "
                         f"{len(values) if isinstance(values, list) else type(values).__name__}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ValueError("'keypoints' holds a value that is not a number")
    points = np.asarray(values, dtype=np.float64).reshape(count, 3)
    if not np.isfinite(points).all():
        raise ValueError("'keypoints' holds a value that is not finite")
    visibility = points[:, 2]
    if (visibility < 0).any() or (visibility > MAX_VISIBILITY).any():
        raise ValueError(f"'keypoints' visibility {visibility[(visibility < 0) | (visibility > 2)][0]:g} (0 "
                         "unlabelled, 1 occluded, 2 visible)")
    points[visibility == 0] = 0.0
    return points


def normalise_keypoints(points: np.ndarray, size: tuple[float, float]) -> np.ndarray:
    """Keypoints (K, 3) in the pixels of an image of ``size`` (w, h) -> (K, 3) float32 normalised and checked
    (``check_keypoints``; a labelled keypoint may lie up to one pixel outside, as on the last pixel's far edge).
    ValueError with the reason for one farther out."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3).copy()
    w, h = float(size[0]), float(size[1])
    labelled = points[:, 2] > 0
    normalised = points[:, :2] / np.array([w, h])
    slack = np.array([1.0 / w, 1.0 / h])
    if ((normalised < -slack) | (normalised > 1 + slack))[labelled].any():
        raise ValueError("a keypoint lies outside the image")
    points[:, :2] = np.where(labelled[:, None], normalised.clip(0, 1), 0.0)
    return check_keypoints(points[None], 3)[0]


def attach_keypoints(entry: ImageEntry, annotations: Sequence[dict], count: int) -> None:
    """``entry.extras`` from its boxes' annotations: per box (K + 1, 3), its ``keypoints`` in the image's pixels and
    the share of its box its ``area`` fills (AREA_SHARE without a usable one); a malformed annotation sets
    ``entry.problem`` (the image is then corrupt)."""
    objects = []
    for annotation in annotations:
        try:
            points = coco_keypoints(annotation, count)
        except ValueError as e:
            entry.problem = f"annotation {str(annotation.get('id'))[:20]}: {e}"
            return
        objects.append(with_area(points, area_share(annotation)))
    entry.extras = objects


def area_share(annotation: Mapping) -> float:
    """A COCO annotation's ``area`` over its ``bbox``'s area, within (0, 1]; AREA_SHARE when either is missing or
    unusable (the box was checked already)."""
    area, box = annotation.get("area"), annotation.get("bbox")
    try:
        share = float(area) / (float(box[2]) * float(box[3]))
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return AREA_SHARE
    return min(share, 1.0) if np.isfinite(share) and share > 0 else AREA_SHARE


def normalised_object(points: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An object's (K + 1, 3) array with its keypoints in the pixels of an image of ``size`` (w, h) -> the same
    with them normalised and checked (``normalise_keypoints``)."""
    points = np.asarray(points, np.float64)
    return np.concatenate((normalise_keypoints(points[:-1], size), points[-1:].astype(np.float32)))


def check_pose_entry(args: tuple[str, ImageEntry, int | None, Path | None]) -> tuple:
    """``annotations.check_entry`` keeping keypoints: its six values and, seventh, each object's (K + 1, 3) array
    normalised to the image; objects repeated exactly, keypoints included, are kept once."""
    return checked_entry(args, normalise=normalised_object)


@functools.lru_cache(maxsize=16)
def _reader(count: int, dims: int) -> LabelReader:
    return LabelReader(kind=f"keypoints{count}x{dims}", check=functools.partial(check_pose_sample,
                                                                                 shape=(count, dims)),
                       check_entry=check_pose_entry,
                       parsers={"coco": parse_coco_with(functools.partial(attach_keypoints, count=count))}, width=3,
                       what="keypoints", who="a pose model", sources="YOLO pose labels or COCO JSON keypoints")


def reader(task_options: Mapping) -> LabelReader:
    """The LabelReader of a pose data set whose YAML says ``task_options`` (its ``kpt_shape``); DataError in one line
    for a data set that names no keypoint shape, or a malformed one."""
    spec = keypoint_spec(task_options)
    if spec is None:
        raise DataError("a pose data set needs 'kpt_shape: [keypoints, 2 or 3]' in its data YAML")
    return _reader(*spec.shape)


def coco_skeleton(category: Mapping, count: int) -> tuple[tuple[int, int], ...]:
    """A COCO category's ``skeleton`` (1-based keypoint pairs) as 0-based pairs; () when it has none. ValueError for
    a pair that does not name two of its ``count`` keypoints."""
    pairs = category.get("skeleton") or []
    if not isinstance(pairs, list) or len(pairs) > count * count:
        raise ValueError("'skeleton' must be a list of keypoint pairs")
    out = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and all(_integer(i) and 1 <= i <= count for i in pair)):
            raise ValueError(f"'skeleton' pair {_shown(pair)} does not name two of the {count} keypoints (1-based)")
        out.append((pair[0] - 1, pair[1] - 1))
    return tuple(out)


def pose_label_line(cls: int, box_xywhn: Sequence[float], keypoints: np.ndarray, dims: int = 3,
                    conf: float | None = None) -> str:
    """One YOLO pose label line: ``class cx cy w h`` and each keypoint's x y (and v, or a predicted keypoint's
    visibility score, when ``dims`` is 3), normalised, then the confidence when given (detect.py --save-conf)."""
    values = [*box_xywhn, *np.asarray(keypoints, dtype=np.float64)[:, :dims].ravel()]
    line = " ".join([str(int(cls)), *(f"{v:.6g}" for v in values)])
    return f"{line} {conf:.6g}" if conf is not None else line
