"""The built-in synthetic pose set (the pose task's ``synthetic`` part): stick figures on the synthetic set's
textured backgrounds, labelled with YOLO pose rows (``0 cx cy w h`` then 17 x ``x y v``, normalised), so pose models
train offline.

A figure has COCO's 17 person keypoints in COCO's order (nose, eyes, ears, shoulders, elbows, wrists, hips, knees,
ankles: utils/tasks/pose/labels.py), so COCO's sigmas, flip index and skeleton apply and a release pose model's head
fits it. It stands (tilted up to 20 degrees) facing the viewer, so its left side is on the image's right, as in
COCO; a left-right flip swaps left and right (COCO_FLIP_INDEX). Everything is exact by construction: the limbs are
COCO's skeleton drawn as lines between the keypoints with cv2 at 1/16 pixel precision and no anti-aliasing, the head
a disc (the face keypoints lie on it), and a keypoint's label is the drawn point in pixel-edge coordinates (cv2's
point + 0.5, normalised). The box is the extent of the pixels the figure painted; a keypoint is visible (v 2) unless
a later figure painted over its pixel (v 1, occluded).

``ensure_synthetic_pose`` writes the set into ``data_home()/synthetic-pose-v<version>-<params hash>`` on first use
(zero-first under DDP) by utils.data.generated (a folder it creates and marks; on regeneration only the files its
manifest lists and that are unchanged are removed; a folder holding anything else is refused in one line); a
complete set of the same parameters is reused. data/synthetic-pose.yaml names its parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from utils.data.generated import GeneratedSet
from utils.data.synthetic import (
    OWN_FILE,
    SPLITS,
    SyntheticSpec,
    _background,
    _contrasting_color,
    _luma,
    make_spec,
    split_counts,
)
from utils.paths import data_home
from utils.tasks.pose.labels import COCO_FLIP_INDEX, COCO_KEYPOINT_NAMES, COCO_SKELETON, pose_label_line

POSE_VERSION = 2
POSE_NAMES = ["figure"]
KEYPOINT_NAMES = COCO_KEYPOINT_NAMES
FLIP_INDEX = COCO_FLIP_INDEX
SKELETON = COCO_SKELETON  # the limbs drawn
SUBPIXEL = 4  # cv2's fractional bits: points at 1/16 pixel
HEAD_RADIUS, LIMB_WIDTH = 0.08, 0.05  # of the figure's height
POSE_SET = GeneratedSet("synthetic-pose", OWN_FILE)  # the detection set's file names


@dataclass(frozen=True)
class Figure:
    """One drawn figure: keypoints (17, 2) in cv2 pixel coordinates (pixel centres at integers, exact multiples of
    1/16), its height in pixels, limb thickness and head radius in pixels, colour."""

    keypoints: np.ndarray
    height: float
    thickness: int
    head_radius: float
    color: tuple[int, int, int]


def figure_keypoints(rng: np.random.Generator, cx: float, cy: float, height: float) -> np.ndarray:
    """The 17 keypoints (17, 2) of a figure ``height`` pixels tall centred at (cx, cy), in COCO's order: a random
    tilt, arm and leg angles; the figure's left side toward +x before the tilt. Quantised to 1/16 pixel (what cv2
    draws)."""
    h = height
    head = np.array([0.0, -0.40 * h])

    def limb(start: np.ndarray, length: float, degrees: float) -> np.ndarray:
        angle = math.radians(degrees)
        return start + length * np.array([math.cos(angle), math.sin(angle)])

    face = [head + np.array([0.0, 0.01 * h]), head + np.array([0.03 * h, -0.02 * h]),
            head + np.array([-0.03 * h, -0.02 * h]), head + np.array([0.07 * h, 0.0]),
            head + np.array([-0.07 * h, 0.0])]  # nose, eyes, ears (left: +x)
    left_shoulder, right_shoulder = np.array([0.10 * h, -0.28 * h]), np.array([-0.10 * h, -0.28 * h])
    left_elbow = limb(left_shoulder, 0.15 * h, rng.uniform(-40, 100))  # angle from +x, y down
    right_elbow = limb(right_shoulder, 0.15 * h, 180 - rng.uniform(-40, 100))
    left_wrist = limb(left_elbow, 0.14 * h, rng.uniform(-60, 110))
    right_wrist = limb(right_elbow, 0.14 * h, 180 - rng.uniform(-60, 110))
    left_hip, right_hip = np.array([0.06 * h, 0.04 * h]), np.array([-0.06 * h, 0.04 * h])
    left_knee = limb(left_hip, 0.22 * h, 90 - rng.uniform(0, 30))  # from straight down, toward +x
    right_knee = limb(right_hip, 0.22 * h, 90 + rng.uniform(0, 30))
    left_ankle = limb(left_knee, 0.22 * h, 90 - rng.uniform(-15, 15))
    right_ankle = limb(right_knee, 0.22 * h, 90 + rng.uniform(-15, 15))
    points = np.stack([*face, left_shoulder, right_shoulder, left_elbow, right_elbow, left_wrist, right_wrist,
                       left_hip, right_hip, left_knee, right_knee, left_ankle, right_ankle])
    tilt = math.radians(rng.uniform(-20, 20))
    rotation = np.array([[math.cos(tilt), -math.sin(tilt)], [math.sin(tilt), math.cos(tilt)]])
    points = points @ rotation.T + np.array([cx, cy])
    return np.round(points * (1 << SUBPIXEL)) / (1 << SUBPIXEL)


def draw_figure(canvas: np.ndarray, figure: Figure, color: tuple[int, ...] | int | None = None) -> None:
    """Paint ``figure`` on ``canvas`` (in place): its limbs and head, in its colour or ``color``."""
    paint = figure.color if color is None else color
    fixed = np.round(figure.keypoints * (1 << SUBPIXEL)).astype(np.int64)
    for a, b in SKELETON:
        cv2.line(canvas, tuple(map(int, fixed[a])), tuple(map(int, fixed[b])), paint, figure.thickness, cv2.LINE_8,
                 SUBPIXEL)
    centre = np.round((figure.keypoints[3] + figure.keypoints[4]) / 2 * (1 << SUBPIXEL)).astype(np.int64)  # ears
    cv2.circle(canvas, tuple(map(int, centre)), round(figure.head_radius * (1 << SUBPIXEL)), paint, -1, cv2.LINE_8,
               SUBPIXEL)


def figure_mask(shape: tuple[int, int], figure: Figure) -> np.ndarray:
    """The pixels (h, w) bool that ``figure`` paints on an image of ``shape``."""
    mask = np.zeros(shape, np.uint8)
    draw_figure(mask, figure, 1)
    return mask.astype(bool)


def _place(rng: np.random.Generator, width: int, height: int, spec: SyntheticSpec,
           boxes: list[np.ndarray]) -> tuple[np.ndarray, float] | None:
    """Keypoints and height of a figure that fits inside the image with a margin and covers at most 30% of the
    smaller of its box and each earlier figure's (no figure hides behind another); None after 20 tries."""
    short = min(width, height)
    for _ in range(20):
        size = rng.uniform(spec.min_object, spec.max_object) * short
        margin = 0.6 * size + 2
        if 2 * margin >= min(width, height):
            continue
        points = figure_keypoints(rng, rng.uniform(margin, width - margin), rng.uniform(margin, height - margin),
                                  size)
        extent = np.concatenate((points.min(0), points.max(0))) + np.array([-1, -1, 1, 1]) * HEAD_RADIUS * size
        if _overlap(extent, boxes) <= 0.3:
            return points, size
    return None


