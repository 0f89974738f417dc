"""Instance outlines in label files: YOLO segment rows and COCO JSON polygons and RLE masks, checked like boxes.

A YOLO segment label file has one object a row, ``class x1 y1 x2 y2 ...``: a polygon of at least 3 points,
normalised to [0, 1] (the reference's format; its box is the polygon's extent). A row of 5 columns is a box
(``class cx cy w h``) without an outline, so detection labels read as before. A row that is neither (an odd number
of coordinates, fewer than 3 points, more than MAX_POLYGON_POINTS, a value that is not a finite number, a point
outside the image beyond the clipping tolerance) makes the file corrupt with the reason, as a bad box row does:
the image is skipped and counted 'corrupt' in the scan's summary.

A COCO annotation's ``segmentation`` is a list of polygons (parts of one object, in pixels) or an RLE mask
(``{"size": [h, w], "counts": ...}``, crowd annotations use it). Parts are joined into one outline through
zero-width bridges (the reference's converter does the same), so every object has one polygon, in time linear in
its points. Parts of fewer than 3 points are dropped and counted; more than MAX_POLYGON_POINTS points in all parts
(counted before any part is read) and malformed values make the image corrupt, as a bad ``bbox`` does. An RLE
mask is kept as it is (checked against the image's size without being decoded) and becomes an outline only when
asked (``instance_polygon``).

Outlines are stored without pickles as one (P, 2) float32 point array and (k + 1,) offsets (the label cache's
``pack_points``). READER is the segment task's LabelReader (utils/tasks/registry.py names it): YOLO segment rows
(``check_segment_sample``), COCO JSON splits with their ``segmentation`` (``attach_outlines``), VOC refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from utils.data.annotations import ImageEntry, LabelReader, checked_entry
from utils.data.coco_json import parse_coco_with
from utils.data.label_cache import COORD_TOLERANCE, check_image, check_label_rows, read_label_rows, unique_objects
from utils.tasks.segment.masks import mask_outlines, rle_counts, rle_decode

MIN_POLYGON_POINTS = 3
MAX_POLYGON_POINTS = 10_000  # per object: COCO's largest outlines have a few hundred; the reference resamples to 1000
BRIDGE_SAMPLE = 1_000  # points of each part searched for the closest pair when parts are joined


@dataclass
class SegmentLabels:
    """A label file's objects: boxes (k, 5) float32 ``class cx cy w h`` normalised (from the outline where a row
    has one) and per object its outline (n, 2) float32 normalised, or None for a box row."""

    labels: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.float32))
    segments: list[np.ndarray | None] = field(default_factory=list)
    duplicates: int = 0
    note: str = ""


def check_polygon(values: np.ndarray, size: tuple[float, float] = (1.0, 1.0)) -> np.ndarray:
    """Flat coordinates ``x1 y1 x2 y2 ...`` of an image of ``size`` (w, h) -> (n, 2) float64 points normalised and
    clipped to [0, 1]. ValueError with the reason for an odd count, fewer than 3 or more than MAX_POLYGON_POINTS
    points, a non-finite value, or a point outside the image by more than the tolerance."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if len(values) % 2:
        raise ValueError(f"a polygon needs x, y pairs, got {len(values)} coordinates")
    if len(values) < 2 * MIN_POLYGON_POINTS:
        raise ValueError(f"a polygon needs at least {MIN_POLYGON_POINTS} points, got {len(values) // 2}")
    if len(values) > 2 * MAX_POLYGON_POINTS:
        raise ValueError(f"a polygon of {len(values) // 2} points (at most {MAX_POLYGON_POINTS})")
    if not np.isfinite(values).all():
        raise ValueError("non-finite polygon coordinates")
    size = np.asarray(size, dtype=np.float64)
    points = values.reshape(-1, 2) / size
    tolerance = COORD_TOLERANCE if (size == 1).all() else np.maximum(COORD_TOLERANCE, 1 / size)  # pixels: also 1 px
    if (points < -tolerance).any() or (points > 1 + tolerance).any():
        bad = points[(points < -tolerance) | (points > 1 + tolerance)][0]
        raise ValueError(f"polygon point outside the image ({bad:g} of its size)")
    return points.clip(0, 1)


