"""Outlines that follow the pixels: the segment task's Geometry (``OutlineGeometry``), which the one sample pipeline
(utils/data/datasets.py, utils/data/augment.py) moves with the boxes at every geometric step.

Each function takes outlines where the box code takes boxes and moves them the same way: letterbox scale and
padding, mosaic placement and the canvas clip, the affine/perspective matrix (the same random draws), flips,
mixup, and copy-paste (which only outlines make possible). Outlines are resampled to a fixed number of points
first (RESAMPLE_POINTS, the reference's 1000; the original vertices are kept), so a sample's outlines are one
(k, n, 2) array that one matrix product moves. Boxes of warped outlines are the extent of the part inside the
image, clipped exactly (a polygon against the image rectangle, Sutherland-Hodgman), so they are tighter than the
box of warped corners under rotation and equal to it without. Arrays are float32 pixels unless a name says
``normalized``.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from utils.data.augment import (
    Geometry,
    TilePlace,
    _perspective_matrix,
    box_candidates,
    mosaic_layout,
    random_perspective_extras,
    warp_mosaic_extras,
)
from utils.tasks.segment.masks import fill_polygon

RESAMPLE_POINTS = 1000  # points per outline while augmenting (the reference's count)
SEGMENT_AREA_THRESHOLD = 0.01  # an object is dropped when under 1% of its area is left (boxes alone: 10%)
COPY_PASTE_MAX_COVER = 0.30  # a pasted copy may cover at most 30% of any existing object's box


# ------------------------------------------------------------------------------------------ point counts
def resample_polygon(points: np.ndarray, n: int = RESAMPLE_POINTS) -> np.ndarray:
    """A closed polygon (m, 2) -> (n, 2) float32 along the same edges: with m < n every vertex is kept and the
    other points are spread over the edges by vertex index (the reference's rule); with m >= n, n points spread
    over the outline by vertex index. An empty polygon gives n zeros (a degenerate outline, filling nothing)."""
    points = np.asarray(points, np.float64).reshape(-1, 2)
    if not len(points):
        return np.zeros((n, 2), np.float32)
    closed = np.concatenate((points, points[:1]))
    m = len(points)
    if m < n:
        extra = np.linspace(0, m, n - m, endpoint=False)  # positions along the vertex index, between vertices
        x = np.sort(np.concatenate((np.arange(m, dtype=np.float64), extra)), kind="stable")
    else:
        x = np.linspace(0, m, n, endpoint=False)
    index = np.arange(m + 1)
    return np.stack([np.interp(x, index, closed[:, 0]), np.interp(x, index, closed[:, 1])], 1).astype(np.float32)


def resample_polygons(polygons: Sequence[np.ndarray], n: int = RESAMPLE_POINTS) -> np.ndarray:
    """``resample_polygon`` of each outline -> one (k, n, 2) float32 array."""
    if not len(polygons):
        return np.zeros((0, n, 2), np.float32)
    return np.stack([resample_polygon(p, n) for p in polygons])


# ------------------------------------------------------------------------------------------ clipping, boxes
def clip_polygon(points: np.ndarray, width: float, height: float) -> np.ndarray:
    """The part of a polygon (n, 2) inside [0, width] x [0, height], exactly (Sutherland-Hodgman against the four
    sides); (0, 2) when nothing is inside. Vertices may repeat; the filled area is the intersection's."""
    p = np.asarray(points, np.float64).reshape(-1, 2)
    for axis, limit, keep_low in ((0, 0.0, False), (0, float(width), True), (1, 0.0, False),
                                  (1, float(height), True)):
        if not len(p):
            break
        inside = p[:, axis] <= limit if keep_low else p[:, axis] >= limit
        if inside.all():
            continue
        q, q_inside = np.concatenate((p[1:], p[:1])), np.concatenate((inside[1:], inside[:1]))
        crossing = inside != q_inside
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(crossing, (limit - p[:, axis]) / (q[:, axis] - p[:, axis]), 0.0)
        cut = p + t[:, None] * (q - p)
        cut[:, axis] = limit
        p = np.stack((p, cut), 1)[np.stack((inside, crossing), 1)]
    return p


def clip_polygons(polygons: np.ndarray, width: float, height: float, n: int | None = None) -> np.ndarray:
    """Each of (k, m, 2) outlines clipped to the image (``clip_polygon``) and resampled to ``n`` points (default
    m) -> (k, n, 2) float32; an outline wholly outside becomes n zeros. Outlines inside need no clipping."""
    n = polygons.shape[1] if n is None else n
    out = np.empty((len(polygons), n, 2), np.float32)
    inside = ((polygons >= 0) & (polygons <= (width, height))).all((1, 2))
    for i, polygon in enumerate(polygons):
        out[i] = polygon if inside[i] and n == polygons.shape[1] else resample_polygon(
            clip_polygon(polygon, width, height), n)
    return out


def polygon_boxes(polygons: np.ndarray) -> np.ndarray:
    """(k, 4) x1, y1, x2, y2: the extent of each (clipped) outline (k, n, 2)."""
    if not len(polygons):
        return np.zeros((0, 4), np.float32)
    return np.concatenate((polygons.min(1), polygons.max(1)), 1).astype(np.float32)


# ------------------------------------------------------------------------------------------ moving outlines
def to_pixels(polygons_normalized: np.ndarray, width: float, height: float, pad_x: float = 0.0,
              pad_y: float = 0.0) -> np.ndarray:
    """Normalised outlines (k, n, 2) -> pixels of an image ``width`` x ``height`` placed at (pad_x, pad_y): what
    ``xywhn2xyxy`` does for boxes (letterbox: width = ratio_w * w, pads; mosaic: the tile's offset)."""
    return (polygons_normalized * np.array([width, height], np.float32) + np.array([pad_x, pad_y], np.float32)
            ).astype(np.float32)


def to_normalized(polygons: np.ndarray, width: float, height: float) -> np.ndarray:
    """Pixel outlines (k, n, 2) -> normalised to the image, clipped to [0, 1] (as the boxes are)."""
    return (polygons / np.array([width, height], np.float32)).clip(0, 1).astype(np.float32)


def warp_polygons(polygons: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Outlines (k, n, 2) moved by a 3x3 affine or perspective ``matrix`` (the one the image is warped by)."""
    if not polygons.size:
        return polygons.astype(np.float32)
    xy = np.concatenate((polygons.reshape(-1, 2), np.ones((polygons.shape[0] * polygons.shape[1], 1))), 1)
    xy = xy @ matrix.T
    projective = matrix[2, 0] != 0 or matrix[2, 1] != 0
    xy = xy[:, :2] / xy[:, 2:3] if projective else xy[:, :2]
    return xy.reshape(polygons.shape).astype(np.float32)


def warp_segments(labels: np.ndarray, polygons: np.ndarray, matrix: np.ndarray, scale: float,
                  out_shape: tuple[int, int], area_thr: float = SEGMENT_AREA_THRESHOLD
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``augment.warp_boxes`` for objects with outlines: labels (k, 5) [cls, x1, y1, x2, y2] and their outlines
    (k, n, 2) moved by ``matrix`` into an image of ``out_shape`` (h, w); each outline is clipped to the image and
    its box is the clipped outline's extent. Objects left with under ``area_thr`` of their area (1%: the
    reference's rule with outlines; boxes alone use 10%), or thinner than 2 px, are dropped."""
    if not len(labels):
        return labels, polygons
    height, width = out_shape
    warped = clip_polygons(warp_polygons(polygons, matrix), width, height)
    boxes = polygon_boxes(warped)
    keep = box_candidates(labels[:, 1:5].T * scale, boxes.T, area_thr=area_thr)
    out = labels[keep].astype(np.float32, copy=True)
    out[:, 1:5] = boxes[keep]
    return out, warped[keep]


def random_perspective_segments(img: np.ndarray, labels: np.ndarray, polygons: np.ndarray, rng: np.random.Generator,
                                degrees: float = 10, translate: float = 0.1, scale: float = 0.1, shear: float = 10,
                                perspective: float = 0.0, border: tuple[int, int] = (0, 0)
                                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``augment.random_perspective`` moving outlines too: the same random draws, the same image, and the labels'
    boxes from the warped outlines (``warp_segments``)."""
    return random_perspective_extras(img, labels, polygons, OUTLINES, rng, degrees, translate, scale, shear,
                                     perspective, border)


def mosaic_polygons(polygons: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]], places: Sequence[TilePlace],
                    size: int) -> np.ndarray:
    """``augment.mosaic_boxes`` for outlines: each tile's normalised outlines (k_i, n, 2) placed on the 2s x 2s
    canvas (in pixels) and clipped to it."""
    moved = [to_pixels(p, w, h, place.x1a - place.x1b, place.y1a - place.y1b)
             for p, (h, w), place in zip(polygons, sizes, places) if len(p)]
    if not moved:
        n = polygons[0].shape[1] if len(polygons) and polygons[0].ndim == 3 else RESAMPLE_POINTS
        return np.zeros((0, n, 2), np.float32)
    return clip_polygons(np.concatenate(moved), 2 * size, 2 * size)


def mosaic_geometry(sizes: Sequence[tuple[int, int]], size: int, rng: np.random.Generator, degrees: float = 10,
                    translate: float = 0.1, scale: float = 0.1, shear: float = 10,
                    perspective: float = 0.0) -> tuple[list[TilePlace], np.ndarray, float]:
    """The tiles' places, the canvas -> output matrix and its scale of a mosaic: the draws ``augment.warp_mosaic``
    makes, in its order, so the same generator state gives the same geometry."""
    places = mosaic_layout(sizes, size, rng)
    matrix, s = _perspective_matrix(rng, (2 * size, 2 * size), (size, size), degrees, translate, scale, shear,
                                    perspective)
    return places, matrix, s


def warp_mosaic_segments(images: Sequence[np.ndarray], labels: Sequence[np.ndarray],
                         polygons: Sequence[np.ndarray], size: int, rng: np.random.Generator,
                         sizes: Sequence[tuple[int, int]] | None = None, degrees: float = 10, translate: float = 0.1,
                         scale: float = 0.1, shear: float = 10, perspective: float = 0.0,
                         hsv: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``augment.warp_mosaic`` with outlines: the image is warp_mosaic's (the same draws from ``rng``), the
    tiles' normalised outlines (k_i, n, 2) are placed, clipped and warped by the same geometry, and the boxes come
    from the outlines. Returns (image, labels (k, 5) [cls, x1, y1, x2, y2], outlines (k, n, 2) pixels)."""
    return warp_mosaic_extras(images, labels, polygons, OUTLINES, size, rng, sizes, degrees, translate, scale, shear,
                              perspective, hsv)


def flip_polygons_lr(polygons_normalized: np.ndarray) -> np.ndarray:
    """Mirror normalised outlines left-right (with ``augment.flip_lr``)."""
    out = polygons_normalized.copy()
    out[..., 0] = 1 - out[..., 0]
    return out


def flip_polygons_ud(polygons_normalized: np.ndarray) -> np.ndarray:
    """Mirror normalised outlines up-down (with ``augment.flip_ud``)."""
    out = polygons_normalized.copy()
    out[..., 1] = 1 - out[..., 1]
    return out


def mixup_segments(polygons: np.ndarray, polygons2: np.ndarray) -> np.ndarray:
    """Outlines after ``augment.mixup``: both images' objects, in the order mixup concatenates the labels."""
    return np.concatenate((polygons, polygons2), 0)


def copy_paste(img: np.ndarray, labels: np.ndarray, polygons: np.ndarray, probability: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Copy-paste (Ghiasi et al., 2021, as the reference applies it to a mosaic canvas): about ``probability`` of
    the objects are mirrored left-right across the image and pasted there, pixels inside their outline, unless the
    copy would cover more than 30% of an existing object's box. ``labels`` (k, 5) [cls, x1, y1, x2, y2] pixels,
    outlines (k, n, 2) pixels; ``img`` is changed in place. Returns (img, labels, outlines) with the copies
    appended."""
    count = round(probability * len(polygons))
    if not count:
        return img, labels, polygons
    h, w = img.shape[:2]
    chosen = rng.choice(len(polygons), size=count, replace=False)
    new_labels, new_polygons = [labels], [polygons]
    stamp = np.zeros((h, w), np.uint8)
    for j in chosen:
        cls, x1, y1, x2, y2 = labels[j]
        box = np.array([w - x2, y1, w - x1, y2])
        existing = np.concatenate(new_labels)[:, 1:5]
        if (_cover(box, existing) < COPY_PASTE_MAX_COVER).all():
            mirrored = polygons[j].copy()
            mirrored[:, 0] = w - mirrored[:, 0]
            new_labels.append(np.array([[cls, *box]], np.float32))
            new_polygons.append(mirrored[None])
            fill_polygon(stamp, mirrored)
    inside = stamp.astype(bool)
    img[inside] = cv2.flip(img, 1)[inside]
    return img, np.concatenate(new_labels).astype(np.float32), np.concatenate(new_polygons).astype(np.float32)


def _cover(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """How much of each of ``boxes`` (m, 4) ``box`` (4,) covers: intersection over their own areas."""
    w = (np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0])).clip(0)
    h = (np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1])).clip(0)
    return w * h / ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) + 1e-7)


class OutlineGeometry(Geometry):
    """Outlines (k, n, 2) moved with their boxes (utils.data.augment.Geometry): placed, put on a mosaic's canvas
    and clipped, warped (each box the clipped outline's extent), normalised, mirrored, joined by mixup, and pasted
    by copy-paste (hyp ``copy_paste``) after a mosaic."""

    def place(self, extras: np.ndarray, width: float, height: float, pad_x: float = 0.0,
              pad_y: float = 0.0) -> np.ndarray:
        return to_pixels(extras, width, height, pad_x, pad_y)

    def mosaic(self, extras: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]], places: Sequence[TilePlace],
               size: int) -> np.ndarray:
        return mosaic_polygons(extras, sizes, places, size)

    def warp(self, labels: np.ndarray, extras: np.ndarray, matrix: np.ndarray, scale: float,
             out_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        return warp_segments(labels, extras, matrix, scale, out_shape)

    def normalize(self, extras: np.ndarray, width: float, height: float) -> np.ndarray:
        return to_normalized(extras, width, height)

    def flip_lr(self, extras: np.ndarray) -> np.ndarray:
        return flip_polygons_lr(extras)

    def flip_ud(self, extras: np.ndarray) -> np.ndarray:
        return flip_polygons_ud(extras)

    def join(self, extras: np.ndarray, other: np.ndarray) -> np.ndarray:
        return mixup_segments(extras, other)

    def paste(self, img: np.ndarray, labels: np.ndarray, extras: np.ndarray, hyp: dict,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if hyp.get("copy_paste", 0) > 0:
            return copy_paste(img, labels, extras, hyp["copy_paste"], rng)
        return img, labels, extras


OUTLINES = OutlineGeometry()
