"""The built-in classification set: one solid shape (circle, square or triangle) on the detection set's textured
backgrounds, filed in class folders (``train/<class>/00000.jpg``, ``val/<class>/...``), deterministic in its seed.

Image ``i`` of a split is of class ``i % 3`` and is drawn from its own random stream (seed, split, i), so a set is
the same whatever order it is written in. The writer fills a folder it is given (``write_cls_set``); what a
generated-set mechanism needs to own the files it made is here too: the names it writes (``OWN_FILES``), the
header that identifies a set (``header``) and how many files each folder holds (``split_counts``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np

from utils.data.synthetic import (
    MANIFEST,
    MAX_MANIFEST,
    SPLITS,
    SYNTHETIC_NAMES,
    SyntheticError,
    SyntheticSpec,
    _background,
    _contrasting_color,
    _luma,
    _shape_points,
    make_spec,
)
from utils.distributed import comm as dist
from utils.log import LOGGER, colorstr
from utils.paths import data_home

CLS_VERSION = 1
OWN_FILES = re.compile(rf"({'|'.join(SPLITS)})/({'|'.join(SYNTHETIC_NAMES)})/\d{{5}}\.jpg")


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


def is_complete(root: Path, spec: SyntheticSpec) -> bool:
    """True when ``root`` holds a complete set made from ``spec``: its manifest's header and every folder's count."""
    try:
        manifest = json.loads((root / MANIFEST).read_text()) if (root / MANIFEST).stat().st_size < MAX_MANIFEST \
            else {}
        return manifest == header(spec) and all(len(os.listdir(root / folder)) == count
                                                for folder, count in split_counts(spec).items())
    except (OSError, ValueError, RecursionError):
        return False


def generate(root: Path, spec: SyntheticSpec) -> Path:
    """Write the set into a new temporary sibling of ``root``, then rename it to ``root`` (a folder that is missing
    or empty; anything else is refused in one line and never cleared)."""
    if root.is_symlink() or (root.exists() and (not root.is_dir() or any(root.iterdir()))):
        raise SyntheticError(f"synthetic set: {root} exists and is not an empty folder nor a complete set of these "
                             "parameters; the generator writes only into a new or empty folder: choose another "
                             "path or move it away")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp", dir=root.parent))  # new: nobody else's
    try:
        write_cls_set(tmp, spec)
        (tmp / MANIFEST).write_text(json.dumps(header(spec), indent=1))
        with contextlib.suppress(OSError):
            root.rmdir()  # an empty folder
        tmp.rename(root)
    except OSError:  # another process (not in our group) finished first, or something appeared there
        if not is_complete(root, spec):
            raise SyntheticError(f"synthetic set: could not move the new set into {root} (something else is "
                                 "writing there); try again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # made by mkdtemp above: only this call's own files
    return root


def ensure_synthetic_cls(root: str | Path | None = None, n_train: int = 600, n_val: int = 150,
                img_size: int | Sequence[int] = (128, 160), seed: int = 0, max_objects: int = 4,
                min_object: float = 0.2, max_object: float = 0.5) -> Path:
    """The folder of the synthetic classification set for these parameters (default:
    ``data_home()/synthetic-cls-v<version>-<hash>``), generated first when missing. Generation runs on local rank 0
    while the other ranks wait (zero-first). All ranks must call it."""
    spec = make_spec(n_train, n_val, img_size, seed, max_objects, min_object, max_object)
    folder = Path(root) if root is not None else data_home() / f"synthetic-cls-v{CLS_VERSION}-{spec.key()}"
    with dist.zero_first(local=True):
        if dist.is_local_main_process() and not is_complete(folder, spec):
            LOGGER.info(f"{colorstr('synthetic:')} generating {spec.n_train} train + {spec.n_val} val "
                        f"classification images into {folder} ...")
            generate(folder, spec)
    return folder
