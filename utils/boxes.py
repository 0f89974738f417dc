"""Box formats, the IoU family, NMS and rescaling between letterboxed and original images.

Formats: ``xyxy`` corners, ``xywh`` centre + size; ``n`` suffix = normalised to [0, 1].
Functions accept torch tensors (and numpy arrays where noted) of shape (..., 4).
"""

from __future__ import annotations

import math

import numpy as np
import torch

Array = torch.Tensor | np.ndarray


def _clone(x: Array) -> Array:
    return x.clone() if isinstance(x, torch.Tensor) else np.copy(x)


def xywh2xyxy(x: Array) -> Array:
    y = _clone(x)
    y[..., 0] = x[..., 0] - x[..., 2] / 2
    y[..., 1] = x[..., 1] - x[..., 3] / 2
    y[..., 2] = x[..., 0] + x[..., 2] / 2
    y[..., 3] = x[..., 1] + x[..., 3] / 2
    return y


def xyxy2xywh(x: Array) -> Array:
    y = _clone(x)
    y[..., 0] = (x[..., 0] + x[..., 2]) / 2
    y[..., 1] = (x[..., 1] + x[..., 3]) / 2
    y[..., 2] = x[..., 2] - x[..., 0]
    y[..., 3] = x[..., 3] - x[..., 1]
    return y


def xywhn2xyxy(x: Array, w: float = 640, h: float = 640, pad_w: float = 0, pad_h: float = 0) -> Array:
    """Normalised centre boxes -> pixel corners, with an optional letterbox offset."""
    y = _clone(x)
    y[..., 0] = w * (x[..., 0] - x[..., 2] / 2) + pad_w
    y[..., 1] = h * (x[..., 1] - x[..., 3] / 2) + pad_h
    y[..., 2] = w * (x[..., 0] + x[..., 2] / 2) + pad_w
    y[..., 3] = h * (x[..., 1] + x[..., 3] / 2) + pad_h
    return y


def xyxy2xywhn(x: Array, w: float = 640, h: float = 640, clip: bool = False, eps: float = 0.0) -> Array:
    """Pixel corners -> normalised centre boxes (clipped to the image first when ``clip``)."""
    if clip:
        x = clip_boxes(_clone(x), (h - eps, w - eps))
    y = _clone(x)
    y[..., 0] = ((x[..., 0] + x[..., 2]) / 2) / w
    y[..., 1] = ((x[..., 1] + x[..., 3]) / 2) / h
    y[..., 2] = (x[..., 2] - x[..., 0]) / w
    y[..., 3] = (x[..., 3] - x[..., 1]) / h
    return y


def clip_boxes(boxes: Array, shape: tuple[int, int]) -> Array:
    """Clip xyxy boxes in place to an image of ``shape`` (h, w); returns them."""
    h, w = shape[:2]
    if isinstance(boxes, torch.Tensor):
        boxes[..., 0].clamp_(0, w)
        boxes[..., 1].clamp_(0, h)
        boxes[..., 2].clamp_(0, w)
        boxes[..., 3].clamp_(0, h)
    else:
        boxes[..., [0, 2]] = boxes[..., [0, 2]].clip(0, w)
        boxes[..., [1, 3]] = boxes[..., [1, 3]].clip(0, h)
    return boxes