def _overlap(box: np.ndarray, boxes: list[np.ndarray]) -> float:
    """The largest intersection of ``box`` with one of ``boxes`` over the smaller area of the two (0 for none)."""
    if not boxes:
        return 0.0
    others = np.stack(boxes)
    inter = (np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
             * np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None))
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    return float((inter / np.minimum(areas, (box[2] - box[0]) * (box[3] - box[1]))).max())


def draw_pose_sample(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image (BGR uint8), its boxes (k, 5) [0, cx, cy, w, h] normalised (each figure's painted extent) and
    keypoints (k, 17, 3) normalised with v 2 (visible) or 1 (a later figure painted over it)."""
    width, height = (int(rng.integers(spec.img_size[0], spec.img_size[1] + 1)) for _ in range(2))
    img = _background(rng, height, width)
    figures, masks, extents = [], [], []
    for _ in range(int(rng.integers(1, spec.max_objects + 1))):
        placed = _place(rng, width, height, spec, extents)
        if placed is None:
            continue
        points, size = placed
        box = np.concatenate((points.min(0), points.max(0))).clip(0, [width, height, width, height])
        under = img[int(box[1]):int(box[3]) + 1, int(box[0]):int(box[2]) + 1].reshape(-1, 3).mean(0)
        figure = Figure(points, size, max(1, round(LIMB_WIDTH * size)), HEAD_RADIUS * size,
                        _contrasting_color(rng, _luma(under)))
        draw_figure(img, figure)
        mask = figure_mask((height, width), figure)
        ys, xs = np.nonzero(mask)
        extents.append(np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64))
        figures.append(figure)
        masks.append(mask)
    labels = np.zeros((len(figures), 5), np.float32)
    keypoints = np.zeros((len(figures), len(KEYPOINT_NAMES), 3), np.float32)
    for i, (figure, (x1, y1, x2, y2)) in enumerate(zip(figures, extents)):
        labels[i] = 0, (x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height
        pixels = np.clip(np.round(figure.keypoints).astype(np.int64), 0, [width - 1, height - 1])
        covered = np.zeros(len(pixels), bool)
        for later in masks[i + 1:]:
            covered |= later[pixels[:, 1], pixels[:, 0]]
        keypoints[i, :, 0] = (figure.keypoints[:, 0] + 0.5) / width
        keypoints[i, :, 1] = (figure.keypoints[:, 1] + 0.5) / height
        keypoints[i, :, 2] = np.where(covered, 1.0, 2.0)
    return img, labels, keypoints


def pose_rows_text(labels: np.ndarray, keypoints: np.ndarray) -> str:
    """A YOLO pose label file's text for boxes (k, 5) normalised and keypoints (k, K, 3) normalised."""
    lines = [pose_label_line(int(row[0]), row[1:5], points) for row, points in zip(labels, keypoints)]
    return "\n".join(lines) + ("\n" if lines else "")


def _write_split(folder: Path, split: str, count: int, spec: SyntheticSpec) -> None:
    image_dir, label_dir = folder / "images" / split, folder / "labels" / split
    image_dir.mkdir(parents=True)
    label_dir.mkdir(parents=True)
    for i in range(count):
        rng = np.random.default_rng([spec.seed, SPLITS.index(split), i, POSE_VERSION])  # independent of order
        img, labels, keypoints = draw_pose_sample(rng, spec)
        cv2.imwrite(str(image_dir / f"{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        (label_dir / f"{i:05d}.txt").write_text(pose_rows_text(labels, keypoints))


def _header(spec: SyntheticSpec) -> dict:
    """What identifies a pose set in its manifest."""
    return {"version": POSE_VERSION, "task": "pose", "spec": asdict(spec) | {"img_size": list(spec.img_size)},
            "names": POSE_NAMES, "kpt_shape": [len(KEYPOINT_NAMES), 3], "flip_idx": list(FLIP_INDEX)}


def is_valid_pose(root: Path, spec: SyntheticSpec) -> bool:
    """True when ``root`` holds a complete pose set made from ``spec`` (manifest matches, files all there)."""
    return POSE_SET.is_complete(root, _header(spec), split_counts(spec))


def generate_pose(root: Path, spec: SyntheticSpec) -> Path:
    """Write the pose set into a new folder renamed to ``root``; an earlier set of ours there is cleared first of
    what it wrote, and any other folder is refused (utils.data.generated)."""
    def write(folder: Path) -> None:
        for split, count in zip(SPLITS, (spec.n_train, spec.n_val)):
            _write_split(folder, split, count, spec)

    return POSE_SET.generate(root, _header(spec), write)


def default_pose_root(spec: SyntheticSpec) -> Path:
    """``data_home()/synthetic-pose-v<version>-<hash>``: one folder per version and parameter set."""
    return data_home() / f"synthetic-pose-v{POSE_VERSION}-{spec.key()}"


def ensure_synthetic_pose(root: str | Path | None = None, n_train: int = 512, n_val: int = 128,
                          img_size: int | Sequence[int] = (128, 160), seed: int = 0, max_objects: int = 3,
                          min_object: float = 0.4, max_object: float = 0.8) -> Path:
    """The folder of the synthetic pose set for these parameters, generated first when missing or invalid.

    Generation runs on local rank 0 while the other ranks wait (zero-first). All ranks must call it. A folder
    holding anything but an earlier set of ours is refused (one line), never cleared."""
    spec = make_spec(n_train, n_val, img_size, seed, max_objects, min_object, max_object)
    folder = Path(root) if root is not None else default_pose_root(spec)
    return POSE_SET.ensure(folder, _header(spec), split_counts(spec), lambda: generate_pose(folder, spec),
                           f"{spec.n_train} train + {spec.n_val} val pose images")
