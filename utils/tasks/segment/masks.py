"""Instance masks: polygons <-> masks, the overlap index image, mask IoU, cropping to boxes, prototype masks to
instance masks, and COCO run-length encoding.

Coordinates: pixel ``(row i, column j)`` covers ``[j, j + 1) x [i, i + 1)``, as boxes do, so its centre is
``(j + 0.5, i + 0.5)``. A polygon's mask holds the pixels whose centre lies inside it (an exact scanline fill,
``fill_polygon``). A mask ``downsample`` times smaller has pixels ``downsample``
wide: the same rule at its own resolution (the reference fills at full size, then resizes bilinearly; both take the
pixels around the same sample points). Polygons are float arrays (n, 2) of x, y in pixels unless a name says
``normalized``.

COCO RLE (``{"size": [h, w], "counts": ...}``, runs in column-major order) is read and written here, in
numpy, so no extra package is needed at run time; what a file holds is checked before a mask is allocated (the
runs must fill exactly the image's h x w pixels). The tests hold it to pycocotools' own encoder and decoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F


# ------------------------------------------------------------------------------------------ polygons -> masks
def polygon_area(polygon: np.ndarray) -> float:
    """The area enclosed by a polygon (n, 2) (shoelace formula; 0 for fewer than 3 points)."""
    p = np.asarray(polygon, dtype=np.float64).reshape(-1, 2)
    if len(p) < 3:
        return 0.0
    x, y = p[:, 0], p[:, 1]
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2)


def fill_polygon(mask: np.ndarray, polygon: np.ndarray, value: int = 1, downsample: float = 1) -> np.ndarray:
    """Set ``mask``'s pixels whose centre lies inside ``polygon`` (even-odd rule) to ``value``, in place; returns
    ``mask``. The polygon is in the pixels of the full image and the mask ``downsample`` times smaller. Fewer than
    3 points, or a non-finite one, fill nothing. (``scanline_pixels`` says how.)"""
    height, width = mask.shape[:2]
    pixels = scanline_pixels([polygon], (height, width), downsample)
    mask.reshape(height * width, *mask.shape[2:])[pixels] = value
    return mask


def polygons_to_masks(polygons: Sequence[np.ndarray], shape_hw: tuple[int, int],
                      downsample: int = 1) -> np.ndarray:
    """(k, h // downsample, w // downsample) uint8 0/1 masks of polygons in the pixels of an image of ``shape_hw``."""
    h, w = shape_hw[0] // downsample, shape_hw[1] // downsample
    masks = np.zeros((len(polygons), h, w), np.uint8)
    masks.reshape(-1)[scanline_pixels(polygons, (h, w), downsample)] = 1
    return masks


def scanline_pixels(polygons: Sequence[np.ndarray], shape_hw: tuple[int, int], downsample: float = 1) -> np.ndarray:
    """Flat indices into (k, h, w) masks of the pixels whose centre lies inside each of k polygons (even-odd rule).

    All polygons at once: each edge crosses the rows whose centre lies in its half-open y range [y_low, y_high),
    a polygon's crossings of a row are paired left to right, and a pair covers the pixels whose centre x is in
    [x_a, x_b). So a pixel centre on a left or top edge is inside, on a right or bottom edge outside, and adjacent
    polygons share no pixel. Cost: the points, the crossings and the pixels filled (not the masks' size).
    """
    height, width = shape_hw
    parts = [np.asarray(p, dtype=np.float64).reshape(-1, 2) / downsample for p in polygons]
    usable = [i for i, p in enumerate(parts) if len(p) >= 3 and np.isfinite(p).all()]
    if not usable:
        return np.zeros(0, np.int64)
    sizes = np.array([len(parts[i]) for i in usable])
    points = np.concatenate([parts[i] for i in usable])
    owner = np.repeat(np.array(usable), sizes)
    following = np.arange(1, len(points) + 1)  # each point's edge goes to the next point of its polygon
    following[np.cumsum(sizes) - 1] = np.cumsum(sizes) - sizes
    x0, y0, x1, y1 = points[:, 0], points[:, 1], points[following, 0], points[following, 1]
    first = np.clip(np.ceil(np.minimum(y0, y1) - 0.5), 0, height).astype(np.int64)  # first row centre >= y_low
    counts = np.clip(np.ceil(np.maximum(y0, y1) - 0.5), 0, height).astype(np.int64) - first  # centres < y_high
    edge = np.flatnonzero(counts > 0)
    if not len(edge):
        return np.zeros(0, np.int64)
    counts = counts[edge]
    edge_of = np.repeat(edge, counts)
    rows = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + first[edge_of]
    xs = x0[edge_of] + (rows + 0.5 - y0[edge_of]) / (y1[edge_of] - y0[edge_of]) * (x1[edge_of] - x0[edge_of])
    order = np.lexsort((xs, rows, owner[edge_of]))
    owners, rows, xs = owner[edge_of][order][0::2], rows[order][0::2], xs[order].reshape(-1, 2)  # pairs
    cols = np.clip(np.ceil(xs - 0.5), 0, width).astype(np.int64)  # first pixel centre >= x_a, and >= x_b
    lengths = cols[:, 1] - cols[:, 0]
    starts = (owners * height + rows) * width + cols[:, 0]
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(lengths.sum())


def normalized_to_pixels(polygons: Sequence[np.ndarray], width: float, height: float) -> list[np.ndarray]:
    """Polygons normalised to [0, 1] -> pixels of a ``width`` x ``height`` image (float64 copies)."""
    return [np.asarray(p, dtype=np.float64).reshape(-1, 2) * (width, height) for p in polygons]


def overlap_index(polygons: Sequence[np.ndarray], shape_hw: tuple[int, int],
                  downsample: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """All instances in one index image (h', w'): pixel value ``r + 1`` where instance ``order[r]`` is, 0 elsewhere.

    Instances are ranked by mask area, largest first, and each is drawn over the ones before it, so where two
    overlap the smaller one is on top (the reference's rule). ``order`` (k,) lets the caller put its labels in the
    same order (label ``r`` is then the pixels equal to ``r + 1``). uint8 up to 255 instances, else int32.
    """
    masks = polygons_to_masks(polygons, shape_hw, downsample)
    areas = masks.reshape(len(masks), -1).sum(1) if len(masks) else np.zeros(0, np.int64)  # an image of none
    order = np.argsort(-areas, kind="stable")
    index = np.zeros(masks.shape[1:], np.uint8 if len(masks) <= 255 else np.int32)
    for rank, i in enumerate(order):
        index[masks[i] > 0] = rank + 1
    return index, order


def index_to_masks(index: torch.Tensor | np.ndarray, count: int) -> torch.Tensor:
    """An overlap index image (h, w) -> (count, h, w) float 0/1 masks (instance r is where the index is r + 1)."""
    index = torch.as_tensor(index)
    values = torch.arange(1, count + 1, device=index.device).view(-1, 1, 1)
    return (index[None].long() == values).float()


# ------------------------------------------------------------------------------------------ masks -> polygons
def mask_outlines(mask: np.ndarray) -> list[np.ndarray]:
    """The outline of each part of a mask (its external contours, holes ignored), as polygons (n, 2) float32 in
    the mask's pixels.

    Outlines are traced on the mask enlarged 2x, so they run a quarter pixel inside the parts' pixel edges: every
    pixel of a part has its centre inside its polygon and every other pixel outside, so ``fill_polygon`` gives the
    part back exactly when it has no holes and no pixel joined to the rest only by a corner."""
    mask = np.ascontiguousarray(mask, dtype=np.uint8)
    if not mask.any():
        return []
    doubled = cv2.resize(mask, (mask.shape[1] * 2, mask.shape[0] * 2), interpolation=cv2.INTER_NEAREST)
    contours, _ = cv2.findContours(doubled, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    return [(c.reshape(-1, 2).astype(np.float32) + 0.5) / 2 for c in contours]


def mask_to_polygon(mask: np.ndarray) -> np.ndarray:
    """The outline (``mask_outlines``) of a mask's largest part (by area; ties: more points), (n, 2) float32 in the
    mask's pixels; (0, 2) for an empty mask."""
    outlines = mask_outlines(mask)
    if not outlines:
        return np.zeros((0, 2), np.float32)
    return max(outlines, key=lambda c: (polygon_area(c), len(c)))


def masks_to_polygons(masks: np.ndarray | torch.Tensor, normalize: bool = False) -> list[np.ndarray]:
    """``mask_to_polygon`` of each of (k, h, w) masks; normalised to [0, 1] by the mask size with ``normalize``."""
    array = masks.detach().cpu().numpy() if isinstance(masks, torch.Tensor) else np.asarray(masks)
    h, w = array.shape[-2:]
    polygons = [mask_to_polygon(m > 0) for m in array.reshape(-1, h, w)]
    return [p / np.array([w, h], np.float32) for p in polygons] if normalize else polygons


# ------------------------------------------------------------------------------------------ torch mask ops
def mask_iou(masks1: torch.Tensor, masks2: torch.Tensor) -> torch.Tensor:
    """IoU of every pair of masks: (..., n, h, w) and (..., m, h, w) -> (..., n, m), batched over the leading
    dimensions (one matrix product per batch). Masks are 0/1 (bool or float); two empty masks have IoU 0."""
    a, b = masks1.flatten(-2).float(), masks2.flatten(-2).float()
    inter = a @ b.transpose(-1, -2)
    union = a.sum(-1)[..., :, None] + b.sum(-1)[..., None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1), torch.zeros_like(inter))


def box_window(boxes: torch.Tensor, shape_hw: tuple[int, int]) -> torch.Tensor:
    """(n, h, w) bool: the pixels whose centre lies inside each box (n, 4) x1, y1, x2, y2 (in the mask's pixels)."""
    h, w = shape_hw
    x1, y1, x2, y2 = boxes[:, :, None, None].unbind(1)  # each (n, 1, 1)
    cols = torch.arange(w, device=boxes.device, dtype=boxes.dtype).view(1, 1, w) + 0.5
    rows = torch.arange(h, device=boxes.device, dtype=boxes.dtype).view(1, h, 1) + 0.5
    return (cols >= x1) & (cols < x2) & (rows >= y1) & (rows < y2)


def crop_masks(masks: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """``masks`` (n, h, w) set to 0 outside their boxes (n, 4) x1, y1, x2, y2 in the mask's pixels (a pixel stays
    when its centre is inside the box)."""
    return masks * box_window(boxes.to(masks.dtype if masks.is_floating_point() else torch.float32),
                              masks.shape[-2:])


def prototype_masks(protos: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """Mask logits (n, h, w) of n instances: their coefficients (n, nm) times the prototypes (nm, h, w)."""
    nm, h, w = protos.shape
    return (coefficients @ protos.reshape(nm, -1)).view(-1, h, w)


def process_masks(protos: torch.Tensor, coefficients: torch.Tensor, boxes: torch.Tensor, input_hw: tuple[int, int],
                  upsample: bool = True, native: bool = False) -> torch.Tensor:
    """Instance masks (n, H, W) bool of detections: sigmoid(coefficients x prototypes) > 0.5 inside its box.

    ``boxes`` (n, 4) x1, y1, x2, y2 in the input's pixels (``input_hw`` (H, W)). By default the masks are cropped at
    the prototypes' resolution and, with ``upsample``, resized bilinearly to the input; ``native`` (detect.py
    --retina-masks) resizes first and crops at the input's resolution (sharper edges, more memory)."""
    nm, h, w = protos.shape
    if not len(coefficients):
        shape = input_hw if upsample or native else (h, w)
        return torch.zeros((0, *shape), dtype=torch.bool, device=protos.device)
    probs = prototype_masks(protos, coefficients.to(protos.dtype)).sigmoid()
    if native:
        probs = F.interpolate(probs[None], size=input_hw, mode="bilinear", align_corners=False)[0]
        return crop_masks(probs, boxes) > 0.5
    scale = torch.tensor([w / input_hw[1], h / input_hw[0]] * 2, device=boxes.device, dtype=torch.float32)
    probs = crop_masks(probs, boxes.float() * scale)
    if upsample:
        probs = F.interpolate(probs[None], size=input_hw, mode="bilinear", align_corners=False)[0]
    return probs > 0.5


def scale_masks(masks: torch.Tensor, shape0_hw: tuple[int, int],
                ratio_pad: tuple[tuple[float, float], tuple[float, float]] | None = None) -> torch.Tensor:
    """Masks (n, H, W) of a letterboxed input -> (n, h0, w0) of the original image: the padding removed, then
    resized bilinearly and thresholded at 0.5. ``ratio_pad`` ((ratio_h, ratio_w), (pad_w, pad_h)) as the dataset
    reports it; computed from the shapes (centred letterbox) when None."""
    if not masks.shape[0]:
        return torch.zeros((0, *shape0_hw), dtype=torch.bool, device=masks.device)
    return unletterbox(masks.float(), shape0_hw, ratio_pad) > 0.5


def unletterbox(values: torch.Tensor, shape0_hw: tuple[int, int],
                ratio_pad: tuple[tuple[float, float], tuple[float, float]] | None = None) -> torch.Tensor:
    """Float maps (n, H, W) of a letterboxed input -> (n, h0, w0) of the original image: the padding removed, then
    resized bilinearly (``scale_masks`` without the threshold)."""
    n, height, width = values.shape
    h0, w0 = shape0_hw
    if ratio_pad is None:
        gain = min(height / h0, width / w0)
        pad_w, pad_h = (width - w0 * gain) / 2, (height - h0 * gain) / 2
        ratio_h = ratio_w = gain
    else:
        (ratio_h, ratio_w), (pad_w, pad_h) = ratio_pad
    top, left = int(round(pad_h - 0.1)), int(round(pad_w - 0.1))
    bottom, right = int(round(top + h0 * ratio_h)), int(round(left + w0 * ratio_w))
    inner = values[:, top:min(bottom, height), left:min(right, width)]
    return F.interpolate(inner[None], size=(h0, w0), mode="bilinear", align_corners=False)[0]


def process_masks_original(protos: torch.Tensor, coefficients: torch.Tensor, boxes0: torch.Tensor,
                           input_hw: tuple[int, int], shape0_hw: tuple[int, int],
                           ratio_pad: tuple[tuple[float, float], tuple[float, float]] | None = None) -> torch.Tensor:
    """Instance masks (n, h0, w0) bool at the original image's resolution (detect.py --retina-masks): the mask
    probabilities resized to the letterboxed input, the padding removed, resized to the original image, then
    cropped to the boxes ``boxes0`` (n, 4) x1, y1, x2, y2 in original pixels and thresholded at 0.5."""
    if not len(coefficients):
        return torch.zeros((0, *shape0_hw), dtype=torch.bool, device=protos.device)
    probs = prototype_masks(protos, coefficients.to(protos.dtype)).sigmoid().float()
    probs = F.interpolate(probs[None], size=input_hw, mode="bilinear", align_corners=False)[0]
    return crop_masks(unletterbox(probs, shape0_hw, ratio_pad), boxes0.float()) > 0.5


# ------------------------------------------------------------------------------------------ COCO RLE
def rle_encode(masks: np.ndarray | torch.Tensor) -> list[dict]:
    """COCO RLEs of (k, h, w) masks (nonzero = inside): ``{"size": [h, w], "counts": str}`` each, JSON-ready, the
    same strings pycocotools' ``mask.encode`` writes."""
    array = masks.detach().cpu().numpy() if isinstance(masks, torch.Tensor) else np.asarray(masks)
    array = array.reshape(-1, *array.shape[-2:]) > 0
    return [{"size": [int(array.shape[1]), int(array.shape[2])], "counts": _counts_string(_runs(m))} for m in array]


def _runs(mask: np.ndarray) -> list[int]:
    """Run lengths of a bool (h, w) mask in column-major order, starting with a run of zeros (maybe empty)."""
    flat = mask.T.ravel()
    edges = np.concatenate(([0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]))
    runs = np.diff(edges).tolist()
    return [0, *runs] if flat.size and flat[0] else runs


def _counts_string(runs: list[int]) -> str:
    """COCO's compressed counts: each run less the run two before it (from the fourth on), written 5 bits a
    character (ASCII 48 + value; bit 0x20: more characters follow), sign-extended from bit 0x10."""
    out = []
    for i, run in enumerate(runs):
        x = run - runs[i - 2] if i > 2 else run
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            out.append(chr((c | 0x20 if more else c) + 48))
    return "".join(out)


def _string_runs(text: str) -> list[int]:
    """The run lengths of a compressed counts string (the inverse of ``_counts_string``); ValueError when it is cut
    short or gives a negative run."""
    runs: list[int] = []
    x = shift = 0
    for ch in text:
        c = ord(ch) - 48
        x |= (c & 0x1F) << shift
        shift += 5
        if c & 0x20:
            continue
        if c & 0x10:
            x -= 1 << shift
        if len(runs) > 2:
            x += runs[-2]
        if x < 0:
            raise ValueError("RLE counts string gives a negative run")
        runs.append(x)
        x = shift = 0
    if shift:
        raise ValueError("RLE counts string ends inside a number")
    return runs


def rle_counts(rle: Any, shape_hw: tuple[int, int] | None = None) -> tuple[tuple[int, int], list[int]]:
    """((h, w), run lengths) of a COCO RLE (compressed ``counts`` string, or the uncompressed list), checked:
    ``size`` two positive ints (equal to ``shape_hw`` when given), runs non-negative and adding up to h * w.
    ValueError with the reason otherwise; nothing is allocated for the mask."""
    if not isinstance(rle, dict) or "size" not in rle or "counts" not in rle:
        raise ValueError("an RLE mask needs 'size' and 'counts'")
    size = rle["size"]
    if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                             and v > 0 for v in size)):
        raise ValueError(f"RLE size {str(size)[:40]} is not two positive integers")
    h, w = size
    if shape_hw is not None and (h, w) != tuple(shape_hw):
        raise ValueError(f"RLE size {h}x{w} differs from the image's {shape_hw[0]}x{shape_hw[1]}")
    counts = rle["counts"]
    if isinstance(counts, bytes):
        counts = counts.decode("ascii", "replace")
    if isinstance(counts, str):
        if len(counts) > 8 * (h * w + 1) or any(not 48 <= ord(c) < 112 for c in counts):
            raise ValueError("RLE counts string is too long or has characters outside COCO's alphabet")
        runs = _string_runs(counts)
    elif isinstance(counts, list):
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise ValueError("RLE counts must be non-negative integers")
        runs = counts
    else:
        raise ValueError(f"RLE counts must be a string or a list, got {type(counts).__name__}")
    if sum(runs) != h * w:
        raise ValueError(f"RLE counts add up to {sum(runs)}, not {h}x{w} = {h * w} pixels")
    return (h, w), runs


def rle_decode(rle: dict, shape_hw: tuple[int, int] | None = None) -> np.ndarray:
    """A COCO RLE -> (h, w) uint8 0/1 mask, after ``rle_counts`` checked it (ValueError with the reason)."""
    (h, w), runs = rle_counts(rle, shape_hw)
    values = np.arange(len(runs), dtype=np.uint8) % 2
    return np.ascontiguousarray(np.repeat(values, runs).reshape(w, h).T)


def rle_area(rle: dict) -> int:
    """The number of mask pixels of a COCO RLE (its odd runs; nothing decoded)."""
    return int(sum(rle_counts(rle)[1][1::2]))
