"""The random hue/saturation/value change of training augmentation, drawn once and applied in uint8.

``draw_hsv`` draws the three gains exactly as ``utils.data.augment.hsv_table`` does (the same values from the
same stream) and keeps them: ``HsvChange.apply`` then scales the HSV pixels by one ``cv2.transform`` (a SIMD
3x3 matrix product, 4x faster than the 3-channel lookup table it replaces), rounding each product where the table
floors it, so a pixel's H, S and V differ from the table's by at most 1 level; a hue that the gain takes past
179 is wrapped by OpenCV's HSV -> BGR conversion. Hue gains that would take a hue past 255 or below 0 (``hsv_h``
over 0.42) use the table.
"""

from __future__ import annotations

from typing import NamedTuple

import cv2
import numpy as np

HUE_LEVELS = 180  # OpenCV's 8-bit hue: 2 degrees a level


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


def draw_hsv(rng: np.random.Generator, hgain: float = 0.5, sgain: float = 0.5,
             vgain: float = 0.5) -> HsvChange | None:
    """A random colour change (the draws of ``hsv_table``); None without gains (nothing drawn)."""
    if not (hgain or sgain or vgain):
        return None
    gains = rng.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1
    return HsvChange((float(gains[0]), float(gains[1]), float(gains[2])))
