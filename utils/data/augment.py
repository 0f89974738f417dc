"""Image augmentations with boxes that follow the pixels: letterbox, mosaic, perspective, HSV, flips, mixup.

Images are HWC uint8 BGR numpy arrays. Box arrays are ``(n, 5)`` float32 ``[class, x1, y1, x2, y2]`` in
pixels unless a function says otherwise. Random functions take an explicit ``np.random.Generator``
so every rank and worker draws from its own stream.

What a task's samples carry beside the boxes (a segmenter's outlines, a pose model's keypoints) follows the same
pixels: each geometric step takes the sample's ``extras`` and the task's ``Geometry``, which moves them with the
matrix that moves the image and the boxes (``warp_mosaic_extras``, ``random_perspective_extras``); the base
Geometry carries nothing, so a detection sample is exactly the boxes' own functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import cv2
import numpy as np

from utils.boxes import xywhn2xyxy
from utils.data.colour import HsvChange

PAD_COLOR = (114, 114, 114)


class Geometry:
    """What a sample carries per object beside its box, moved with it by every augmentation: the base task's
    Geometry carries nothing (``extras`` is None throughout). A task's subclass (its ``sample`` part,
    utils/tasks/registry.py) holds its objects' geometry as one array in the labels' order (a segmenter's outlines
    (k, n, 2)) and moves it with each step: from normalised to the pixels of an image placed at (pad_x, pad_y)
    (``place``), onto a mosaic's 2s x 2s canvas (``mosaic``, each tile's extras normalised to its image), by a
    3x3 matrix into an image of ``out_shape`` (``warp``, which also decides the boxes and which objects survive),
    back to normalised (``normalize``), mirrored (``flip_lr``/``flip_ud``: a keypoint's left and right swap
    there), joined by mixup (``join``), and what only extras make possible after a mosaic (``paste``: a
    segmenter's copy-paste)."""

    def place(self, extras: Any, width: float, height: float, pad_x: float = 0.0, pad_y: float = 0.0) -> Any:
        return extras

    def mosaic(self, extras: Sequence[Any] | None, sizes: Sequence[tuple[int, int]], places: Sequence[TilePlace],
               size: int) -> Any:
        return None

    def warp(self, labels: np.ndarray, extras: Any, matrix: np.ndarray, scale: float,
             out_shape: tuple[int, int]) -> tuple[np.ndarray, Any]:
        return warp_boxes(labels, matrix, scale, out_shape), extras

    def normalize(self, extras: Any, width: float, height: float) -> Any:
        return extras

    def flip_lr(self, extras: Any) -> Any:
        return extras

    def flip_ud(self, extras: Any) -> Any:
        return extras

    def join(self, extras: Any, other: Any) -> Any:
        return extras

    def paste(self, img: np.ndarray, labels: np.ndarray, extras: Any, hyp: dict,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, Any]:
        return img, labels, extras


class TilePlace(NamedTuple):
    """One mosaic tile: the canvas rectangle [x1a, x2a) x [y1a, y2a) it fills, and the top-left (x1b, y1b) of the
    part of its image that fills it (the image at its canvas size)."""

    x1a: int
    y1a: int
    x2a: int
    y2a: int
    x1b: int
    y1b: int


BOXES = Geometry()  # the base task's: boxes alone


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
    img, labels, _ = random_perspective_extras(img, labels, None, BOXES, rng, degrees, translate, scale, shear,
                                               perspective, border)
    return img, labels


def random_perspective_extras(img: np.ndarray, labels: np.ndarray, extras: Any, geometry: Geometry,
                              rng: np.random.Generator, degrees: float = 10, translate: float = 0.1,
                              scale: float = 0.1, shear: float = 10, perspective: float = 0.0,
                              border: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray, Any]:
    """``random_perspective`` moving a task's ``extras`` (pixels) by the same matrix, through its ``geometry``
    (which also decides the boxes: ``Geometry.warp``)."""
    height, width = img.shape[0] + border[0] * 2, img.shape[1] + border[1] * 2
    matrix, s = _perspective_matrix(rng, img.shape[:2], (height, width), degrees, translate, scale, shear,
                                    perspective)
    if border[0] != 0 or border[1] != 0 or (matrix != np.eye(3)).any():
        if perspective:
            img = cv2.warpPerspective(img, matrix, dsize=(width, height), borderValue=PAD_COLOR)
        else:
            img = cv2.warpAffine(img, matrix[:2], dsize=(width, height), borderValue=PAD_COLOR)
    labels, extras = geometry.warp(labels, extras, matrix, s, (height, width))
    return img, labels, extras


def warp_boxes(labels: np.ndarray, matrix: np.ndarray, scale: float, out_shape: tuple[int, int]) -> np.ndarray:
    """Labels [cls, x1, y1, x2, y2] moved by the 3x3 ``matrix``: each box becomes the bounding box of its warped
    corners, clipped to ``out_shape`` (h, w); boxes that shrink to nothing or lose most of their area are dropped."""
    if len(labels) == 0:
        return labels
    corners = np.ones((len(labels) * 4, 3))
    corners[:, :2] = labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(-1, 2)  # x1y1, x2y2, x1y2, x2y1
    corners = corners @ matrix.T
    projective = matrix[2, 0] != 0 or matrix[2, 1] != 0
    corners = corners[:, :2] / corners[:, 2:3] if projective else corners[:, :2]
    xs, ys = corners[:, 0].reshape(-1, 4), corners[:, 1].reshape(-1, 4)
    boxes = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], 1)
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, out_shape[1])
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, out_shape[0])
    keep = box_candidates(labels[:, 1:5].T * scale, boxes.T, area_thr=0.10)
    out = labels[keep].astype(np.float32, copy=True)
    out[:, 1:5] = boxes[keep]
    return out


