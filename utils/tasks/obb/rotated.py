"""Rotated boxes: xywhr <-> corners, the exact IoU of two rotated boxes (the area of their intersection polygon),
the probabilistic IoU (ProbIoU), and rotated NMS.

A rotated box is ``xywhr``: centre x, y, width, height and the angle ``r`` in radians by which the box's width axis
is turned from the image's x axis (y down, so a positive angle turns clockwise on screen). Its four corners run
(+w/2, +h/2), (-w/2, +h/2), (-w/2, -h/2), (+w/2, -h/2) in the box's frame. The canonical form (``regularize``) has
``r`` in [0, pi/2), turning the box by a quarter (width and height swapped) where needed, as oriented labels are
kept (an angle of 90 degrees or more is the same rectangle at r - pi/2).

The exact IoU clips nothing: the intersection of two convex quadrilaterals is the convex polygon of the corners of
each inside the other and the crossings of their edges; its vertices, ordered by angle about their mean, give the
area by the shoelace formula, all batched (no loop over pairs). ProbIoU (Llerena et al., 2021) treats each box as
a 2-D Gaussian (covariance of a uniform rectangle: w^2/12, h^2/12, turned by r) and is 1 minus their Hellinger
distance (from the Bhattacharyya distance): smooth everywhere, so losses use it; NMS may use either.
"""

from __future__ import annotations

import math

import torch

PAIR_CHUNK = 1 << 16  # pairs whose exact intersection is computed at once (24 candidate points each)


def regularize(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 5) xywhr -> the same rectangles with r in [0, pi/2) (width and height swapped for a quarter turn)."""
    x, y, w, h, r = boxes.unbind(-1)
    quarter = torch.floor(r / (math.pi / 2))
    odd = torch.remainder(quarter, 2) == 1
    r = r - quarter * (math.pi / 2)
    r = torch.where(r >= math.pi / 2, r - math.pi / 2, r)  # rounding at the top of the range
    return torch.stack((x, y, torch.where(odd, h, w), torch.where(odd, w, h), r), -1)


def xywhr2corners(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 5) xywhr -> (..., 4, 2) corners in the order of the module docstring (a positive shoelace sum)."""
    x, y, w, h, r = boxes.unbind(-1)
    cos, sin = torch.cos(r), torch.sin(r)
    half_w = torch.stack((w / 2 * cos, w / 2 * sin), -1)  # the width axis, half length
    half_h = torch.stack((-h / 2 * sin, h / 2 * cos), -1)  # the height axis, half length
    centre = torch.stack((x, y), -1)
    return torch.stack((centre + half_w + half_h, centre - half_w + half_h, centre - half_w - half_h,
                        centre + half_w - half_h), -2)


def corners2xywhr(corners: torch.Tensor) -> torch.Tensor:
    """(..., 4, 2) corners of any quadrilateral -> (..., 5) its minimum-area enclosing rectangle, regularized.

    The smallest enclosing rectangle has a side along an edge of the points' convex hull; every hull edge joins two
    of the four points, so the six directions between them are the candidates (exact for rectangles; a DOTA
    quadrilateral gets its tightest rectangle)."""
    pairs = [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2), (1, 3)]
    best_area, best = None, None
    points = corners.to(torch.float64) if corners.dtype != torch.float64 else corners
    for i, j in pairs:
        edge = points[..., j, :] - points[..., i, :]
        angle = torch.atan2(edge[..., 1], edge[..., 0])
        cos, sin = torch.cos(angle).unsqueeze(-1), torch.sin(angle).unsqueeze(-1)
        along = points[..., 0] * cos + points[..., 1] * sin  # (..., 4): coordinates on the edge's axis
        across = -points[..., 0] * sin + points[..., 1] * cos
        lo_u, hi_u, lo_v, hi_v = along.amin(-1), along.amax(-1), across.amin(-1), across.amax(-1)
        w, h = hi_u - lo_u, hi_v - lo_v
        u, v = (lo_u + hi_u) / 2, (lo_v + hi_v) / 2
        c, s = cos.squeeze(-1), sin.squeeze(-1)
        box = torch.stack((u * c - v * s, u * s + v * c, w, h, angle), -1)
        area = w * h
        if best is None:
            best_area, best = area, box
        else:
            smaller = (area < best_area - 1e-9 * best_area.abs().clamp(min=1)).unsqueeze(-1)
            best = torch.where(smaller, box, best)
            best_area = torch.minimum(area, best_area)
    return regularize(best).to(corners.dtype)


