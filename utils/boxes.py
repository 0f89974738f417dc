"""Box formats, the IoU family, NMS and rescaling between letterboxed and original images.

Formats: ``xyxy`` corners, ``xywh`` centre + size; ``n`` suffix = normalised to [0, 1].
Functions accept torch tensors (and numpy arrays where noted) of shape (..., 4).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torchvision

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


def non_max_suppression(prediction: torch.Tensor, conf_thres: float = 0.25, iou_thres: float = 0.45,
                        classes: list[int] | None = None, agnostic: bool = False, multi_label: bool = False,
                        max_det: int = 300, max_nms: int = 30000) -> list[torch.Tensor]:
    """Decoded predictions (b, n, 5 + nc) -> per image (k, 6) [x1, y1, x2, y2, conf, cls].

    conf = objectness x class score; ``multi_label`` keeps every class above the threshold for
    a box; ``agnostic`` suppresses across classes. Uses torchvision's batched NMS.
    """
    if not 0 <= conf_thres <= 1 or not 0 <= iou_thres <= 1:
        raise ValueError(f"conf_thres {conf_thres} and iou_thres {iou_thres} must be within [0, 1]")
    nc = prediction.shape[2] - 5
    multi_label &= nc > 1
    output = [torch.zeros((0, 6), device=prediction.device)] * prediction.shape[0]
    for i, x in enumerate(prediction):  # (n, 5 + nc)
        x = x[x[:, 4] > conf_thres]
        if not x.shape[0]:
            continue
        scores = x[:, 5:] * x[:, 4:5]
        boxes = xywh2xyxy(x[:, :4])
        if multi_label:
            idx, cls = (scores > conf_thres).nonzero(as_tuple=False).T
            det = torch.cat((boxes[idx], scores[idx, cls, None], cls[:, None].float()), 1)
        else:
            conf, cls = scores.max(1, keepdim=True)
            det = torch.cat((boxes, conf, cls.float()), 1)[conf.view(-1) > conf_thres]
        if classes is not None:
            det = det[(det[:, 5:6] == torch.tensor(classes, device=det.device)).any(1)]
        if not det.shape[0]:
            continue
        det = det[det[:, 4].argsort(descending=True)[:max_nms]]
        group = torch.zeros_like(det[:, 5]) if agnostic else det[:, 5]
        keep = torchvision.ops.batched_nms(det[:, :4], det[:, 4], group, iou_thres)[:max_det]
        output[i] = det[keep]
    return output


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