def polygon_rows(classes: np.ndarray, segments: Sequence[np.ndarray]) -> np.ndarray:
    """(k, 5) float64 ``class cx cy w h`` of normalised outlines: each box the outline's extent."""
    rows = np.zeros((len(segments), 5))
    for row, cls, points in zip(rows, classes, segments):
        low, high = points.min(0), points.max(0)
        row[:] = cls, *(low + high) / 2, *(high - low)
    return rows


def parse_segment_rows(rows: Sequence[Sequence[str]], nc: int | None) -> SegmentLabels:
    """Split rows of a YOLO label file -> checked boxes and outlines; ValueError (the reason, with the row) for a
    row that is not a box or a polygon, or whose box fails the checks of every label (utils.data.label_cache)."""
    boxes, segments = [], []
    for number, row in enumerate(rows, 1):
        try:
            values = np.array(row, dtype=np.float64)
        except ValueError:
            raise ValueError(f"row {number}: non-numeric label values") from None
        try:
            if len(values) == 5:
                boxes.append(values)
                segments.append(None)
                continue
            if len(values) < 2:
                raise ValueError("a class and a box or a polygon are needed")
            points = check_polygon(values[1:])
        except ValueError as e:
            raise ValueError(f"row {number}: {e}") from None
        boxes.append(polygon_rows(values[:1], [points])[0])
        segments.append(points.astype(np.float32))
    if not boxes:
        return SegmentLabels()
    labels = np.array(boxes, np.float64)
    check_label_rows(labels, nc)  # class and box checks, the same messages as box files
    labels = labels.astype(np.float32)
    labels[:, 1:] = labels[:, 1:].clip(0, 1)
    return _without_duplicates(labels, segments)


def _without_duplicates(labels: np.ndarray, segments: list[np.ndarray | None]) -> SegmentLabels:
    """Rows repeated exactly (same class, box and outline) kept once, in their first place."""
    return SegmentLabels(*unique_objects(labels, segments))


def read_segment_label_file(path: str | Path, nc: int | None) -> tuple[SegmentLabels, str]:
    """Parse and check one YOLO label file with outlines -> (labels, state 'found', 'missing' or 'empty');
    invalid content raises ValueError with the reason (the sample is then corrupt)."""
    rows, state = read_label_rows(path)
    if state != "found":
        return SegmentLabels(), state
    return parse_segment_rows(rows, nc), "found"


def check_segment_sample(args: tuple[str, str, int | None, Path | None]) -> tuple:
    """``label_cache.check_sample`` for YOLO segment labels: its six values and, seventh, each object's outline
    (n, 2) normalised, or None for a box row; a corrupt pair never raises."""
    im_file, label_file, nc, repair_dir = args
    try:
        shape, image_note, repaired = check_image(im_file, repair_dir)
        parsed, state = read_segment_label_file(label_file, nc)
    except (ValueError, OverflowError, TypeError) as e:
        return (np.zeros((0, 5), np.float32), (0, 0), "corrupt", 0, f"{im_file}: ignoring corrupt image/label: {e}",
                "", [])
    notes = "; ".join(n for n in (image_note, parsed.note) if n)
    return (parsed.labels, shape, state, parsed.duplicates, f"{im_file}: {notes}" if notes else "", repaired,
            parsed.segments)


def segment_rows_text(labels: np.ndarray, segments: Sequence[np.ndarray | None], decimals: int = 6) -> str:
    """A YOLO label file's text: ``class x1 y1 ...`` for objects with an outline, ``class cx cy w h`` otherwise."""
    lines = []
    for row, points in zip(labels, segments):
        values = row[1:] if points is None else np.asarray(points).ravel()
        lines.append(" ".join([str(int(row[0])), *(f"{v:.{decimals}f}" for v in values)]))
    return "".join(line + "\n" for line in lines)


