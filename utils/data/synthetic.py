"""The built-in data set: solid shapes on textured backgrounds, generated deterministically from a seed.

It makes ``python train.py`` work offline. The set is written in YOLO format
(``images/{train,val}/*.jpg`` + ``labels/{train,val}/*.txt``) into
``data_home()/synthetic-v<version>-<params hash>`` on first use, zero-first under DDP, and is
skipped when already present and valid. Generation happens in a new temporary folder that is
renamed into place, so a crash never leaves a half-written set that looks valid.

Nothing a user has is ever removed: the set is generated only into a folder that does not exist yet, an empty
one, or one holding an earlier set of this generator. Its manifest lists every file it wrote with a hash; an
earlier set is cleared of exactly those files (when unchanged) and of the label caches made for them, and when
anything else is left there, generation is refused with one line naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from utils.distributed import comm as dist
from utils.errors import UserError
from utils.log import LOGGER, colorstr
from utils.paths import data_home
from utils.safe_yaml import shown

SYNTHETIC_NAMES = ["circle", "square", "triangle"]
SYNTHETIC_VERSION = 1
MANIFEST = "synthetic.json"
SPLITS = ("train", "val")
OWN_FILE = re.compile(r"(images/(train|val)/\d{5}\.jpg|labels/(train|val)/\d{5}\.txt)")  # what it writes
OWN_CACHES = ("labels/train.cache", "labels/val.cache", "labels/train.cache.d", "labels/val.cache.d")  # the scan's
MAX_OWN_FILE = 16 << 20  # a file named as one of ours but larger was not written by the generator
MAX_MANIFEST = 4 << 20
MAX_IMAGES = 100_000  # train + val images of one set (the default set has 640)
MAX_SIDE = 4096


class SyntheticError(UserError):
    """The synthetic set cannot be generated where it was asked for (a folder holding other files)."""


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


def _write_split(folder: Path, split: str, count: int, spec: SyntheticSpec) -> dict[str, str]:
    """Write one split's images and labels; {relative path: sha1 of the bytes written} for the manifest."""
    image_dir, label_dir = folder / "images" / split, folder / "labels" / split
    image_dir.mkdir(parents=True)
    label_dir.mkdir(parents=True)
    written = {}
    for i in range(count):
        rng = np.random.default_rng([spec.seed, SPLITS.index(split), i])  # independent of order
        img, labels = draw_sample(rng, spec)
        jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
        rows = [f"{int(c)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}" for c, x, y, w, h in labels]
        txt = ("\n".join(rows) + ("\n" if rows else "")).encode()
        for path, content in ((image_dir / f"{i:05d}.jpg", jpg), (label_dir / f"{i:05d}.txt", txt)):
            path.write_bytes(content)
            written[path.relative_to(folder).as_posix()] = hashlib.sha1(content).hexdigest()
    return written


def _manifest(spec: SyntheticSpec) -> dict:
    return {"version": SYNTHETIC_VERSION, "spec": asdict(spec) | {"img_size": list(spec.img_size)},
            "names": SYNTHETIC_NAMES}


def _read_manifest(root: Path) -> dict:
    """The manifest in ``root`` ({} when there is none or it is not one: too large, not JSON, not a mapping)."""
    path = root / MANIFEST
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_MANIFEST:
            return {}
        found = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def is_valid(root: Path, spec: SyntheticSpec) -> bool:
    """True when ``root`` holds a complete set made from ``spec`` (manifest matches, files all there)."""
    manifest = _read_manifest(root)
    if {key: manifest.get(key) for key in ("version", "spec", "names")} != _manifest(spec):
        return False
    counts = {"train": spec.n_train, "val": spec.n_val}
    try:
        return all(len(os.listdir(root / kind / split)) == counts[split]
                   for split in SPLITS for kind in ("images", "labels"))
    except OSError:
        return False


def _unchanged(path: Path, digest: object) -> bool:
    """Whether ``path`` is a plain file still holding what the generator wrote (its sha1 is ``digest``)."""
    try:
        return (not path.is_symlink() and path.is_file() and path.stat().st_size <= MAX_OWN_FILE
                and hashlib.sha1(path.read_bytes()).hexdigest() == digest)
    except OSError:
        return False


def _clear_own_set(root: Path) -> None:
    """Remove from ``root`` what the generator wrote there before (listed in its manifest, unchanged), the label
    caches made for it, then the folders left empty; nothing else is touched."""
    files = _read_manifest(root).get("files")
    if not isinstance(files, dict):
        return  # no list of its own files (not a set of this generator, or one from before the list): keep all
    for name, digest in files.items():
        if isinstance(name, str) and OWN_FILE.fullmatch(name) and _unchanged(root / name, digest):
            (root / name).unlink()
    for name in OWN_CACHES:
        cache = root / name
        if cache.is_symlink():
            continue
        if cache.is_file():
            cache.unlink()
        elif cache.is_dir():
            shutil.rmtree(cache)
    (root / MANIFEST).unlink()
    for folder in sorted((p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only an empty folder goes


def check_target(root: Path, spec: SyntheticSpec) -> None:
    """SyntheticError (one line) unless ``root`` may receive a new set: missing, empty, or holding only an earlier
    set of this generator (with its list of files). Reads only; all ranks may call it."""
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise SyntheticError(f"synthetic set: {root} exists and is not a folder; choose another path")
    if not root.exists() or is_valid(root, spec):
        return
    files = _read_manifest(root).get("files")
    own = isinstance(files, dict)  # an earlier set that lists its files (with their hashes)
    allowed = {name for name, digest in files.items() if isinstance(name, str) and OWN_FILE.fullmatch(name)
               and _unchanged(root / name, digest)} | {MANIFEST} if own else set()
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if name in allowed or (own and any(name == c or name.startswith(c + "/") for c in OWN_CACHES)):
            continue
        if path.is_symlink() or not path.is_dir():
            raise SyntheticError(f"synthetic set: {root} is not empty and holds files the generator did not make "
                                 f"or that changed since it made them ({name!r}); it generates only into a new or "
                                 "empty folder or its own earlier set: choose another path or move them away")


def generate(root: Path, spec: SyntheticSpec) -> Path:
    """Write the set into a new temporary sibling folder, then rename it to ``root`` (atomic on one disk); an
    earlier set of this generator at ``root`` is cleared first (check_target says when that is refused)."""
    check_target(root, spec)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp", dir=root.parent))  # new: nobody else's
    try:
        written = _write_split(tmp, "train", spec.n_train, spec)
        written.update(_write_split(tmp, "val", spec.n_val, spec))
        (tmp / MANIFEST).write_text(json.dumps(_manifest(spec) | {"files": written}, indent=1))
        if root.exists():
            _clear_own_set(root)
            with contextlib.suppress(OSError):
                root.rmdir()  # empty now; if not (another writer), the rename below fails and nothing is lost
        try:
            tmp.rename(root)
        except OSError:  # another process (not in our group) finished first, or something appeared there
            if not is_valid(root, spec):
                raise SyntheticError(f"synthetic set: could not move the new set into {root} (something else is "
                                     "writing there); try again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # made by mkdtemp above: only this call's own files
    return root


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
    check_target(folder, spec)  # on every rank, so a refusal is the same line everywhere
    with dist.zero_first(local=True):
        if dist.is_local_main_process() and not is_valid(folder, spec):
            LOGGER.info(f"{colorstr('synthetic:')} generating {spec.n_train} train + {spec.n_val} val images "
                        f"into {folder} ...")
            generate(folder, spec)
    return folder
