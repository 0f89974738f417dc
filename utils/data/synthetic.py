"""The built-in data set: solid shapes on textured backgrounds, generated deterministically from a seed.

It makes ``python train.py`` work offline. The set is written in YOLO format
(``images/{train,val}/*.jpg`` + ``labels/{train,val}/*.txt``) into
``data_home()/synthetic-v<version>-<params hash>`` on first use, zero-first under DDP, and is
skipped when already present and valid.

Nothing a user has is ever removed: the set is written and replaced by utils.data.generated, the mechanism every
generated set shares (a folder it creates and marks, a manifest of every file with its size and SHA-256, and on
regeneration only those files removed; a folder holding anything else is refused in one line).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from utils.data.generated import MANIFEST as MANIFEST  # the set's manifest, named here for its readers
from utils.data.generated import GeneratedSet, GeneratedSetError
from utils.paths import data_home
from utils.safe_yaml import shown

SYNTHETIC_NAMES = ["circle", "square", "triangle"]
SYNTHETIC_VERSION = 1
SPLITS = ("train", "val")
OWN_FILE = re.compile(r"(images/(train|val)/\d{5}\.jpg|labels/(train|val)/\d{5}\.txt)")  # what it writes
DETECT_SET = GeneratedSet("synthetic-detect", OWN_FILE)
MAX_IMAGES = 100_000  # train + val images of one set (the default set has 640)
MAX_SIDE = 4096


SyntheticError = GeneratedSetError  # the synthetic set cannot be generated where it was asked for

@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate; its hash names the folder, so changing any field makes a new set."""

    n_train: int = 512
    n_val: int = 128
    img_size: tuple[int, int] = (128, 160)  # each image's width and height are drawn from [min, max]
    seed: int = 0
    max_objects: int = 4
    min_object: float = 0.2  # object diameter as a fraction of the image's shorter side
    max_object: float = 0.5

    def key(self) -> str:
        """Short hash of the version and every field: the folder name's suffix."""
        text = json.dumps({"version": SYNTHETIC_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:8]


def make_spec(n_train: int = 512, n_val: int = 128, img_size: int | Sequence[int] = (128, 160), seed: int = 0,
              max_objects: int = 4, min_object: float = 0.2, max_object: float = 0.5) -> SyntheticSpec:
    """A validated SyntheticSpec; ``img_size`` is one side or a [min, max] range. The parameters may come from a
    data YAML, so each is bounded (MAX_IMAGES images of at most MAX_SIDE pixels a side): ValueError otherwise."""
    sides = [img_size] * 2 if _is_number(img_size) else list(img_size) if isinstance(img_size, list | tuple) else []
    if len(sides) != 2 or not all(_is_number(s) and 32 <= s <= MAX_SIDE for s in sides) or sides[0] > sides[1]:
        raise ValueError(f"synthetic img_size {shown(img_size)} must be a side or a [min, max] range in "
                         f"32..{MAX_SIDE}")
    counts = (n_train, n_val, max_objects, seed)
    if not all(_is_number(v) and float(v).is_integer() for v in counts) or n_train < 1 or n_val < 1 or \
            n_train + n_val > MAX_IMAGES or not 1 <= max_objects <= 64 or not 0 <= seed < 2**63:
        raise ValueError(f"synthetic n_train, n_val must be >= 1 and at most {MAX_IMAGES} together, max_objects "
                         "1..64, seed a whole number >= 0")
    if not (_is_number(min_object) and _is_number(max_object) and 0 < min_object <= max_object <= 0.9):
        raise ValueError("synthetic min_object, max_object must satisfy 0 < min_object <= max_object <= 0.9")
    return SyntheticSpec(int(n_train), int(n_val), (int(sides[0]), int(sides[1])), int(seed), int(max_objects),
                         float(min_object), float(max_object))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A muted, low-contrast texture: a smooth colour field plus stripes and fine noise (BGR uint8)."""
    base = rng.uniform(60, 190)
    tint = rng.uniform(-25, 25, size=3)
    coarse = rng.normal(0, 18, size=(4, 4, 3)).astype(np.float32)
    field = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle, period = rng.uniform(0, math.pi), rng.uniform(6, 24)
    stripes = 8 * np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / period)
    noise = rng.normal(0, 6, size=(height, width, 3))
    img = base + tint + field + stripes[..., None] + noise
    return np.clip(img, 0, 255).astype(np.uint8)


def _luma(bgr: np.ndarray) -> float:
    return float(0.114 * bgr[0] + 0.587 * bgr[1] + 0.299 * bgr[2])


def _contrasting_color(rng: np.random.Generator, background_luma: float) -> tuple[int, int, int]:
    """A vivid colour whose brightness differs clearly from the background under it."""
    for _ in range(50):
        hsv = np.array([[[rng.integers(0, 180), rng.integers(140, 256), rng.integers(0, 256)]]], np.uint8)
        bgr = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0].astype(np.float32)
        if abs(_luma(bgr) - background_luma) >= 70:
            return int(bgr[0]), int(bgr[1]), int(bgr[2])
    return (20, 20, 20) if background_luma > 128 else (235, 235, 235)


def _shape_points(kind: int, cx: float, cy: float, radius: float, rng: np.random.Generator) -> np.ndarray:
    """Polygon (k, 2) for a square (small tilt) or a triangle (any rotation); unused for circles."""
    if kind == 1:
        angles = np.deg2rad(rng.uniform(-15, 15)) + np.array([0.25, 0.75, 1.25, 1.75]) * math.pi
        radius = radius * math.sqrt(2) * 0.85  # so the square's area is close to the circle's
    else:
        angles = rng.uniform(0, 2 * math.pi) + np.array([0, 2 / 3, 4 / 3]) * math.pi
        radius = radius * 1.15
    return np.stack([cx + radius * np.cos(angles), cy + radius * np.sin(angles)], 1)


def _iou(box: np.ndarray, boxes: list[np.ndarray]) -> float:
    if not boxes:
        return 0.0
    others = np.stack(boxes)
    inter_w = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    inter_h = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = inter_w * inter_h
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    return float((inter / (area(box) + area(others) - inter)).max())


@dataclass(frozen=True)
class Shape:
    """One drawn object: its class (index into SYNTHETIC_NAMES), centre and radius in pixels, polygon vertices
    (k, 2) for squares and triangles (None for circles; drawn rounded to whole pixels) and its box x1 y1 x2 y2."""

    kind: int
    cx: float
    cy: float
    radius: float
    points: np.ndarray | None
    box: np.ndarray


def draw_shapes(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[np.ndarray, list[Shape]]:
    """One image (BGR uint8) and the shapes drawn on it, in drawing order (a later shape covers an earlier one)."""
    width, height = (int(rng.integers(spec.img_size[0], spec.img_size[1] + 1)) for _ in range(2))
    img = _background(rng, height, width)
    short = min(height, width)
    shapes: list[Shape] = []
    for _ in range(int(rng.integers(1, spec.max_objects + 1))):
        for _attempt in range(20):
            kind = int(rng.integers(0, len(SYNTHETIC_NAMES)))
            radius = rng.uniform(spec.min_object, spec.max_object) * short / 2
            margin = radius * 1.2 + 1
            cx, cy = rng.uniform(margin, width - margin), rng.uniform(margin, height - margin)
            points = None if kind == 0 else _shape_points(kind, cx, cy, radius, rng)
            if points is None:
                box = np.array([cx - radius, cy - radius, cx + radius, cy + radius])
            else:
                box = np.concatenate([points.min(0), points.max(0)])
            box = np.clip(box, 0, [width, height, width, height])
            if _iou(box, [s.box for s in shapes]) < 0.2:
                break
        else:
            continue
        under = img[int(box[1]):int(box[3]) + 1, int(box[0]):int(box[2]) + 1].reshape(-1, 3).mean(0)
        color = _contrasting_color(rng, _luma(under))
        if points is None:
            cv2.circle(img, (round(cx), round(cy)), round(radius), color, -1, cv2.LINE_AA)
        else:
            cv2.fillPoly(img, [np.round(points).astype(np.int32)], color, cv2.LINE_AA)
        shapes.append(Shape(kind, float(cx), float(cy), float(radius), points, box))
    return img, shapes


def draw_sample(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[np.ndarray, np.ndarray]:
    """One image (BGR uint8) and its labels (k, 5) [class, cx, cy, w, h] normalised."""
    img, shapes = draw_shapes(rng, spec)
    height, width = img.shape[:2]
    labels = [[s.kind, (s.box[0] + s.box[2]) / 2 / width, (s.box[1] + s.box[3]) / 2 / height,
               (s.box[2] - s.box[0]) / width, (s.box[3] - s.box[1]) / height] for s in shapes]
    return img, np.array(labels, np.float32).reshape(-1, 5)


def _write_split(folder: Path, split: str, count: int, spec: SyntheticSpec) -> None:
    """Write one split's images and labels into ``folder``."""
    image_dir, label_dir = folder / "images" / split, folder / "labels" / split
    image_dir.mkdir(parents=True)
    label_dir.mkdir(parents=True)
    for i in range(count):
        rng = np.random.default_rng([spec.seed, SPLITS.index(split), i])  # independent of order
        img, labels = draw_sample(rng, spec)
        rows = [f"{int(c)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}" for c, x, y, w, h in labels]
        (image_dir / f"{i:05d}.jpg").write_bytes(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])[1])
        (label_dir / f"{i:05d}.txt").write_text("\n".join(rows) + ("\n" if rows else ""))