# ------------------------------------------------------------------------------------------ COCO segmentation
@dataclass
class InstanceSegment:
    """One COCO annotation's outline: a polygon (n, 2) in the image's pixels (parts joined), or an RLE mask kept
    as the file has it; ``dropped`` counts parts of fewer than 3 points that were left out."""

    polygon: np.ndarray | None = None
    rle: dict | None = None
    dropped: int = 0

    @property
    def empty(self) -> bool:
        return self.polygon is None and self.rle is None


def coco_segmentation(segmentation: Any, width: int, height: int) -> InstanceSegment:
    """A COCO ``segmentation`` value of an image of ``width`` x ``height`` pixels -> its outline; ValueError with the
    reason for a malformed one (missing or ``[]`` gives an empty outline)."""
    if segmentation is None or segmentation == []:
        return InstanceSegment()
    if isinstance(segmentation, dict):
        rle_counts(segmentation, (height, width))  # checked against the image, nothing decoded
        return InstanceSegment(rle=segmentation)
    if not isinstance(segmentation, list) or not all(isinstance(p, list) for p in segmentation):
        raise ValueError("segmentation must be a list of polygons or an RLE mask")
    points = sum(len(p) for p in segmentation) // 2  # bounded before any part is read, as a YOLO row is
    if points > MAX_POLYGON_POINTS:
        raise ValueError(f"{points} polygon points in {len(segmentation)} parts, more than {MAX_POLYGON_POINTS}")
    parts, dropped = [], 0
    for part in segmentation:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in part):
            raise ValueError("polygon values must be numbers")
        if len(part) < 2 * MIN_POLYGON_POINTS and len(part) % 2 == 0:
            dropped += 1  # COCO has a few outlines of 1 or 2 points: nothing to fill
            continue
        parts.append(check_polygon(np.array(part, np.float64), (width, height)) * (width, height))
    return InstanceSegment(join_parts(parts) if parts else None, None, dropped)


