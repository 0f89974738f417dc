"""Image augmentations with boxes that follow the pixels: letterbox, mosaic, perspective, HSV, flips, mixup.

Images are HWC uint8 BGR numpy arrays. Box arrays are ``(n, 5)`` float32 ``[class, x1, y1, x2, y2]`` in
pixels unless a function says otherwise. Random functions take an explicit ``np.random.Generator``
so every rank and worker draws from its own stream.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from utils.boxes import xywhn2xyxy

PAD_COLOR = (114, 114, 114)


def letterbox(img: np.ndarray, new_shape: int | tuple[int, int] = 640, color: tuple[int, int, int] = PAD_COLOR,
              auto: bool = True, scale_fill: bool = False, scaleup: bool = True,
              stride: int = 32) -> tuple[np.ndarray, tuple[float, float], tuple[float, float]]:
    """Resize keeping the aspect ratio, then pad to ``new_shape`` (h, w).

    ``auto``: pad only up to the next multiple of ``stride`` (minimum rectangle); ``scale_fill``:
    stretch to fill without padding; ``scaleup=False``: never enlarge (better val mAP).
    Returns the image, the (w, h) ratios and the (w, h) padding added on the left/top.
    """
    shape = img.shape[:2]
    if isinstance(new_shape, int):
        new_shape = (new_shape, new_shape)
    gain = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    if not scaleup:
        gain = min(gain, 1.0)
    ratio = (gain, gain)
    unpadded = (round(shape[1] * gain), round(shape[0] * gain))  # (w, h)
    pad_w, pad_h = new_shape[1] - unpadded[0], new_shape[0] - unpadded[1]
    if auto:
        pad_w, pad_h = pad_w % stride, pad_h % stride
    elif scale_fill:
        pad_w, pad_h = 0, 0
        unpadded = (new_shape[1], new_shape[0])
        ratio = (new_shape[1] / shape[1], new_shape[0] / shape[0])
    pad_w, pad_h = float(pad_w) / 2, float(pad_h) / 2
    if shape[::-1] != unpadded:
        img = cv2.resize(img, unpadded, interpolation=cv2.INTER_LINEAR)
    top, bottom = round(pad_h - 0.1), round(pad_h + 0.1)
    left, right = round(pad_w - 0.1), round(pad_w + 0.1)
    img = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=color)
    return img, ratio, (pad_w, pad_h)


def box_candidates(before: np.ndarray, after: np.ndarray, wh_thr: float = 2, ar_thr: float = 100,
                   area_thr: float = 0.1, eps: float = 1e-16) -> np.ndarray:
    """Mask of boxes that survive a transform: > wh_thr px wide and high, > area_thr of their area, sane aspect.

    ``before`` and ``after`` are (4, n) [x1, y1, x2, y2] arrays (the box before, scaled, and after).
    """
    w1, h1 = before[2] - before[0], before[3] - before[1]
    w2, h2 = after[2] - after[0], after[3] - after[1]
    aspect = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (aspect < ar_thr)


def _perspective_matrix(rng: np.random.Generator, in_shape: tuple[int, int], out_shape: tuple[int, int],
                        degrees: float, translate: float, scale: float, shear: float,
                        perspective: float) -> tuple[np.ndarray, float]:
    """The combined 3x3 transform (centre the input, perspective, rotate+scale, shear, move to the output's
    centre +- translate) and its scale."""
    center = np.eye(3)
    center[0, 2], center[1, 2] = -in_shape[1] / 2, -in_shape[0] / 2
    height, width = out_shape
    persp = np.eye(3)
    persp[2, 0], persp[2, 1] = rng.uniform(-perspective, perspective), rng.uniform(-perspective, perspective)
    rotate = np.eye(3)
    angle, s = rng.uniform(-degrees, degrees), rng.uniform(1 - scale, 1 + scale)
    rotate[:2] = cv2.getRotationMatrix2D(angle=angle, center=(0, 0), scale=s)
    shear_m = np.eye(3)
    shear_m[0, 1] = math.tan(math.radians(rng.uniform(-shear, shear)))
    shear_m[1, 0] = math.tan(math.radians(rng.uniform(-shear, shear)))
    move = np.eye(3)
    move[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * width
    move[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * height
    return move @ shear_m @ rotate @ persp @ center, s


def random_perspective(img: np.ndarray, labels: np.ndarray, rng: np.random.Generator, degrees: float = 10,
                       translate: float = 0.1, scale: float = 0.1, shear: float = 10, perspective: float = 0.0,
                       border: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray]:
    """Random affine/perspective warp; each box becomes the bounding box of its warped corners.

    ``border`` (h, w) < 0 crops (used after mosaic: 2s x 2s -> s x s). Boxes that shrink to nothing or
    lose most of their area are dropped.
    """
    height, width = img.shape[0] + border[0] * 2, img.shape[1] + border[1] * 2
    matrix, s = _perspective_matrix(rng, img.shape[:2], (height, width), degrees, translate, scale, shear,
                                    perspective)
    if border[0] != 0 or border[1] != 0 or (matrix != np.eye(3)).any():
        if perspective:
            img = cv2.warpPerspective(img, matrix, dsize=(width, height), borderValue=PAD_COLOR)
        else:
            img = cv2.warpAffine(img, matrix[:2], dsize=(width, height), borderValue=PAD_COLOR)
    if len(labels) == 0:
        return img, labels
    corners = np.ones((len(labels) * 4, 3))
    corners[:, :2] = labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(-1, 2)  # x1y1, x2y2, x1y2, x2y1
    corners = corners @ matrix.T
    corners = corners[:, :2] / corners[:, 2:3] if perspective else corners[:, :2]
    xs, ys = corners[:, 0].reshape(-1, 4), corners[:, 1].reshape(-1, 4)
    boxes = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], 1)
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, height)
    keep = box_candidates(labels[:, 1:5].T * s, boxes.T, area_thr=0.10)
    out = labels[keep].astype(np.float32, copy=True)
    out[:, 1:5] = boxes[keep]
    return img, out


def augment_hsv(img: np.ndarray, rng: np.random.Generator, hgain: float = 0.5, sgain: float = 0.5,
                vgain: float = 0.5) -> np.ndarray:
    """Random hue/saturation/value gains, applied in place through lookup tables (returns ``img``)."""
    if not (hgain or sgain or vgain):
        return img
    gains = rng.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_BGR2HSV))
    x = np.arange(0, 256, dtype=np.float64)
    lut_hue = ((x * gains[0]) % 180).astype(np.uint8)
    lut_sat = np.clip(x * gains[1], 0, 255).astype(np.uint8)
    lut_val = np.clip(x * gains[2], 0, 255).astype(np.uint8)
    merged = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    cv2.cvtColor(merged, cv2.COLOR_HSV2BGR, dst=img)
    return img


def flip_lr(img: np.ndarray, labels_xywhn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror left-right; labels are normalised [cls, cx, cy, w, h]."""
    out = labels_xywhn.copy()
    out[:, 1] = 1 - out[:, 1]
    return np.ascontiguousarray(np.fliplr(img)), out


