"""The built-in oriented-box set: rotated rectangles of three shapes (``square`` 1:1, ``rectangle`` 2:1, ``strip``
4:1) at any angle on the detection set's textured backgrounds, labelled with their exact corners as YOLO-OBB rows
(``images/{train,val}/00000.jpg``, ``labels/{train,val}/00000.txt``), deterministic in its seed.

Each rectangle is drawn as a filled polygon at OpenCV's sub-pixel precision (corners in 1/256 pixel), so the
label's corners are the drawn ones; every rectangle lies wholly inside its image and overlaps no other by more
than 0.1 IoU. The writer (``write_obb_set``) fills a new folder the shared generated-set mechanism made for it
(utils/data/generated.py), given the names it writes (``OWN_FILES``), the header (``header``) and the counts per
folder (``split_counts``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np
import torch

from utils.data.dota import obb_label_text
from utils.data.generated import GeneratedSet
from utils.data.synthetic import (
    SPLITS,
    SyntheticSpec,
    _background,
    _contrasting_color,
    _luma,
    make_spec,
)
from utils.paths import data_home
from utils.tasks.obb.rotated import rotated_iou, xywhr2corners

OBB_VERSION = 1
OBB_NAMES = ["square", "rectangle", "strip"]
ASPECTS = (1.0, 2.0, 4.0)  # width : height of each class
OWN_FILES = re.compile(rf"(images/({'|'.join(SPLITS)})/\d{{5}}\.jpg|labels/({'|'.join(SPLITS)})/\d{{5}}\.txt)")
OBB_SET = GeneratedSet("synthetic-obb", OWN_FILES)
SUBPIXEL = 8  # OpenCV's shift: corners in 1/256 pixel


def _place(rng: np.random.Generator, spec: SyntheticSpec, kind: int, width: int, height: int) -> np.ndarray:
    """A rotated box (5,) xywhr of class ``kind`` wholly inside the image."""
    short = min(width, height)
    area = (rng.uniform(spec.min_object, spec.max_object) * short) ** 2 * math.pi / 4  # as the detection shapes'
    w = math.sqrt(area * ASPECTS[kind])
    h = w / ASPECTS[kind]
    scale = min(1.0, 0.9 * short / w)  # a long strip still fits
    w, h = w * scale, h * scale
    angle = rng.uniform(0, math.pi)
    reach_x = (abs(w * math.cos(angle)) + abs(h * math.sin(angle))) / 2 + 1
    reach_y = (abs(w * math.sin(angle)) + abs(h * math.cos(angle))) / 2 + 1
    return np.array([rng.uniform(reach_x, width - reach_x), rng.uniform(reach_y, height - reach_y), w, h, angle])


def draw_obb_sample(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image (BGR uint8), its boxes' classes (k,) and exact corners (k, 4, 2) in pixels."""
    width, height = (int(rng.integers(spec.img_size[0], spec.img_size[1] + 1)) for _ in range(2))
    img = _background(rng, height, width)
    boxes, classes = [], []
    for _ in range(int(rng.integers(1, spec.max_objects + 1))):
        for _attempt in range(20):
            kind = int(rng.integers(0, len(OBB_NAMES)))
            box = _place(rng, spec, kind, width, height)
            if not boxes or rotated_iou(torch.tensor(box[None]), torch.tensor(np.array(boxes))).max() < 0.1:
                break
        else:
            continue
        corners = xywhr2corners(torch.tensor(box)).numpy()
        x1, y1 = corners.min(0).astype(int)
        x2, y2 = corners.max(0).astype(int) + 1
        color = _contrasting_color(rng, _luma(img[y1:y2, x1:x2].reshape(-1, 3).mean(0)))
        fixed = np.round((corners - 0.5) * (1 << SUBPIXEL)).astype(np.int32)  # pixel centres at +0.5
        cv2.fillPoly(img, [fixed], color, cv2.LINE_AA, shift=SUBPIXEL)
        boxes.append(box)
        classes.append(kind)
    corners = xywhr2corners(torch.tensor(np.array(boxes).reshape(-1, 5))).numpy()
    return img, np.array(classes, np.int64), corners


def write_obb_set(folder: Path, spec: SyntheticSpec) -> list[str]:
    """Write every image and label file of the set into ``folder`` (which the caller made for it); returns the
    names written."""
    written = []
    for split, count in zip(SPLITS, (spec.n_train, spec.n_val)):
        (folder / "images" / split).mkdir(parents=True, exist_ok=True)
        (folder / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            rng = np.random.default_rng([spec.seed, SPLITS.index(split), i, OBB_VERSION])
            img, classes, corners = draw_obb_sample(rng, spec)
            h, w = img.shape[:2]
            image, label = f"images/{split}/{i:05d}.jpg", f"labels/{split}/{i:05d}.txt"
            (folder / image).write_bytes(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes())
            (folder / label).write_text(obb_label_text(classes, corners / np.array([w, h], np.float64)))
            written += [image, label]
    return written


def header(spec: SyntheticSpec) -> dict:
    """What identifies one set in its manifest."""
    return {"version": OBB_VERSION, "task": "obb", "spec": asdict(spec) | {"img_size": list(spec.img_size)},
            "names": OBB_NAMES}


def split_counts(spec: SyntheticSpec) -> dict[str, int]:
    """The files each folder of a complete set holds."""
    return {f"{kind}/{split}": count for split, count in zip(SPLITS, (spec.n_train, spec.n_val))
            for kind in ("images", "labels")}



def ensure_synthetic_obb(root: str | Path | None = None, n_train: int = 512, n_val: int = 128,
                         img_size: int | Sequence[int] = (128, 160), seed: int = 0, max_objects: int = 4,
                         min_object: float = 0.2, max_object: float = 0.5) -> Path:
    """The folder of the synthetic oriented-box set for these parameters (default:
    ``data_home()/synthetic-obb-v<version>-<hash>``), generated first when missing, through the one generated-set
    mechanism (utils/data/generated.py: only into a new folder, an earlier set of ours replaced, anything else
    refused). Generation runs on local rank 0 while the other ranks wait (zero-first). All ranks must call it."""
    spec = make_spec(n_train, n_val, img_size, seed, max_objects, min_object, max_object)
    folder = Path(root) if root is not None else data_home() / f"synthetic-obb-v{OBB_VERSION}-{spec.key()}"
    return OBB_SET.ensure(folder, header(spec), split_counts(spec),
                          lambda: OBB_SET.generate(folder, header(spec), lambda tmp: write_obb_set(tmp, spec)),
                          f"{spec.n_train} train + {spec.n_val} val oriented-box images")