def hsv_table(rng: np.random.Generator, hgain: float = 0.5, sgain: float = 0.5,
              vgain: float = 0.5) -> np.ndarray | None:
    """A random hue/saturation/value change as a (1, 256, 3) lookup table on HSV pixels; None without gains."""
    if not (hgain or sgain or vgain):
        return None
    gains = rng.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1
    x = np.arange(0, 256, dtype=np.float64)
    table = np.empty((1, 256, 3), np.uint8)
    table[0, :, 0] = (x * gains[0]) % 180
    table[0, :, 1] = np.clip(x * gains[1], 0, 255)
    table[0, :, 2] = np.clip(x * gains[2], 0, 255)
    return table


def apply_hsv(img: np.ndarray, table: np.ndarray | HsvChange, inplace: bool = True) -> np.ndarray:
    """``img`` (BGR) with the HSV lookup ``table`` (or a utils.data.colour.HsvChange) applied: in place (returns
    ``img``), or as a new image."""
    if isinstance(table, HsvChange):
        return table.apply(img, inplace)
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
    cv2.LUT(hsv, table, dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=img if inplace else hsv)


def augment_hsv(img: np.ndarray, rng: np.random.Generator, hgain: float = 0.5, sgain: float = 0.5,
                vgain: float = 0.5) -> np.ndarray:
    """Random hue/saturation/value gains, applied in place through lookup tables (returns ``img``)."""
    table = hsv_table(rng, hgain, sgain, vgain)
    return img if table is None else apply_hsv(img, table)