def _header(spec: SyntheticSpec) -> dict:
    """What identifies a set in its manifest (the keys a set of the first version has too, so it stays valid)."""
    return {"version": SYNTHETIC_VERSION, "spec": asdict(spec) | {"img_size": list(spec.img_size)},
            "names": SYNTHETIC_NAMES}


def split_counts(spec: SyntheticSpec) -> dict[str, int]:
    """The files each folder of a complete set holds (``images/train``: n_train, ...)."""
    return {f"{kind}/{split}": count for split, count in zip(SPLITS, (spec.n_train, spec.n_val))
            for kind in ("images", "labels")}


def is_valid(root: Path, spec: SyntheticSpec) -> bool:
    """True when ``root`` holds a complete set made from ``spec`` (manifest matches, files all there)."""
    return DETECT_SET.is_complete(root, _header(spec), split_counts(spec))


def generate(root: Path, spec: SyntheticSpec) -> Path:
    """Write the set into a new folder renamed to ``root``; an earlier set of ours there is cleared first of what
    it wrote (utils.data.generated says when that is refused)."""
    def write(folder: Path) -> None:
        _write_split(folder, "train", spec.n_train, spec)
        _write_split(folder, "val", spec.n_val, spec)

    return DETECT_SET.generate(root, _header(spec), write)


def default_root(spec: SyntheticSpec) -> Path:
    """``data_home()/synthetic-v<version>-<hash>``: one folder per version and parameter set."""
    return data_home() / f"synthetic-v{SYNTHETIC_VERSION}-{spec.key()}"


def ensure_synthetic(root: str | Path | None = None, n_train: int = 512, n_val: int = 128,
                     img_size: int | Sequence[int] = (128, 160), seed: int = 0, max_objects: int = 4,
                     min_object: float = 0.2, max_object: float = 0.5) -> Path:
    """The folder of the synthetic set for these parameters, generated first when missing or invalid.

    Generation runs on local rank 0 while the other ranks wait (zero-first). All ranks must call it. A folder
    holding anything but an earlier set of this generator is refused (SyntheticError), never cleared.
    """
    spec = make_spec(n_train, n_val, img_size, seed, max_objects, min_object, max_object)
    folder = Path(root) if root is not None else default_root(spec)
    return DETECT_SET.ensure(folder, _header(spec), split_counts(spec), lambda: generate(folder, spec),
                             f"{spec.n_train} train + {spec.n_val} val images")
