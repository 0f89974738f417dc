"""The built-in classification set: one solid shape (circle, square or triangle) on the detection set's textured
backgrounds, filed in class folders (``train/<class>/00000.jpg``, ``val/<class>/...``), deterministic in its seed.

Image ``i`` of a split is of class ``i % 3`` and is drawn from its own random stream (seed, split, i), so a set is
the same whatever order it is written in. The writer fills a new folder the shared generated-set mechanism made for
it (utils/data/generated.py), given the names it writes (``OWN_FILES``), the header that identifies a set
(``header``) and how many files each folder holds (``split_counts``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np

from utils.data.generated import GeneratedSet
from utils.data.synthetic import (
    SPLITS,
    SYNTHETIC_NAMES,
    SyntheticSpec,
    _background,
    _contrasting_color,
    _luma,
    _shape_points,
    make_spec,
)
from utils.paths import data_home

CLS_VERSION = 1
OWN_FILES = re.compile(rf"({'|'.join(SPLITS)})/({'|'.join(SYNTHETIC_NAMES)})/\d{{5}}\.jpg")
CLS_SET = GeneratedSet("synthetic-classify", OWN_FILES)


def draw_cls_sample(rng: np.random.Generator, spec: SyntheticSpec, kind: int) -> np.ndarray:
    """One image (BGR uint8) of class ``kind``: a shape of ``max_object`` of the shorter side at most, at a random
    place, in a colour that stands out from the background under it."""
    width, height = (int(rng.integers(spec.img_size[0], spec.img_size[1] + 1)) for _ in range(2))
    img = _background(rng, height, width)
    short = min(height, width)
    radius = rng.uniform(max(spec.min_object, 0.3), max(spec.max_object, 0.35)) * short / 2
    margin = radius * 1.2 + 1
    cx, cy = rng.uniform(margin, width - margin), rng.uniform(margin, height - margin)
    under = img[int(cy - radius):int(cy + radius) + 1, int(cx - radius):int(cx + radius) + 1].reshape(-1, 3).mean(0)
    color = _contrasting_color(rng, _luma(under))
    if kind == 0:
        cv2.circle(img, (round(cx), round(cy)), round(radius), color, -1, cv2.LINE_AA)
    else:
        cv2.fillPoly(img, [np.round(_shape_points(kind, cx, cy, radius, rng)).astype(np.int32)], color, cv2.LINE_AA)
    return img


def sample_name(split: str, index: int) -> str:
    """The relative path of image ``index`` of ``split``: ``split/<class>/<index>.jpg``."""
    return f"{split}/{SYNTHETIC_NAMES[index % len(SYNTHETIC_NAMES)]}/{index:05d}.jpg"


def write_cls_set(folder: Path, spec: SyntheticSpec) -> list[str]:
    """Write every image of the set into ``folder`` (which the caller made for it); returns the names written."""
    written = []
    for split, count in zip(SPLITS, (spec.n_train, spec.n_val)):
        for i in range(count):
            rng = np.random.default_rng([spec.seed, SPLITS.index(split), i, CLS_VERSION])
            name = sample_name(split, i)
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(cv2.imencode(".jpg", draw_cls_sample(rng, spec, i % len(SYNTHETIC_NAMES)),
                                          [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes())
            written.append(name)
    return written


def header(spec: SyntheticSpec) -> dict:
    """What identifies one set in its manifest."""
    return {"version": CLS_VERSION, "task": "classify", "spec": asdict(spec) | {"img_size": list(spec.img_size)},
            "names": SYNTHETIC_NAMES}


def split_counts(spec: SyntheticSpec) -> dict[str, int]:
    """The images each class folder of a complete set holds."""
    k = len(SYNTHETIC_NAMES)
    return {f"{split}/{name}": math.ceil((count - c) / k) for split, count in zip(SPLITS, (spec.n_train, spec.n_val))
            for c, name in enumerate(SYNTHETIC_NAMES)}



def ensure_synthetic_cls(root: str | Path | None = None, n_train: int = 600, n_val: int = 150,
                         img_size: int | Sequence[int] = (128, 160), seed: int = 0, max_objects: int = 4,
                         min_object: float = 0.2, max_object: float = 0.5) -> Path:
    """The folder of the synthetic classification set for these parameters (default:
    ``data_home()/synthetic-cls-v<version>-<hash>``), generated first when missing, through the one generated-set
    mechanism (utils/data/generated.py: only into a new folder, an earlier set of ours replaced, anything else
    refused). Generation runs on local rank 0 while the other ranks wait (zero-first). All ranks must call it."""
    spec = make_spec(n_train, n_val, img_size, seed, max_objects, min_object, max_object)
    folder = Path(root) if root is not None else data_home() / f"synthetic-cls-v{CLS_VERSION}-{spec.key()}"
    return CLS_SET.ensure(folder, header(spec), split_counts(spec),
                          lambda: CLS_SET.generate(folder, header(spec), lambda tmp: write_cls_set(tmp, spec)),
                          f"{spec.n_train} train + {spec.n_val} val classification images")