def flip_lr(img: np.ndarray, labels_xywhn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror left-right; labels are normalised [cls, cx, cy, w, h]."""
    out = labels_xywhn.copy()
    out[:, 1] = 1 - out[:, 1]
    return cv2.flip(img, 1), out


def flip_ud(img: np.ndarray, labels_xywhn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror up-down; labels are normalised [cls, cx, cy, w, h]."""
    out = labels_xywhn.copy()
    out[:, 2] = 1 - out[:, 2]
    return cv2.flip(img, 0), out


def mixup(img: np.ndarray, labels: np.ndarray, img2: np.ndarray, labels2: np.ndarray,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Blend two same-size images (ratio ~ Beta(32, 32)) and keep both label sets."""
    ratio = rng.beta(32.0, 32.0)
    blended = (img.astype(np.float32) * ratio + img2.astype(np.float32) * (1 - ratio)).astype(np.uint8)
    return blended, np.concatenate((labels, labels2), 0)


def mosaic_layout(sizes: Sequence[tuple[int, int]], size: int, rng: np.random.Generator) -> list[TilePlace]:
    """Where each of 4 images of ``sizes`` (h, w) goes on a 2s x 2s canvas, around a random centre.

    Image 0's bottom-right corner touches the centre, image 1's bottom-left, image 2's top-right, image 3's
    top-left; an image is cropped only where it would cross the canvas's outer edge.
    """
    yc, xc = (int(rng.uniform(size // 2, 3 * size // 2)) for _ in range(2))
    side = size * 2
    places = []
    for i, (h, w) in enumerate(sizes):
        x1a, x2a = (max(xc - w, 0), xc) if i in (0, 2) else (xc, min(xc + w, side))
        y1a, y2a = (max(yc - h, 0), yc) if i in (0, 1) else (yc, min(yc + h, side))
        x1b = w - (x2a - x1a) if i in (0, 2) else 0
        y1b = h - (y2a - y1a) if i in (0, 1) else 0
        places.append(TilePlace(x1a, y1a, x2a, y2a, x1b, y1b))
    return places


def mosaic_boxes(labels: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]], places: Sequence[TilePlace],
                 size: int) -> np.ndarray:
    """The tiles' labels (normalised xywh per image of ``sizes``) as [cls, x1, y1, x2, y2] canvas pixels, clipped
    to the 2s x 2s canvas."""
    out = []
    for lab, (h, w), place in zip(labels, sizes, places):
        pixels = lab.astype(np.float32, copy=True)
        pixels[:, 1:] = xywhn2xyxy(lab[:, 1:], w, h, place.x1a - place.x1b, place.y1a - place.y1b)
        out.append(pixels)
    boxes = np.concatenate(out, 0) if out else np.zeros((0, 5), np.float32)
    boxes[:, 1:5] = boxes[:, 1:5].clip(0, 2 * size)
    return boxes


def mosaic4(images: list[np.ndarray], labels: list[np.ndarray], size: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Tile 4 images around a random centre of a 2s x 2s canvas; labels are normalised xywh per image.

    Returns the canvas and its labels as [cls, x1, y1, x2, y2] pixels (clipped to the canvas); follow with
    ``random_perspective(..., border=(-s // 2, -s // 2))`` to crop back to s x s. ``warp_mosaic`` does both in
    one pass and is what training uses; this is the plain definition it is tested against.
    """
    canvas = np.full((size * 2, size * 2, images[0].shape[2]), PAD_COLOR[0], dtype=np.uint8)
    sizes = [img.shape[:2] for img in images]
    places = mosaic_layout(sizes, size, rng)
    for img, p in zip(images, places):
        canvas[p.y1a:p.y2a, p.x1a:p.x2a] = img[p.y1b:p.y1b + (p.y2a - p.y1a), p.x1b:p.x1b + (p.x2a - p.x1a)]
    return canvas, mosaic_boxes(labels, sizes, places, size)


def warp_mosaic(images: Sequence[np.ndarray], labels: Sequence[np.ndarray], size: int, rng: np.random.Generator,
                sizes: Sequence[tuple[int, int]] | None = None, degrees: float = 10, translate: float = 0.1,
                scale: float = 0.1, shear: float = 10, perspective: float = 0.0,
                hsv: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``mosaic4`` then ``random_perspective`` cropping to s x s, in one pass: each image is warped straight into
    the s x s output by its placement composed with the random transform, so no 2s canvas is built.

    ``sizes`` (h, w) are the sizes the images take on the canvas (default: their own); an image smaller than that
    is enlarged by the same warp, which saves resizing it first. ``hsv`` (a ``hsv_table`` or an HsvChange) is
    applied tile by tile where the tiles do not blend (no rotation, shear or perspective: to each tile's source crop
    or to the block it pastes, whichever has fewer pixels), else to the images before the warp when they have fewer
    pixels than the output, else to the output. The random draws
    are those of mosaic4 and random_perspective, so both ways give the same boxes and, within interpolation,
    the same pixels.
    """
    img, boxes, _ = warp_mosaic_extras(images, labels, None, BOXES, size, rng, sizes, degrees, translate, scale,
                                       shear, perspective, hsv)
    return img, boxes


def warp_mosaic_extras(images: Sequence[np.ndarray], labels: Sequence[np.ndarray], extras: Sequence[Any] | None,
                       geometry: Geometry, size: int, rng: np.random.Generator,
                       sizes: Sequence[tuple[int, int]] | None = None, degrees: float = 10, translate: float = 0.1,
                       scale: float = 0.1, shear: float = 10, perspective: float = 0.0,
                       hsv: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, Any]:
    """``warp_mosaic`` moving each tile's task ``extras`` (normalised to its image) with its boxes: placed on the
    canvas (``Geometry.mosaic``) and warped by the same matrix (``Geometry.warp``, which also decides the boxes).
    Returns (image, labels (k, 5) [cls, x1, y1, x2, y2], extras in the output's pixels)."""
    sizes = [tuple(img.shape[:2]) for img in images] if sizes is None else [tuple(hw) for hw in sizes]
    places = mosaic_layout(sizes, size, rng)
    boxes = mosaic_boxes(labels, sizes, places, size)
    matrix, s = _perspective_matrix(rng, (2 * size, 2 * size), (size, size), degrees, translate, scale, shear,
                                    perspective)
    # colour in the tiles (each its source crop or the block it pastes, the smaller) where they do not blend: the
    # default hyps' scale-and-shift; otherwise when the images have fewer pixels than the output
    colour_first = hsv is not None and (_axis_aligned(matrix) or
                                        sum(img.shape[0] * img.shape[1] for img in images) < size * size)
    pad = PAD_COLOR[0]
    if colour_first:  # the padding as it looks after the change (grey stays grey: only its value changes)
        pad = int(apply_hsv(np.full((1, 1, 3), pad, np.uint8), hsv, inplace=False)[0, 0, 0])
    out = np.full((size, size, images[0].shape[2]), pad, dtype=np.uint8)
    for img, hw, place in zip(images, sizes, places):
        _warp_tile(img, hw, place, matrix, out, hsv if colour_first else None)
    if hsv is not None and not colour_first:
        apply_hsv(out, hsv)
    canvas = geometry.mosaic(extras, sizes, places, size)
    return out, *geometry.warp(boxes, canvas, matrix, s, (size, size))


def _warp_tile(img: np.ndarray, canvas_hw: tuple[int, int], place: TilePlace, matrix: np.ndarray,
               out: np.ndarray, hsv: np.ndarray | None = None) -> None:
    """Warp the part of ``img`` that ``place`` puts on the canvas into ``out`` (in place), through ``matrix``
    (canvas -> output), its colours changed by ``hsv`` first when given. Only the output rectangle the tile can
    reach is computed."""
    (h, w), (src_h, src_w) = canvas_hw, img.shape[:2]
    sx, sy = w / src_w, h / src_h
    # the source pixels covering the placed part (pixel edges scale by sx, sy): the whole image unless cropped
    u0, u1 = math.floor(place.x1b / sx), min(math.ceil((place.x1b + place.x2a - place.x1a) / sx), src_w)
    v0, v1 = math.floor(place.y1b / sy), min(math.ceil((place.y1b + place.y2a - place.y1a) / sy), src_h)
    src, (dx, dy) = img[v0:v1, u0:u1], (place.x1a - place.x1b, place.y1a - place.y1b)
    if _axis_aligned(matrix):
        # no rotation, shear or perspective (the default hyps): one resize from the source, as cv2.resize maps
        # pixel centres (source pixel u of the crop -> canvas sx * (u0 + u + 0.5) - 0.5 + dx), then the matrix
        a, b = float(matrix[0, 0]), float(matrix[1, 1])
        _paste_scaled(src, (a * sx, a * (sx * (u0 + 0.5) - 0.5 + dx) + float(matrix[0, 2])),
                      (b * sy, b * (sy * (v0 + 0.5) - 0.5 + dy) + float(matrix[1, 2])), out, hsv)
        return
    if sx != 1 or sy != 1:  # at canvas size first, so the tile's edges blend over a canvas pixel as on the canvas
        src = cv2.resize(src, None, fx=sx, fy=sy, interpolation=cv2.INTER_LINEAR)
    full = matrix @ np.array([[1, 0, sx * u0 + dx], [0, 1, sy * v0 + dy], [0, 0, 1]])
    roi = _reach(full, src.shape[:2], out.shape[:2])
    if roi is None:
        return  # the tile lands outside the output
    if hsv is not None:
        src = apply_hsv(src, hsv, inplace=False)  # a copy: the image may be a cached one
    x0, y0, x1, y1 = roi
    shift = np.array([[1, 0, -x0], [0, 1, -y0], [0, 0, 1]], float) @ full
    warp = cv2.warpPerspective if shift[2, 0] or shift[2, 1] else cv2.warpAffine
    # BORDER_TRANSPARENT: pixels outside the tile keep what is there, and the tile's edge pixels blend with it
    warp(src, shift if warp is cv2.warpPerspective else shift[:2], (x1 - x0, y1 - y0), dst=out[y0:y1, x0:x1],
         flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_TRANSPARENT)


def _axis_aligned(matrix: np.ndarray) -> bool:
    """A scale (not a mirror) and a shift: no rotation, shear or perspective."""
    return matrix[0, 1] == 0 and matrix[1, 0] == 0 and matrix[2, 0] == 0 and matrix[2, 1] == 0 and matrix[0, 0] > 0


def _reach(full: np.ndarray, src_hw: tuple[int, int], out_hw: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The output rectangle (x0, y0, x1, y1) that a source of ``src_hw`` (with a pixel's margin for blending)
    reaches through ``full``, clipped to the output; None when it reaches nothing."""
    (h, w), (out_h, out_w) = src_hw, out_hw
    corners = np.array([[-1, -1, 1], [w, -1, 1], [-1, h, 1], [w, h, 1]], float) @ full.T
    if (corners[:, 2] <= 0).any():  # a perspective that folds the tile over the horizon: no tight rectangle
        return 0, 0, out_w, out_h
    xy = corners[:, :2] / corners[:, 2:3]
    x0, y0 = max(math.floor(xy[:, 0].min()), 0), max(math.floor(xy[:, 1].min()), 0)
    x1, y1 = min(math.ceil(xy[:, 0].max()) + 1, out_w), min(math.ceil(xy[:, 1].max()) + 1, out_h)
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


def _paste_scaled(src: np.ndarray, x_map: tuple[float, float], y_map: tuple[float, float], out: np.ndarray,
                  hsv: np.ndarray | HsvChange | None) -> None:
    """``src`` scaled and moved into ``out`` (source pixel centre (u, v) -> (ax * u + cx, ay * v + cy), from
    ``x_map`` (ax, cx) and ``y_map`` (ay, cy), ax and ay > 0) by cv2.resize (several times faster than warpAffine)
    of just the source pixels the output needs. The resized block lands on whole pixels, so it may sit up to half an
    output pixel from where the map puts it; its edges do not blend. ``hsv`` colours the source pixels or the
    pasted block, whichever are fewer."""
    (ax, cx), (ay, cy), (h, w), (out_h, out_w) = x_map, y_map, src.shape[:2], out.shape[:2]
    # the output rectangle the source reaches, with a pixel's margin (as _reach)
    x0, y0 = max(math.floor(cx - ax), 0), max(math.floor(cy - ay), 0)
    x1, y1 = min(math.ceil(ax * w + cx) + 1, out_w), min(math.ceil(ay * h + cy) + 1, out_h)
    if x1 <= x0 or y1 <= y0:
        return
    # source pixels that the rectangle samples, with a pixel's margin so interpolation never replicates an edge
    u0, u1 = max(math.floor((x0 - cx) / ax) - 1, 0), min(math.ceil((x1 - 1 - cx) / ax) + 2, w)
    v0, v1 = max(math.floor((y0 - cy) / ay) - 1, 0), min(math.ceil((y1 - 1 - cy) / ay) + 2, h)
    if u1 <= u0 or v1 <= v0:
        return
    part = src[v0:v1, u0:u1]
    if hsv is not None and (v1 - v0) * (u1 - u0) <= (y1 - y0) * (x1 - x0):  # colour the fewer pixels
        part, hsv = apply_hsv(part, hsv, inplace=False), None  # a copy: the image may be a cached one
    scaled = cv2.resize(part, None, fx=ax, fy=ay, interpolation=cv2.INTER_LINEAR)
    # cv2.resize puts the centre of source pixel u at (u + 0.5) * ax - 0.5: the block's origin in the output
    bx, by = round(ax * (u0 - 0.5) + 0.5 + cx), round(ay * (v0 - 0.5) + 0.5 + cy)
    px0, py0 = max(x0, bx), max(y0, by)
    px1, py1 = min(x1, bx + scaled.shape[1]), min(y1, by + scaled.shape[0])
    if px1 > px0 and py1 > py0:
        out[py0:py1, px0:px1] = scaled[py0 - by:py1 - by, px0 - bx:px1 - bx]
        if hsv is not None:  # the block just pasted: no pixel of another tile is coloured twice
            apply_hsv(out[py0:py1, px0:px1], hsv)
