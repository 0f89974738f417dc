"""The classification augmentation: random resized crop, flips and colour jitter for training; resize and centre
crop for validation (ultralytics' classification transforms, their default values; our own code on BGR uint8
images with OpenCV).

Training (``train_transform``): a crop of a random 8-100 % of the image's area with an aspect ratio between 3/4 and
4/3 (log-uniform), found in up to 10 tries, else the largest centre crop of a ratio in that range, resized to
``size`` x ``size``; a left-right flip with probability ``fliplr`` (0.5) and an up-down one with ``flipud`` (0.0);
then brightness and contrast factors in [1 - hsv_v, 1 + hsv_v] (0.4), saturation in [1 - hsv_s, 1 + hsv_s] (0.4)
and a hue shift of up to hsv_h (0.015) of the colour circle. Validation (``val_transform``): the shorter side
resized to ``size`` (``size / crop_fraction``), then the centre ``size`` x ``size``. Both return a BGR uint8
(size, size, 3) image; the data set hands it on as every task's samples are, RGB uint8 (3, size, size), and the
model sees it in [0, 1] (ultralytics' classifiers use mean 0 and std 1).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
DEFAULTS = {"fliplr": 0.5, "flipud": 0.0, "hsv_h": 0.015, "hsv_s": 0.4, "hsv_v": 0.4}


def crop_box(height: int, width: int, rng: np.random.Generator, scale: tuple[float, float] = SCALE,
             ratio: tuple[float, float] = RATIO, tries: int = 10) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random resized crop (see the module docstring)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(tries):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    aspect = width / height  # the fallback: the whole image, trimmed to the ratio range, centred
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crop(img: np.ndarray, size: int, rng: np.random.Generator, scale: tuple[float, float] = SCALE,
                        ratio: tuple[float, float] = RATIO) -> np.ndarray:
    top, left, h, w = crop_box(img.shape[0], img.shape[1], rng, scale, ratio)
    return cv2.resize(img[top:top + h, left:left + w], (size, size), interpolation=cv2.INTER_LINEAR)


def color_jitter(img: np.ndarray, rng: np.random.Generator, brightness: float = 0.4, contrast: float = 0.4,
                 saturation: float = 0.4, hue: float = 0.015) -> np.ndarray:
    """Brightness, contrast, saturation factors and a hue shift drawn as in the module docstring, in that order."""
    out = img.astype(np.float32)
    if brightness:
        out *= rng.uniform(max(0.0, 1 - brightness), 1 + brightness)
    if contrast:
        gray_mean = cv2.cvtColor(np.clip(out, 0, 255).astype(np.uint8), cv2.COLOR_BGR2GRAY).mean()
        out = (out - gray_mean) * rng.uniform(max(0.0, 1 - contrast), 1 + contrast) + gray_mean
    if saturation:
        gray = cv2.cvtColor(np.clip(out, 0, 255).astype(np.uint8), cv2.COLOR_BGR2GRAY).astype(np.float32)
        factor = rng.uniform(max(0.0, 1 - saturation), 1 + saturation)
        out = (out - gray[..., None]) * factor + gray[..., None]
    out = np.clip(out, 0, 255).astype(np.uint8)
    if hue:
        hsv = cv2.cvtColor(out, cv2.COLOR_BGR2HSV)
        shift = round(rng.uniform(-hue, hue) * 180)  # OpenCV's hue runs 0..179
        hsv[..., 0] = ((hsv[..., 0].astype(np.int16) + shift) % 180).astype(np.uint8)
        out = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
    return out


def train_transform(img: np.ndarray, size: int, rng: np.random.Generator, hyp: dict | None = None) -> np.ndarray:
    """A training sample (see the module docstring); ``hyp`` may set fliplr, flipud, hsv_h, hsv_s and hsv_v."""
    settings = {**DEFAULTS, **{k: float(v) for k, v in (hyp or {}).items() if k in DEFAULTS}}
    img = random_resized_crop(img, size, rng)
    if rng.random() < settings["fliplr"]:
        img = cv2.flip(img, 1)
    if rng.random() < settings["flipud"]:
        img = cv2.flip(img, 0)
    return color_jitter(img, rng, settings["hsv_v"], settings["hsv_v"], settings["hsv_s"], settings["hsv_h"])


def resize_center_crop(img: np.ndarray, size: int | tuple[int, int], crop_fraction: float = 1.0) -> np.ndarray:
    """Scaled to cover ``size`` / ``crop_fraction`` (a square ``size``: the shorter side to it), then the centre
    ``size`` x ``size`` (or (h, w))."""
    h, w = img.shape[:2]
    crop_h, crop_w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    scale = max(math.floor(crop_h / crop_fraction) / h, math.floor(crop_w / crop_fraction) / w)
    new_h, new_w = max(crop_h, round(h * scale)), max(crop_w, round(w * scale))
    resized = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR) if (new_w, new_h) != (w, h) else img
    top, left = (new_h - crop_h) // 2, (new_w - crop_w) // 2
    return resized[top:top + crop_h, left:left + crop_w]


def val_transform(img: np.ndarray, size: int | tuple[int, int], crop_fraction: float = 1.0) -> np.ndarray:
    """A validation sample: resize, centre crop."""
    return resize_center_crop(img, size, crop_fraction)