def scale_boxes(from_shape: tuple[int, int], boxes: Array, to_shape: tuple[int, int],
                ratio_pad: tuple | None = None) -> Array:
    """Map xyxy boxes from a letterboxed image of ``from_shape`` (h, w) back to the original ``to_shape``.

    ``ratio_pad`` = ((ratio_h, ratio_w), (pad_w, pad_h)) as the letterbox returned it; computed when None.
    """
    if ratio_pad is None:
        gain = min(from_shape[0] / to_shape[0], from_shape[1] / to_shape[1])
        pad = ((from_shape[1] - to_shape[1] * gain) / 2, (from_shape[0] - to_shape[0] * gain) / 2)
    else:
        gain, pad = ratio_pad[0][0], ratio_pad[1]
    boxes[..., [0, 2]] -= pad[0]
    boxes[..., [1, 3]] -= pad[1]
    boxes[..., :4] /= gain
    return clip_boxes(boxes, to_shape)


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Pairwise IoU of xyxy boxes: (N, 4) x (M, 4) -> (N, M)."""
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(2)
    area1 = (boxes1[:, 2:] - boxes1[:, :2]).prod(1)
    area2 = (boxes2[:, 2:] - boxes2[:, :2]).prod(1)
    return inter / (area1[:, None] + area2[None, :] - inter + eps)


def bbox_iou(box1: torch.Tensor, box2: torch.Tensor, xywh: bool = True, kind: str = "iou",
             eps: float = 1e-7) -> torch.Tensor:
    """Element-wise IoU of matching boxes (..., 4) and (..., 4) -> (...,).

    ``kind``: 'iou', 'giou', 'diou' or 'ciou' (complete IoU: distance of centres and aspect ratio).
    """
    if xywh:
        (x1, y1, w1, h1), (x2, y2, w2, h2) = box1.unbind(-1), box2.unbind(-1)
        b1_x1, b1_x2, b1_y1, b1_y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
        b2_x1, b2_x2, b2_y1, b2_y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    else:
        b1_x1, b1_y1, b1_x2, b1_y2 = box1.unbind(-1)
        b2_x1, b2_y1, b2_x2, b2_y2 = box2.unbind(-1)
        w1, h1 = b1_x2 - b1_x1, (b1_y2 - b1_y1).clamp(min=eps)
        w2, h2 = b2_x2 - b2_x1, (b2_y2 - b2_y1).clamp(min=eps)
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(min=0) * \
            (torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)).clamp(min=0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    if kind == "iou":
        return iou
    cw = torch.max(b1_x2, b2_x2) - torch.min(b1_x1, b2_x1)  # enclosing box
    ch = torch.max(b1_y2, b2_y2) - torch.min(b1_y1, b2_y1)
    if kind == "giou":
        enclosing = cw * ch + eps
        return iou - (enclosing - union) / enclosing
    diag2 = cw**2 + ch**2 + eps
    centre2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    if kind == "diou":
        return iou - centre2 / diag2
    if kind != "ciou":
        raise ValueError(f"unknown IoU kind {kind!r}")
    v = (4 / math.pi**2) * (torch.atan(w2 / (h2 + eps)) - torch.atan(w1 / (h1 + eps))).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (centre2 / diag2 + v * alpha)


# The first NMS pass over an image takes half of its candidates, but at least 2 and at most 4 x max_det of them
# (see _greedy_nms). Exact whatever the values: they only set the speed.
FIRST_PASS_PER_DET = (2, 4)


def non_max_suppression(prediction: torch.Tensor, conf_thres: float = 0.25, iou_thres: float = 0.45,
                        classes: list[int] | None = None, agnostic: bool = False, multi_label: bool = False,
                        max_det: int = 300, max_nms: int = 30000, objectness: bool = True,
                        num_classes: int | None = None) -> list[torch.Tensor]:
    """Decoded predictions (b, n, 4 [+ 1] + nc [+ nm]) -> per image (k, 6 [+ nm]) [x1, y1, x2, y2, conf, cls, extra...],
    best first.

    Rows are xywh, then objectness when ``objectness`` (YOLOv5's anchor-based heads: conf = objectness x class score),
    then ``num_classes`` class scores (default: every remaining column), then any extra columns (mask coefficients),
    which are carried to the kept rows unchanged. ``multi_label`` keeps every class above the threshold for a box;
    ``agnostic`` suppresses across classes; the ``max_nms`` best candidates of an image enter NMS and the
    ``max_det`` best survivors come out. The result is that of torchvision's batched_nms on those candidates
    (ties between equal scores go to the earlier candidate in (box, class) order); candidates are selected
    for the whole batch at once, and NMS looks at no more of them than it needs (see _greedy_nms).
    """
    if not 0 <= conf_thres <= 1 or not 0 <= iou_thres <= 1:
        raise ValueError(f"conf_thres {conf_thres} and iou_thres {iou_thres} must be within [0, 1]")
    first_class = 5 if objectness else 4
    nc = prediction.shape[2] - first_class if num_classes is None else num_classes
    image, x, row, conf, cls = _candidates(prediction, conf_thres, classes, multi_label, first_class, nc)
    extra = x[:, first_class + nc:]
    counts = torch.bincount(image, minlength=prediction.shape[0]).tolist()  # the one host sync for the batch
    kept = []
    for parts in zip(row.split(counts), conf.split(counts), cls.split(counts)):
        det, rows = _nms_image(x[:, :4], *parts, iou_thres, agnostic, max_det, max_nms)
        kept.append(torch.cat((det, extra[rows]), 1) if extra.shape[1] else det)
    return kept


def _candidates(prediction: torch.Tensor, conf_thres: float, classes: list[int] | None, multi_label: bool,
                first_class: int, nc: int) -> tuple[torch.Tensor, ...]:
    """Every candidate of the batch above ``conf_thres``, in (image, box, class) order as a per-image selection
    gives them: its image (m,), the rows that pass the first filter (k, no), and its row in them, conf and class
    (m,). The first filter is objectness (few rows pass at high conf) or, without it, the best class score;
    corners are computed later, only for the candidates that enter NMS."""
    if first_class == 5:
        image, box = (prediction[..., 4] > conf_thres).nonzero(as_tuple=True)
        x = prediction[image, box]  # (k, no)
        scores = x[:, 5:5 + nc] * x[:, 4:5]  # (k, nc)
    else:
        image, box = (prediction[..., 4:4 + nc].amax(-1) > conf_thres).nonzero(as_tuple=True)
        x = prediction[image, box]
        scores = x[:, 4:4 + nc]
    allowed = None if classes is None else \
        (torch.arange(nc, device=x.device)[:, None] == torch.tensor(classes, device=x.device)).any(1)
    if multi_label and nc > 1:
        mask = scores > conf_thres
        if allowed is not None:
            mask &= allowed
        row, cls = mask.nonzero(as_tuple=True)
        conf = scores[row, cls]
    else:
        conf, cls = scores.max(1)
        mask = conf > conf_thres
        if allowed is not None:
            mask &= allowed[cls]
        row = mask.nonzero().squeeze(1)
        conf, cls = conf[row], cls[row]
    return image[row], x, row, conf, cls


def _nms_image(xywh: torch.Tensor, row: torch.Tensor, conf: torch.Tensor, cls: torch.Tensor, iou_thres: float,
               agnostic: bool, max_det: int, max_nms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's candidates -> the (k, 6) rows NMS keeps among the ``max_nms`` best, best first, and their rows in
    ``xywh``."""
    if conf.shape[0] > max_nms:  # the max_nms best, still in candidate order
        best = _top_order(conf, max_nms).sort().values
        row, conf, cls = row[best], conf[best], cls[best]
    if not conf.shape[0]:
        return torch.zeros((0, 6), device=conf.device), row
    det = torch.cat((xywh2xyxy(xywh[row]), conf[:, None], cls[:, None].float()), 1)
    boxes, groups = _nms_boxes(det, agnostic)
    keep = _greedy_nms(boxes, det[:, 4], groups, iou_thres, max_det)
    return det[keep], row[keep]


def _nms_boxes(det: torch.Tensor, agnostic: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The boxes NMS compares, and their classes where NMS must run class by class.

    As torchvision's batched_nms does on these candidates, so that every IoU is computed from the same
    numbers: up to 1000 boxes on CPU (25,000 elsewhere) it shifts each class by class x (largest coordinate
    + 1) and runs one nms call; above that, one call per class.
    """
    if agnostic:
        return det[:, :4], None
    if 4 * det.shape[0] > (4000 if det.device.type == "cpu" else 100_000):
        return det[:, :4], det[:, 5]
    return det[:, :4] + det[:, 5:6] * (det[:, :4].max() + 1), None


def _greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor | None, iou_thres: float,
                max_det: int) -> torch.Tensor:
    """Indices of the boxes greedy NMS keeps, best first, at most ``max_det``.

    NMS decides each box from the higher-scoring kept boxes only (a suppressed box suppresses nothing), so
    a first pass over the best candidates (FIRST_PASS_PER_DET) keeps exactly what a pass over all of them
    would keep among those; while fewer than ``max_det`` survive, the next pass runs on (survivors + as many
    next candidates as the survival rate so far says are needed). The result is the same as one pass over
    all, without the all-pairs IoU loop over candidates that cannot make the ``max_det`` cut.
    """
    n = scores.shape[0]
    low, high = FIRST_PASS_PER_DET
    keep = torch.zeros(0, dtype=torch.long, device=scores.device)
    done, take = 0, min(n, max(low * max_det, min(n // 2, high * max_det)))
    while take > 0:
        index = torch.cat((keep, _top_order(scores, take)[done:]))
        keep = index[_nms_sorted(boxes[index], None if groups is None else groups[index], iou_thres)]
        if keep.shape[0] >= max_det or take == n:
            return keep[:max_det]
        needed = (max_det - keep.shape[0]) * take / max(keep.shape[0], 1)  # at the survival rate so far
        done, take = take, int(take + 1.25 * needed)
        take = n if take > 0.75 * n else take  # close to all of them: one last pass over the rest
    return keep  # max_det 0


def _nms_sorted(boxes: torch.Tensor, groups: torch.Tensor | None, iou_thres: float) -> torch.Tensor:
    """Positions NMS keeps among boxes sorted best first (class by class when ``groups``), ascending.

    torchvision's kernel gets descending ranks as scores: it then visits the boxes in exactly this order, ties
    included (its own sort is not stable), and reads them in sequence.
    """
    from torchvision.ops import nms  # imported here: torchvision costs a process ~1.6 s, paid only if it runs NMS

    ranks = torch.arange(boxes.shape[0], 0, -1, dtype=boxes.dtype, device=boxes.device)
    if groups is None:
        return nms(boxes, ranks, iou_thres)
    by_class = groups.argsort(stable=True)  # positions of each class together, ascending within it
    counts = torch.unique_consecutive(groups[by_class], return_counts=True)[1].tolist()
    kept = [part[nms(boxes[part], ranks[part], iou_thres)] for part in by_class.split(counts)]
    return torch.cat(kept).sort().values


def _top_order(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` highest scores, highest first, ties in index order: the first ``k`` of a stable
    descending sort, without sorting all of them when ``k`` is a small part."""
    if k <= 0 or 4 * k >= scores.shape[0]:
        return scores.argsort(descending=True, stable=True)[:max(k, 0)]
    kth = scores.topk(k, sorted=False).values.min()
    best = (scores >= kth).nonzero().squeeze(1)  # the top k and any ties with the k-th, in index order
    return best[scores[best].argsort(descending=True, stable=True)][:k]


def label_rows(det: Array, shape: tuple[int, int], save_conf: bool = False) -> list[str]:
    """YOLO label text rows ``cls cx cy w h [conf]`` of (k, 6) detections [x1, y1, x2, y2, conf, cls], the box
    normalised to an image of ``shape`` (h, w)."""
    det = det.detach().cpu().numpy() if isinstance(det, torch.Tensor) else np.asarray(det)
    xywhn = xyxy2xywhn(det[:, :4].astype(np.float64), w=shape[1], h=shape[0])
    rows = []
    for box, conf, cls in zip(xywhn, det[:, 4], det[:, 5]):
        values = [int(cls), *box.tolist(), *([float(conf)] if save_conf else [])]
        rows.append(" ".join(f"{v:g}" if isinstance(v, int) else f"{v:.6g}" for v in values))
    return rows
