"""Detection metrics as COCO computes them: greedy matching per IoU threshold, 101-point AP, plus the
confusion matrix and the fitness that picks the best checkpoint.

Matching and AP follow pycocotools' COCOeval (detections in descending score order each take the
best-IoU unmatched label of their class; precision envelopes read at 101 recall points), so our
mAP@.5:.95 agrees with COCOeval on the same predictions. Ignore regions (COCO crowd boxes, VOC difficult
objects) are matched after the labels: a detection that no label takes but that lies on an ignore region of its
class is neither a true nor a false positive, as COCOeval and VOC's devkit count it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from utils.boxes import box_iou

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)  # COCO's 10 thresholds .50:.05:.95
RECALL_POINTS = np.linspace(0.0, 1.0, 101)  # COCO's 101 recall points
CONF_GRID = np.linspace(0.0, 1.0, 1000)  # confidences at which P, R and F1 curves are read


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def match_predictions(detections: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray,
                      iou_thresholds: np.ndarray = IOU_THRESHOLDS, overlaps: np.ndarray | None = None) -> np.ndarray:
    """Which detections are true positives at each IoU threshold, matched as COCOeval does.

    ``detections`` (n, 6) [x1, y1, x2, y2, conf, cls]; ``labels`` (m, 5) [cls, x1, y1, x2, y2], both in
    the same pixels; ``overlaps`` (n, m), when given, in place of their box IoU (a task's own: oriented boxes').
    Returns bool (n, len(iou_thresholds)) in the detections' row order.
    """
    dets, labs = _numpy(detections).astype(np.float64), _numpy(labels).astype(np.float64)
    if not len(dets) or not len(labs):
        return np.zeros((len(dets), len(iou_thresholds)), dtype=bool)
    iou = box_iou(torch.from_numpy(dets[:, :4]), torch.from_numpy(labs[:, 1:5]), eps=0.0).numpy() \
        if overlaps is None else np.asarray(overlaps, np.float64).reshape(len(dets), len(labs))
    iou = np.nan_to_num(iou) * (dets[:, 5:6] == labs[None, :, 0])  # only labels of the same class count
    return match_by_iou(iou, dets[:, 4], iou_thresholds)


def match_by_iou(iou: np.ndarray, conf: np.ndarray, iou_thresholds: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """The matching of ``match_predictions`` given the (n, m) overlaps of detections and labels (box IoU, mask
    IoU, ...), already 0 across classes, and the detections' confidences (n,): bool (n, len(iou_thresholds))."""
    correct = np.zeros((len(iou), len(iou_thresholds)), dtype=bool)
    if not iou.size:
        return correct
    thresholds = np.minimum(np.asarray(iou_thresholds, dtype=np.float64), 1 - 1e-10)[:, None]  # (t, 1)
    taken = np.zeros((len(thresholds), iou.shape[1]), dtype=bool)  # label already matched, per threshold
    order = np.argsort(-np.asarray(conf, dtype=np.float64), kind="mergesort")
    for d in order[iou[order].max(1) >= thresholds.min()]:  # others match nothing at any threshold
        candidates = np.where((iou[d][None, :] >= thresholds) & ~taken, iou[d][None, :], -1.0)  # (t, m)
        best = candidates.shape[1] - 1 - candidates[:, ::-1].argmax(1)  # ties -> the last label, as COCOeval
        hit = candidates[np.arange(len(thresholds)), best] >= 0
        correct[d, hit] = True
        taken[np.nonzero(hit)[0], best[hit]] = True
    return correct


