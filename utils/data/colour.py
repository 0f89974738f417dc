"""The random hue/saturation/value change of training augmentation, drawn once and applied in uint8.

``draw_hsv`` draws the three gains exactly as ``utils.data.augment.hsv_table`` does (the same values from the
same stream) and keeps them: ``HsvChange.apply`` then scales the HSV pixels by one ``cv2.transform`` (a SIMD
3x3 matrix product, 4x faster than the 3-channel lookup table it replaces), rounding each product where the table
floors it, so a pixel's H, S and V differ from the table's by at most 1 level; a hue that the gain takes past
179 is wrapped by OpenCV's HSV -> BGR conversion. Hue gains that would take a hue past 255 or below 0 (``hsv_h``
over 0.42) use the table.

With the change left to the training step (``DatasetOptions.defer_colour``; train.py ``--colour-on``), a batch
carries each image's gains under ``COLOUR_KEY`` and ``recolour`` applies them to the whole batch on its device,
within one level of ``HsvChange.apply``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import cv2
import numpy as np
import torch

HUE_LEVELS = 180  # OpenCV's 8-bit hue: 2 degrees a level
COLOUR_KEY = "colour"  # a batch's extra: its images' (hue, saturation, value) gains (b, 3), left to the step
RECOLOUR_CHUNK = 16  # images recoloured at a time: bounds the working memory of a large batch
SHIFT = 12  # OpenCV's 8-bit BGR -> HSV divides through tables of reciprocals scaled by 2**12
S_TABLE = (0, *(round((255 << SHIFT) / i) for i in range(1, 256)))  # 255 / V
H_TABLE = (0, *(round((HUE_LEVELS << SHIFT) / (6 * i)) for i in range(1, 256)))  # 30 / (V - min)


class HsvChange(NamedTuple):
    """Gains (hue, saturation, value) of one sample's colour change, and the lookup table of the same gains."""

    gains: tuple[float, float, float]

    def table(self) -> np.ndarray:
        """The change as ``hsv_table``'s (1, 256, 3) lookup table (floored products, hue modulo 180)."""
        x = np.arange(0, 256, dtype=np.float64)
        table = np.empty((1, 256, 3), np.uint8)
        table[0, :, 0] = (x * self.gains[0]) % HUE_LEVELS
        table[0, :, 1] = np.clip(x * self.gains[1], 0, 255)
        table[0, :, 2] = np.clip(x * self.gains[2], 0, 255)
        return table

    def apply(self, img: np.ndarray, inplace: bool = True) -> np.ndarray:
        """``img`` (BGR uint8, HWC) changed: in place (returns ``img``), or as a new image."""
        hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
        if 0 <= self.gains[0] and (HUE_LEVELS - 1) * self.gains[0] < 255.5:
            cv2.transform(hsv, np.diag(np.asarray(self.gains, np.float32)), dst=hsv)
        else:  # the hue would saturate at 255 before OpenCV could wrap it
            cv2.LUT(hsv, self.table(), dst=hsv)
        return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=img if inplace else hsv)


def hsv_gains(hyp: dict) -> tuple[float, float, float]:
    """The hyps' hue, saturation and value gains (hsv_h, hsv_s, hsv_v; 0 where missing), as draw_hsv takes them."""
    return hyp.get("hsv_h", 0), hyp.get("hsv_s", 0), hyp.get("hsv_v", 0)


def draw_hsv(rng: np.random.Generator, hgain: float = 0.5, sgain: float = 0.5,
             vgain: float = 0.5) -> HsvChange | None:
    """A random colour change (the draws of ``hsv_table``); None without gains (nothing drawn)."""
    if not (hgain or sgain or vgain):
        return None
    gains = rng.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1
    return HsvChange((float(gains[0]), float(gains[1]), float(gains[2])))


def recolour(images: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """uint8 RGB images (b, 3, h, w) on any device with each image's colour change of ``gains`` (b, 3) applied as
    HsvChange.apply changes BGR pixels: OpenCV's 8-bit HSV (its fixed-point H and S), the products rounded (floored
    where apply uses its table), the hue wrapped, back to RGB truncated; within one level of it. A new uint8 tensor
    in the images' layout, made RECOLOUR_CHUNK images at a time (the working memory: about 60 bytes a pixel of a
    chunk)."""
    gains = gains.to(images.device, torch.float32, non_blocking=True)  # no wait for the GPU's queue
    out = torch.empty_like(images)
    for start in range(0, len(images), RECOLOUR_CHUNK):
        end = start + RECOLOUR_CHUNK
        _recolour_into(out[start:end], images[start:end], gains[start:end])
    return out


def _recolour_into(out: torch.Tensor, images: torch.Tensor, gains: torch.Tensor) -> None:
    x = images.to(torch.int32)
    r, g, b = x.unbind(1)
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    s_table, h_table = _tables(images.device)
    half = 1 << (SHIFT - 1)
    s = (diff * s_table[v] + half) >> SHIFT
    h = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * h_table[diff] + half) >> SHIFT
    h = torch.where(h < 0, h + HUE_LEVELS, h)
    del x, r, g, b, diff
    k = gains[:, :, None, None]
    floored = ~((k[:, 0] >= 0) & ((HUE_LEVELS - 1) * k[:, 0] < 255.5))  # the images HsvChange.apply changes by table

    def scaled(channel: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        product = channel * gain
        return torch.where(floored, product.floor(), product.round())

    sector = torch.remainder(scaled(h, k[:, 0]), HUE_LEVELS) * (6 / HUE_LEVELS)  # 0 <= sector < 6
    chroma = scaled(v, k[:, 2]).clamp_(0, 255)  # the value V, then V x S: the colour's spread from V
    v = chroma.clone()
    chroma *= scaled(s, k[:, 1]).clamp_(0, 255).div_(255)
    for channel, start in enumerate((5, 3, 1)):  # R, G, B: V less chroma x the channel's ramp around the hue
        ramp = torch.remainder(sector + start, 6)
        ramp = torch.minimum(ramp, 4 - ramp).clamp_(0, 1)
        out[:, channel] = (v - chroma * ramp).floor_().clamp_(0, 255)


@functools.lru_cache(maxsize=8)
def _tables(device: torch.device) -> torch.Tensor:
    """S_TABLE and H_TABLE on ``device``, copied there once (a copy each step would wait for the GPU's queue)."""
    return torch.tensor((S_TABLE, H_TABLE), dtype=torch.int32, device=device)


def take_colour(extras: list) -> torch.Tensor | None:
    """A batch's colour gains left to the training step (taken out of its extras: the items after its shapes, as
    the training loop unpacks a batch); None when the loader changed its colour."""
    if not extras or not isinstance(extras[0], dict):
        return None
    return extras[0].pop(COLOUR_KEY, None)