def join_parts(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Several polygons (n_i, 2) of one object -> one polygon: each part is walked round from where the previous
    part's closest point bridges to it, and each bridge is walked there and back (zero width, so the filled area
    is the parts' own). One part is returned as it is."""
    if len(parts) == 1:
        return np.asarray(parts[0], np.float64)
    links = [_closest_pair(parts[i], parts[i + 1]) for i in range(len(parts) - 1)]  # (exit of i, entry of i + 1)
    entries = [links[0][0], *(entry for _, entry in links)]  # part 0 starts where it leaves
    heads, tails = [], []  # each part up to its exit, in order; then the rest of each, innermost first
    for i in range(len(parts) - 1):
        loop = _loop(parts[i], entries[i])
        k = (links[i][0] - entries[i]) % len(parts[i])  # steps from this part's entry to its exit
        heads.append(loop[:k + 1])
        tails.append(loop[k:])
    return np.concatenate([*heads, _loop(parts[-1], entries[-1]), *reversed(tails)])  # one copy: linear in points


def _loop(points: np.ndarray, start: int) -> np.ndarray:
    """A part walked round from ``start`` back to it (first point repeated at the end)."""
    rolled = np.roll(np.asarray(points, np.float64), -start, 0)
    return np.concatenate((rolled, rolled[:1]))


def _closest_pair(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """Indices of the closest points of two parts (searched among at most BRIDGE_SAMPLE points of each)."""
    ia = np.linspace(0, len(a) - 1, min(len(a), BRIDGE_SAMPLE)).round().astype(int)
    ib = np.linspace(0, len(b) - 1, min(len(b), BRIDGE_SAMPLE)).round().astype(int)
    d = ((a[ia, None, :] - b[None, ib, :]) ** 2).sum(-1)
    i, j = np.unravel_index(int(d.argmin()), d.shape)
    return int(ia[i]), int(ib[j])


def instance_polygon(instance: InstanceSegment, width: int, height: int) -> np.ndarray | None:
    """An instance's outline as one polygon in pixels: its polygon, or its RLE mask's parts (holes ignored) joined;
    None when it has none."""
    if instance.polygon is not None:
        return instance.polygon
    if instance.rle is None:
        return None
    outlines = [o for o in mask_outlines(rle_decode(instance.rle, (height, width))) if len(o) >= MIN_POLYGON_POINTS]
    return join_parts(outlines).astype(np.float64) if outlines else None


def annotation_kept(annotation: dict, keep_crowd: bool) -> bool:
    """Whether an annotation is a training target (crowd ones only with keep_crowd), as coco_json's reader rules."""
    return not (annotation.get("iscrowd", 0) and not keep_crowd)


def coco_instance_segments(data: dict, keep_crowd: bool = False) -> tuple[dict[Any, list[InstanceSegment]], str]:
    """Per image id, the outlines of its target annotations in file order, and a note on what was dropped. A
    malformed segmentation (or an image entry without a size) gives a ValueError in its place: the image is
    corrupt.

    The order and the crowd rule are coco_json's, so for every usable image the i-th outline is the i-th box
    ``coco_entries`` reads (an annotation with a bad bbox or category makes its image corrupt there)."""
    sizes = {}
    for image in data.get("images", []):
        if isinstance(image, dict) and isinstance(image.get("id"), int | str):
            sizes[image["id"]] = (image.get("width"), image.get("height"))
    out: dict[Any, list[Any]] = {}
    dropped = empty = 0
    for annotation in data.get("annotations", []):
        if not isinstance(annotation, dict) or annotation.get("image_id") not in sizes:
            continue
        if not annotation_kept(annotation, keep_crowd):
            continue
        key, (w, h) = annotation["image_id"], sizes[annotation["image_id"]]
        try:
            if not (isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0):
                raise ValueError("image entry without integer 'width' and 'height'")
            instance = coco_segmentation(annotation.get("segmentation"), w, h)
        except ValueError as e:
            out.setdefault(key, []).append(ValueError(f"annotation {annotation.get('id')!r}: {e}"))
            continue
        dropped += instance.dropped
        empty += instance.empty
        out.setdefault(key, []).append(instance)
    notes = [f"{dropped} polygon parts of fewer than {MIN_POLYGON_POINTS} points dropped" if dropped else "",
             f"{empty} annotations without an outline (boxes only)" if empty else ""]
    return out, "; ".join(n for n in notes if n)


def attach_outlines(entry: ImageEntry, annotations: Sequence[dict]) -> None:
    """``entry.extras`` from its boxes' annotations' ``segmentation`` values, one outline (n, 2) in the image's
    pixels per box (None: none given); a malformed one sets ``entry.problem`` (the image is then corrupt)."""
    width, height = entry.size or (0, 0)
    outlines = []
    for annotation in annotations:
        segmentation = annotation.get("segmentation")
        try:
            if not (width and height) and segmentation not in (None, []):
                raise ValueError("an outline needs the image entry's 'width' and 'height'")
            instance = coco_segmentation(segmentation, width, height)
            outlines.append(instance_polygon(instance, width, height))
        except ValueError as e:
            entry.problem = f"bad segmentation: {e}"
            return
    entry.extras = outlines


def normalised_outline(outline: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """An outline in an image's pixels -> normalised to its ``shape`` (w, h), clipped to [0, 1]."""
    return (np.asarray(outline, np.float64) / shape).clip(0, 1).astype(np.float32)


def check_segment_entry(args: tuple[str, ImageEntry, int | None, Path | None]) -> tuple:
    """``annotations.check_entry`` keeping outlines: its six values and, seventh, each object's outline normalised
    to the image (None: a box without one); objects repeated exactly, outline included, are kept once."""
    return checked_entry(args, normalise=normalised_outline)


READER = LabelReader(kind="segments", check=check_segment_sample, check_entry=check_segment_entry,
                     parsers={"coco": parse_coco_with(attach_outlines)}, width=2, what="outlines",
                     who="a segmenter", sources="YOLO segment labels or COCO JSON")