def ignore_overlap(detections: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """(n, k) overlap of detections (n, 6) [xyxy, conf, cls] with ignore regions (k, 6) [cls, xyxy, crowd]: for a
    crowd region the intersection over the detection's area (COCOeval's crowd rule), else the IoU; 0 across
    classes."""
    lt = np.maximum(detections[:, None, :2], regions[None, :, 1:3])
    rb = np.minimum(detections[:, None, 2:4], regions[None, :, 3:5])
    inter = np.clip(rb - lt, 0, None).prod(2)
    det_area = (detections[:, 2:4] - detections[:, :2]).prod(1)[:, None]
    union = det_area + (regions[:, 3:5] - regions[:, 1:3]).prod(1)[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        overlap = np.nan_to_num(inter / np.where(regions[None, :, 5] > 0, det_area, union))
    return overlap * (detections[:, 5:6] == regions[None, :, 0])


def ignored_detections(detections: torch.Tensor | np.ndarray, correct: np.ndarray,
                       regions: torch.Tensor | np.ndarray | None,
                       iou_thresholds: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """Which detections count for nothing at each IoU threshold: those no label took (``correct`` False) that
    overlap an ignore region of their class by at least the threshold (ignore_overlap). A region may take any
    number of detections. ``regions`` (k, 6) [cls, x1, y1, x2, y2, crowd] in the detections' pixels.
    Returns bool (n, len(iou_thresholds))."""
    ignored = np.zeros((len(correct), len(iou_thresholds)), dtype=bool)
    if regions is None or not len(regions) or not len(correct):
        return ignored
    overlap = ignore_overlap(_numpy(detections).astype(np.float64), _numpy(regions).astype(np.float64))
    thresholds = np.minimum(np.asarray(iou_thresholds, dtype=np.float64), 1 - 1e-10)
    return ~correct & (overlap.max(1)[:, None] >= thresholds[None, :])


def coco_ap(precision: np.ndarray, recall: np.ndarray) -> tuple[float, np.ndarray]:
    """AP from a PR sequence (in descending score order): the precision envelope read at 101 recall points.

    Returns (AP, the 101 envelope values); recall points never reached count as precision 0.
    """
    envelope = np.maximum.accumulate(np.asarray(precision, dtype=np.float64)[::-1])[::-1]
    index = np.searchsorted(recall, RECALL_POINTS, side="left")
    curve = np.zeros(len(RECALL_POINTS))
    reached = index < len(envelope)
    curve[reached] = envelope[index[reached]]
    return float(curve.mean()), curve


@dataclass
class DetectionMetrics:
    """Per-class results for the classes that have labels, and the curves for the plots."""

    classes: np.ndarray  # (k,) class indices with at least one label
    precision: np.ndarray  # (k,) at the confidence of best mean F1
    recall: np.ndarray  # (k,)
    f1: np.ndarray  # (k,)
    ap: np.ndarray  # (k, 10) AP at each IoU threshold
    n_labels: np.ndarray  # (k,) labels per class
    pr_curves: np.ndarray  # (k, 101) precision envelope at IoU .5 on RECALL_POINTS
    f1_curves: np.ndarray  # (k, 1000) F1 at IoU .5 on CONF_GRID
    p_curves: np.ndarray = field(default_factory=lambda: np.zeros((0, len(CONF_GRID))))
    r_curves: np.ndarray = field(default_factory=lambda: np.zeros((0, len(CONF_GRID))))

    @property
    def ap50(self) -> np.ndarray:
        return self.ap[:, 0] if len(self.ap) else np.zeros(0)

    def mean_results(self) -> tuple[float, float, float, float]:
        """(mean P, mean R, mAP@.5, mAP@.5:.95) over the classes with labels (zeros when none)."""
        if not len(self.classes):
            return 0.0, 0.0, 0.0, 0.0
        return (float(self.precision.mean()), float(self.recall.mean()), float(self.ap[:, 0].mean()),
                float(self.ap.mean()))

    def class_maps(self, nc: int) -> np.ndarray:
        """(nc,) mAP@.5:.95 per class; classes without labels get the overall mAP (as the reference does)."""
        maps = np.full(nc, self.mean_results()[3])
        for i, c in enumerate(self.classes):
            if 0 <= c < nc:
                maps[c] = self.ap[i].mean()
        return maps


def _class_curves(tp: np.ndarray, ignored: np.ndarray, conf: np.ndarray, n_labels: int) -> tuple[np.ndarray, ...]:
    """AP per threshold, PR envelope at .5, and P/R on CONF_GRID for one class's detections (score order).

    An ignored detection adds neither a TP nor an FP: its row repeats the previous P and R, which leaves the AP
    as it would be without the row (as in COCOeval); the P and R curves skip it."""
    tp_cum = np.cumsum(tp & ~ignored, 0, dtype=np.float64)  # (n, t)
    fp_cum = np.cumsum(~tp & ~ignored, 0, dtype=np.float64)
    recall = tp_cum / n_labels
    precision = tp_cum / np.maximum(tp_cum + fp_cum, np.finfo(np.float64).tiny)
    ap = np.zeros(tp.shape[1])
    pr_curve = np.zeros(len(RECALL_POINTS))
    for t in range(tp.shape[1]):
        ap[t], curve = coco_ap(precision[:, t], recall[:, t])
        if t == 0:
            pr_curve = curve
    counted = ~ignored[:, 0] if ignored.shape[1] else np.ones(len(conf), bool)
    if counted.any():  # np.interp needs increasing x: read the curves against -conf
        r_curve = np.interp(-CONF_GRID, -conf[counted], recall[counted, 0], left=0)
        p_curve = np.interp(-CONF_GRID, -conf[counted], precision[counted, 0], left=1)
    else:
        r_curve, p_curve = np.zeros(len(CONF_GRID)), np.zeros(len(CONF_GRID))
    return ap, pr_curve, p_curve, r_curve


def ap_per_class(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray,
                 eps: float = 1e-16, ignored: np.ndarray | None = None) -> DetectionMetrics:
    """P, R, F1 and AP@[.5:.95] per class from all detections of a data set.

    ``tp`` (n, 10) bool from match_predictions, ``conf`` (n,), ``pred_cls`` (n,), ``target_cls`` (m,) the
    class of every label, ``ignored`` (n, 10) bool from ignored_detections (none when omitted). P and R are
    read at the confidence where the mean F1 over classes peaks.
    """
    tp = np.asarray(tp, dtype=bool)
    tp = tp.reshape(len(conf), tp.shape[-1] if tp.ndim > 1 else 1)
    ignored = np.zeros_like(tp) if ignored is None else np.asarray(ignored, dtype=bool).reshape(tp.shape)
    order = np.argsort(-np.asarray(conf, dtype=np.float64), kind="mergesort")  # stable: ties keep input order
    tp, ignored, conf = tp[order], ignored[order], np.asarray(conf, dtype=np.float64)[order]
    pred_cls = np.asarray(pred_cls)[order]
    classes, counts = np.unique(np.asarray(target_cls).astype(int), return_counts=True)
    k, t = len(classes), tp.shape[1]
    ap, pr_curves = np.zeros((k, t)), np.zeros((k, len(RECALL_POINTS)))
    p_curves, r_curves = np.zeros((k, len(CONF_GRID))), np.zeros((k, len(CONF_GRID)))
    for i, c in enumerate(classes):
        mine = pred_cls == c
        ap[i], pr_curves[i], p_curves[i], r_curves[i] = _class_curves(tp[mine], ignored[mine], conf[mine],
                                                                                     counts[i])
    f1_curves = 2 * p_curves * r_curves / (p_curves + r_curves + eps)
    best = int(f1_curves.mean(0).argmax()) if k else 0
    return DetectionMetrics(classes=classes, precision=p_curves[:, best], recall=r_curves[:, best],
                            f1=f1_curves[:, best], ap=ap, n_labels=counts, pr_curves=pr_curves,
                            f1_curves=f1_curves, p_curves=p_curves, r_curves=r_curves)


class ConfusionMatrix:
    """Counts of (predicted class, true class) with a background row and column at index ``nc``.

    Rows are predictions, columns are labels: column ``nc`` holds false positives (no label),
    row ``nc`` missed labels (no prediction). Only detections above ``conf`` take part.
    """

    def __init__(self, nc: int, conf: float = 0.25, iou_thres: float = 0.45) -> None:
        self.nc, self.conf, self.iou_thres = nc, conf, iou_thres
        self.matrix = np.zeros((nc + 1, nc + 1), dtype=np.int64)

    def process_batch(self, detections: torch.Tensor | np.ndarray | None, labels: torch.Tensor | np.ndarray,
                      ignore: torch.Tensor | np.ndarray | None = None, overlaps: np.ndarray | None = None) -> None:
        """Add one image: ``detections`` (n, 6) [xyxy, conf, cls] or None, ``labels`` (m, 5) [cls, xyxy]; a
        detection no label takes that lies on an ``ignore`` region (k, 6) of its class (ignore_overlap above
        ``iou_thres``) is not counted as background. ``overlaps`` (n, m), when given, replace the box IoU."""
        labs = _numpy(labels).astype(np.float64).reshape(-1, 5)
        dets = np.zeros((0, 6)) if detections is None else _numpy(detections).astype(np.float64).reshape(-1, 6)
        above = dets[:, 4] > self.conf
        dets = dets[above]
        label_cls, det_cls = labs[:, 0].astype(int), dets[:, 5].astype(int)
        pairs = np.zeros((0, 3))
        if len(dets) and len(labs):
            iou = box_iou(torch.from_numpy(labs[:, 1:5]), torch.from_numpy(dets[:, :4])).numpy() if overlaps is None \
                else np.asarray(overlaps, np.float64).reshape(len(above), len(labs))[above].T  # (m, n)
            li, di = np.nonzero(iou > self.iou_thres)
            pairs = np.stack((li, di, iou[li, di]), 1)[np.argsort(-iou[li, di], kind="mergesort")]
            pairs = pairs[np.unique(pairs[:, 1], return_index=True)[1]]  # each detection once (best IoU)
            pairs = pairs[np.argsort(-pairs[:, 2], kind="mergesort")]
            pairs = pairs[np.unique(pairs[:, 0], return_index=True)[1]]  # each label once
        matched_labels, matched_dets = pairs[:, 0].astype(int), pairs[:, 1].astype(int)
        np.add.at(self.matrix, (det_cls[matched_dets], label_cls[matched_labels]), 1)
        missed = np.setdiff1d(np.arange(len(labs)), matched_labels)
        np.add.at(self.matrix, (np.full(len(missed), self.nc), label_cls[missed]), 1)
        spurious = np.setdiff1d(np.arange(len(dets)), matched_dets)
        if ignore is not None and len(ignore) and len(spurious):
            on_ignored = ignore_overlap(dets[spurious], _numpy(ignore).astype(np.float64).reshape(-1, 6)).max(1)
            spurious = spurious[on_ignored <= self.iou_thres]
        np.add.at(self.matrix, (det_cls[spurious], np.full(len(spurious), self.nc)), 1)

    def merge(self, matrices: Sequence[np.ndarray]) -> None:
        """Replace the counts by the sum of several ranks' matrices (integer counts: exact)."""
        self.matrix = np.sum(np.stack(list(matrices)), 0).astype(np.int64)

    def tp_fp(self) -> tuple[np.ndarray, np.ndarray]:
        """True and false positives per class (background excluded)."""
        tp = np.diag(self.matrix)[:-1]
        return tp, self.matrix[:-1].sum(1) - tp