def polygon_area(points: torch.Tensor) -> torch.Tensor:
    """(..., k, 2) vertices in order -> (...,) the absolute area (shoelace)."""
    x, y = points[..., 0], points[..., 1]
    return 0.5 * (x * y.roll(-1, -1) - y * x.roll(-1, -1)).sum(-1).abs()


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points: torch.Tensor, polygon: torch.Tensor, eps: float) -> torch.Tensor:
    """(k, p, 2) points, (k, 4, 2) convex polygons of positive shoelace sum -> (k, p): inside or on the boundary."""
    edges = polygon.roll(-1, 1) - polygon  # (k, 4, 2)
    rel = points.unsqueeze(2) - polygon.unsqueeze(1)  # (k, p, 4, 2)
    side = _cross(edges.unsqueeze(1), rel)  # (k, p, 4)
    scale = edges.norm(dim=-1).unsqueeze(1).clamp(min=1e-12)
    return (side >= -eps * scale).all(-1)


def _crossings(a: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Edge crossings of (k, 4, 2) polygons ``a`` and ``b``: points (k, 16, 2) and which exist (k, 16)."""
    p, r = a.unsqueeze(2), (a.roll(-1, 1) - a).unsqueeze(2)  # (k, 4, 1, 2): a's edges
    q, s = b.unsqueeze(1), (b.roll(-1, 1) - b).unsqueeze(1)  # (k, 1, 4, 2): b's edges
    denom = _cross(r, s)  # (k, 4, 4)
    qp = q - p
    parallel = denom.abs() <= 1e-12
    safe = torch.where(parallel, torch.ones_like(denom), denom)
    t, u = _cross(qp, s) / safe, _cross(qp, r) / safe
    valid = ~parallel & (t >= -eps) & (t <= 1 + eps) & (u >= -eps) & (u <= 1 + eps)
    points = p + t.unsqueeze(-1) * r
    return points.flatten(1, 2), valid.flatten(1)


def intersection_area(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """(k, 4, 2) and (k, 4, 2) convex quadrilaterals of positive shoelace sum -> (k,) the areas of their
    intersections."""
    crossings, crossed = _crossings(a, b, eps)
    candidates = torch.cat((a, b, crossings), 1)  # (k, 24, 2)
    valid = torch.cat((_inside(a, b, eps), _inside(b, a, eps), crossed), 1)  # (k, 24)
    count = valid.sum(1)
    weights = valid.to(a.dtype)
    centre = (candidates * weights.unsqueeze(-1)).sum(1) / count.clamp(min=1).unsqueeze(-1)
    rel = candidates - centre.unsqueeze(1)
    angle = torch.where(valid, torch.atan2(rel[..., 1], rel[..., 0]), torch.full_like(rel[..., 0], 10.0))
    order = angle.argsort(1)
    ordered = candidates.gather(1, order.unsqueeze(-1).expand(-1, -1, 2))
    kept = valid.gather(1, order)
    first = ordered[:, :1].expand_as(ordered)
    ordered = torch.where(kept.unsqueeze(-1), ordered, first)  # missing points repeat the first: zero area
    return torch.where(count >= 3, polygon_area(ordered), torch.zeros_like(count, dtype=a.dtype))


def _ccw(corners: torch.Tensor) -> torch.Tensor:
    """Corners ordered to a positive shoelace sum (reversed where it is negative)."""
    x, y = corners[..., 0], corners[..., 1]
    signed = (x * y.roll(-1, -1) - y * x.roll(-1, -1)).sum(-1)
    return torch.where((signed < 0).unsqueeze(-1).unsqueeze(-1), corners.flip(-2), corners)


def rotated_iou_pairs(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """(k, 5) and (k, 5) xywhr -> (k,) the exact IoU of each pair (float64 inside for small, distant boxes too)."""
    dtype = boxes1.dtype
    b1, b2 = boxes1.to(torch.float64), boxes2.to(torch.float64)
    out = torch.empty(b1.shape[0], dtype=torch.float64, device=b1.device)
    for start in range(0, b1.shape[0], PAIR_CHUNK):
        c1 = _ccw(xywhr2corners(b1[start:start + PAIR_CHUNK]))
        c2 = _ccw(xywhr2corners(b2[start:start + PAIR_CHUNK]))
        inter = intersection_area(c1, c2)
        area1 = b1[start:start + PAIR_CHUNK, 2] * b1[start:start + PAIR_CHUNK, 3]
        area2 = b2[start:start + PAIR_CHUNK, 2] * b2[start:start + PAIR_CHUNK, 3]
        out[start:start + PAIR_CHUNK] = inter / (area1 + area2 - inter).clamp(min=eps)
    return out.to(dtype if dtype.is_floating_point else torch.float32)


def rotated_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """(n, 5) and (m, 5) xywhr -> (n, m) the exact IoU matrix; only pairs whose circumscribed circles meet are
    intersected (the others are 0)."""
    n, m = boxes1.shape[0], boxes2.shape[0]
    out = torch.zeros((n, m), dtype=boxes1.dtype if boxes1.is_floating_point() else torch.float32,
                      device=boxes1.device)
    if n == 0 or m == 0:
        return out
    radius1 = boxes1[:, 2:4].norm(dim=1) / 2
    radius2 = boxes2[:, 2:4].norm(dim=1) / 2
    near = torch.cdist(boxes1[:, :2].double(), boxes2[:, :2].double()) <= (radius1[:, None] + radius2[None, :]).double()
    i, j = near.nonzero(as_tuple=True)
    if i.numel():
        out[i, j] = rotated_iou_pairs(boxes1[i], boxes2[j]).to(out.dtype)
    return out


def _covariance(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(..., 5) xywhr -> the Gaussian's covariance entries (a, b, c): [[a, c], [c, b]]."""
    var_w, var_h = boxes[..., 2].pow(2) / 12, boxes[..., 3].pow(2) / 12
    cos, sin = torch.cos(boxes[..., 4]), torch.sin(boxes[..., 4])
    cos2, sin2 = cos.pow(2), sin.pow(2)
    return var_w * cos2 + var_h * sin2, var_w * sin2 + var_h * cos2, (var_w - var_h) * cos * sin


def probiou(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """ProbIoU of boxes that broadcast against each other ((..., 5) xywhr each) -> (...): 1 - the Hellinger
    distance of their Gaussians (see the module docstring); 1 for equal boxes, towards 0 far apart."""
    a1, b1, c1 = _covariance(boxes1)
    a2, b2, c2 = _covariance(boxes2)
    a, b, c = a1 + a2, b1 + b2, c1 + c2
    dx, dy = boxes1[..., 0] - boxes2[..., 0], boxes1[..., 1] - boxes2[..., 1]
    det = a * b - c.pow(2)
    mahalanobis = (a * dy.pow(2) + b * dx.pow(2) - 2 * c * dx * dy) / (det + eps) * 0.125
    det1 = (a1 * b1 - c1.pow(2)).clamp(min=0)
    det2 = (a2 * b2 - c2.pow(2)).clamp(min=0)
    spread = 0.5 * torch.log(det / (4 * torch.sqrt(det1 * det2) + eps) + eps)
    bhattacharyya = (mahalanobis + spread).clamp(eps, 100.0)
    return 1 - torch.sqrt(1 - torch.exp(-bhattacharyya) + eps)


def probiou_matrix(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """(n, 5) and (m, 5) -> (n, m) ProbIoU."""
    return probiou(boxes1.unsqueeze(1), boxes2.unsqueeze(0))


IOU_KINDS = {"polygon": rotated_iou, "probiou": probiou_matrix}


NMS_BLOCK = 1024  # rows of the overlap matrix NMS computes at once (memory: NMS_BLOCK x candidates)


def nms_rotated(boxes: torch.Tensor, scores: torch.Tensor, iou_thres: float, kind: str = "probiou") -> torch.Tensor:
    """Indices of the boxes (n, 5) xywhr that greedy NMS keeps, best first: each kept box suppresses the
    lower-scored ones it overlaps by more than ``iou_thres`` (``kind``: "probiou", as ultralytics suppresses, or the
    exact "polygon" IoU). The overlaps are computed a block of rows at a time, so memory stays linear in n."""
    if kind not in IOU_KINDS:
        raise ValueError(f"rotated IoU kind must be one of {', '.join(IOU_KINDS)}, got {kind!r}")
    order = scores.argsort(descending=True, stable=True)
    ordered, n = boxes[order], order.numel()
    keep = torch.ones(n, dtype=torch.bool)
    for start in range(0, n, NMS_BLOCK):
        end = min(start + NMS_BLOCK, n)
        alive = keep[start:end].nonzero().flatten()  # rows suppressed by an earlier block suppress nothing
        if not len(alive):
            continue
        overlaps = (IOU_KINDS[kind](ordered[start + alive], ordered[start:]) > iou_thres).cpu()  # (a, n - start)
        for row, i in zip(overlaps, alive.tolist()):  # exact greedy: only kept boxes suppress
            if keep[start + i]:
                keep[start + i + 1:] &= ~row[i + 1:]
    return order[keep.to(order.device)]


def rotated_non_max_suppression(prediction: torch.Tensor, conf_thres: float = 0.25, iou_thres: float = 0.45,
                                classes: list[int] | None = None, agnostic: bool = False,
                                multi_label: bool = False, max_det: int = 300, max_nms: int = 30000,
                                kind: str = "probiou", max_wh: float = 7680.0) -> list[torch.Tensor]:
    """An anchor-free OBB head's rows (b, n, 4 + nc + 1) [x, y, w, h, class scores, angle] -> per image (k, 7)
    [x, y, w, h, angle, conf, cls], best first: boxes above ``conf_thres`` (every class above it with
    ``multi_label``, else the best), of ``classes``, suppressed per class (all together with ``agnostic``) by
    ``nms_rotated``; at most ``max_nms`` candidates enter and ``max_det`` leave."""
    nc = prediction.shape[-1] - 5
    out = []
    for rows in prediction:
        boxes = torch.cat((rows[:, :4], rows[:, -1:]), 1)
        scores = rows[:, 4:4 + nc]
        if multi_label:
            index, cls = (scores > conf_thres).nonzero(as_tuple=True)
            conf = scores[index, cls]
        else:
            conf, cls = scores.max(1)
            index = (conf > conf_thres).nonzero(as_tuple=True)[0]
            conf, cls = conf[index], cls[index]
        det = torch.cat((boxes[index], conf[:, None], cls[:, None].to(boxes.dtype)), 1)
        if classes is not None:
            det = det[(det[:, 6:7] == torch.tensor(classes, device=det.device, dtype=det.dtype)).any(1)]
        det = det[det[:, 5].argsort(descending=True, stable=True)[:max_nms]]
        shifted = det[:, :5].clone()
        if not agnostic:
            shifted[:, :2] += det[:, 6:7] * max_wh  # classes apart: boxes of different classes never overlap
        keep = nms_rotated(shifted, det[:, 5], iou_thres, kind)[:max_det]
        out.append(det[keep])
    return out