def flip_ud(img: np.ndarray, labels_xywhn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror up-down; labels are normalised [cls, cx, cy, w, h]."""
    out = labels_xywhn.copy()
    out[:, 2] = 1 - out[:, 2]
    return np.ascontiguousarray(np.flipud(img)), out


def mixup(img: np.ndarray, labels: np.ndarray, img2: np.ndarray, labels2: np.ndarray,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Blend two same-size images (ratio ~ Beta(32, 32)) and keep both label sets."""
    ratio = rng.beta(32.0, 32.0)
    blended = (img.astype(np.float32) * ratio + img2.astype(np.float32) * (1 - ratio)).astype(np.uint8)
    return blended, np.concatenate((labels, labels2), 0)


def mosaic4(images: list[np.ndarray], labels: list[np.ndarray], size: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Tile 4 images around a random centre of a 2s x 2s canvas; labels are normalised xywh per image.

    Returns the canvas and its labels as [cls, x1, y1, x2, y2] pixels (clipped to the canvas);
    follow with ``random_perspective(..., border=(-s // 2, -s // 2))`` to crop back to s x s.
    """
    canvas = np.full((size * 2, size * 2, images[0].shape[2]), PAD_COLOR[0], dtype=np.uint8)
    yc, xc = (int(rng.uniform(size // 2, 3 * size // 2)) for _ in range(2))
    out = []
    for i, (img, lab) in enumerate(zip(images, labels)):
        h, w = img.shape[:2]
        if i == 0:  # top left: the image's bottom-right corner at the centre
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
        elif i == 1:  # top right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, size * 2), yc
            x1b, y1b = 0, h - (y2a - y1a)
        elif i == 2:  # bottom left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(size * 2, yc + h)
            x1b, y1b = w - (x2a - x1a), 0
        else:  # bottom right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, size * 2), min(size * 2, yc + h)
            x1b, y1b = 0, 0
        canvas[y1a:y2a, x1a:x2a] = img[y1b:y1b + (y2a - y1a), x1b:x1b + (x2a - x1a)]
        pixels = lab.astype(np.float32, copy=True)
        pixels[:, 1:] = xywhn2xyxy(lab[:, 1:], w, h, x1a - x1b, y1a - y1b)
        out.append(pixels)
    boxes = np.concatenate(out, 0) if out else np.zeros((0, 5), np.float32)
    boxes[:, 1:5] = boxes[:, 1:5].clip(0, 2 * size)
    return canvas, boxes
