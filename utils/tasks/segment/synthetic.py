"""The built-in synthetic set with instance outlines: the same drawings as utils.data.synthetic, labelled with YOLO
segment rows (``class x1 y1 x2 y2 ...`` normalised), so segmentation trains offline.

Each outline is the drawn shape's: cv2 draws anti-aliased edges half a pixel outside the geometric outline, so a
triangle's or square's outline is its whole-pixel vertices (in pixel-centre coordinates) moved out by half a
pixel, and a circle's is a 72-gon of the drawn radius plus half a pixel (of the same area as that circle). Filled
(utils.tasks.segment.masks), an outline gives the pixels cv2 painted at least half. Outlines are whole shapes:
where a later
shape covers part of an earlier one, the earlier outline still includes it, as its box does.

The set is written into ``data_home()/synthetic-seg-v<version>-<params hash>`` on first use (zero-first under
DDP) by utils.data.generated (a folder it creates and marks; on regeneration only the files its manifest lists and
that are unchanged are removed; a folder holding anything else is refused); data/synthetic-seg.yaml names its
parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np

from utils.data.generated import GeneratedSet
from utils.data.synthetic import (
    OWN_FILE,
    SPLITS,
    SYNTHETIC_NAMES,
    Shape,
    SyntheticSpec,
    draw_shapes,
    make_spec,
    split_counts,
)
from utils.paths import data_home
from utils.tasks.segment.labels import polygon_rows, segment_rows_text

SEG_VERSION = 1
CIRCLE_POINTS = 72
EDGE_OFFSET = 0.5  # pixels between the geometric outline and where cv2's anti-aliased fill is half painted
SEGMENT_SET = GeneratedSet("synthetic-segment", OWN_FILE)  # the detection set's file names


def _convex_offset(points: np.ndarray, distance: float) -> np.ndarray:
    """A convex polygon with every edge moved outwards by ``distance`` (vertices along their bisectors)."""
    p = np.asarray(points, np.float64)
    edges = np.roll(p, -1, 0) - p
    orientation = np.sign(np.sum(p[:, 0] * np.roll(p[:, 1], -1) - np.roll(p[:, 0], -1) * p[:, 1]))
    normals = np.stack([edges[:, 1], -edges[:, 0]], 1) * orientation
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    before, after = np.roll(normals, 1, 0), normals  # the edges meeting at each vertex
    return p + distance * (before + after) / (1 + (before * after).sum(1, keepdims=True))


def shape_outline(shape: Shape) -> np.ndarray:
    """The drawn outline of a shape, (n, 2) float64 in the image's pixels (see the module docstring)."""
    if shape.points is not None:
        vertices = np.round(shape.points).astype(np.float64) + 0.5  # drawn at whole pixels; centres at +0.5
        return _convex_offset(vertices, EDGE_OFFSET)
    step = 2 * math.pi / CIRCLE_POINTS
    radius = (round(shape.radius) + EDGE_OFFSET) * math.sqrt(step / math.sin(step))  # the circle's area
    angles = np.arange(CIRCLE_POINTS) * step
    cx, cy = round(shape.cx) + 0.5, round(shape.cy) + 0.5
    return np.stack([cx + radius * np.cos(angles), cy + radius * np.sin(angles)], 1)


def draw_seg_sample(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """One image (draw_shapes'), its boxes (k, 5) [class, cx, cy, w, h] normalised (each its outline's extent) and
    outlines (n, 2) normalised to [0, 1]."""
    img, shapes = draw_shapes(rng, spec)
    height, width = img.shape[:2]
    outlines = [(shape_outline(s) / (width, height)).clip(0, 1) for s in shapes]
    labels = polygon_rows(np.array([s.kind for s in shapes], np.float64), outlines)
    return img, labels.astype(np.float32).reshape(-1, 5), [o.astype(np.float32) for o in outlines]


def _write_split(folder: Path, split: str, count: int, spec: SyntheticSpec) -> None:
    image_dir, label_dir = folder / "images" / split, folder / "labels" / split
    image_dir.mkdir(parents=True)
    label_dir.mkdir(parents=True)
    for i in range(count):
        rng = np.random.default_rng([spec.seed, SPLITS.index(split), i])  # the detection set's images
        img, labels, outlines = draw_seg_sample(rng, spec)
        cv2.imwrite(str(image_dir / f"{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        (label_dir / f"{i:05d}.txt").write_text(segment_rows_text(labels, outlines))


def _header(spec: SyntheticSpec) -> dict:
    """What identifies a segment set in its manifest (a set of the first version holds exactly these keys)."""
    return {"version": SEG_VERSION, "task": "segment", "spec": asdict(spec) | {"img_size": list(spec.img_size)},
            "names": SYNTHETIC_NAMES}


def is_valid_seg(root: Path, spec: SyntheticSpec) -> bool:
    """True when ``root`` holds a complete segment set made from ``spec`` (manifest matches, files all there)."""
    return SEGMENT_SET.is_complete(root, _header(spec), split_counts(spec))


def generate_seg(root: Path, spec: SyntheticSpec) -> Path:
    """Write the segment set into a new folder renamed to ``root``; an earlier set of ours there is cleared first
    of what it wrote, and any other folder is refused (utils.data.generated)."""
    def write(folder: Path) -> None:
        for split, count in zip(SPLITS, (spec.n_train, spec.n_val)):
            _write_split(folder, split, count, spec)

    return SEGMENT_SET.generate(root, _header(spec), write)


def default_seg_root(spec: SyntheticSpec) -> Path:
    """``data_home()/synthetic-seg-v<version>-<hash>``: one folder per version and parameter set."""
    return data_home() / f"synthetic-seg-v{SEG_VERSION}-{spec.key()}"


def ensure_synthetic_seg(root: str | Path | None = None, n_train: int = 512, n_val: int = 128,
                         img_size: int | Sequence[int] = (128, 160), seed: int = 0, max_objects: int = 4,
                         min_object: float = 0.2, max_object: float = 0.5) -> Path:
    """The folder of the synthetic segment set for these parameters, generated first when missing or invalid.

    Generation runs on local rank 0 while the other ranks wait (zero-first). All ranks must call it. A folder
    holding anything but an earlier set of ours is refused (one line), never cleared.
    """
    spec = make_spec(n_train, n_val, img_size, seed, max_objects, min_object, max_object)
    folder = Path(root) if root is not None else default_seg_root(spec)
    return SEGMENT_SET.ensure(folder, _header(spec), split_counts(spec), lambda: generate_seg(folder, spec),
                              f"{spec.n_train} train + {spec.n_val} val images with outlines")
