"""The pose task's losses (its ``losses`` per family), to the LossFn interface of utils/training/families.py: each
anchor-free family's detection loss (utils/training/loss_anchor_free.py: the same assigner and terms) with the
keypoint terms beside it, read from the same assignment.

For every cell the task-aligned assigner made a positive, its predicted keypoints (decoded around the cell, in grid
units) are compared with its object's:

- ``pose``: 1 - exp(-d^2 / (2 (2 sigma_k)^2 (area + eps))) per labelled keypoint k (COCO's OKS with the object's box
  area in grid units, sigma_k the keypoint's OKS sigma), scaled by K / (labelled keypoints + eps) per object and
  averaged over every (object, keypoint), times ``hyp["pose"]`` (12.0);
- ``kobj`` (keypoints with a visibility, D = 3): BCE of the predicted visibility logit against "labelled"
  (v > 0), averaged, times ``hyp["kobj"]`` (1.0);
- ``rle`` (YOLO26, whose head has a flow): the residual log-likelihood of each labelled keypoint's error scaled by
  its predicted sigma (sigmoid of the head's ``keypoint_sigmas``): log sigma - log p_flow(error / sigma) +
  log 2 sigma + |error / sigma| per coordinate, weighted per keypoint (COCO's RLE weights for 17 keypoints, else 1),
  summed over coordinates and divided by the labelled keypoints, at least 0, times ``hyp["rle"]`` (1.0).

``AnchorFreePoseLoss`` (YOLOv8-pose, YOLO11-pose; terms box, pose, kobj, cls, dfl) and ``EndToEndPoseLoss``
(YOLO26-pose: both branch sets, the one-to-many weight falling over the run as for detection; terms box, pose,
kobj, cls, l1, rle). Called ``loss(preds, targets, keypoints, kpt_sigmas)`` with the batch's extras by name
(utils/tasks/pose/sample.py): ``keypoints`` (n, K, 3) float, the targets' objects' keypoints in the targets' order,
x and y normalised to the input image, v (0 unlabelled; a set without visibilities has v = 2 everywhere), and
``kpt_sigmas`` (K,) the data set's OKS sigmas (None: COCO's for 17 keypoints, 1/K otherwise). The total is the
terms' sum times the batch size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from utils.errors import UserError
from utils.tasks.pose.labels import keypoint_sigmas
from utils.training.loss_anchor_free import AnchorFreeLoss, EndToEndLoss
from utils.training.tal import Assignment


class PoseDataError(UserError, ValueError):
    """Keypoints that do not fit the model's head; one line."""


GAINS = {"pose": 12.0, "kobj": 1.0, "rle": 1.0}  # ultralytics' published defaults, used when the hyp has none
COCO_RLE_WEIGHTS = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 1.2, 1.5, 1.5, 1.0, 1.0, 1.2, 1.2, 1.5, 1.5)
EPS = 1e-9


def oks_keypoint_loss(pred: torch.Tensor, target: torch.Tensor, labelled: torch.Tensor, area: torch.Tensor,
                      sigmas: torch.Tensor) -> torch.Tensor:
    """(f, K, >=2) predicted and target keypoints, (f, K) bool labelled, (f, 1) box areas (all in one unit) ->
    the pose term (see the module docstring)."""
    squared = (pred[..., 0] - target[..., 0]).pow(2) + (pred[..., 1] - target[..., 1]).pow(2)  # (f, K)
    per_object = labelled.shape[1] / (labelled.sum(1) + EPS)  # (f,)
    exponent = squared / ((2 * sigmas).pow(2) * (area + EPS) * 2)
    return (per_object.view(-1, 1) * (1 - torch.exp(-exponent)) * labelled).mean()


def residual_log_likelihood(flow: nn.Module, pred: torch.Tensor, target: torch.Tensor, raw_sigma: torch.Tensor,
                            labelled: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(f, K, 2) predicted and target coordinates, (f, K, 2) raw sigmas, (f, K) labelled, (K,) keypoint weights ->
    the rle term (see the module docstring; before its gain). Zero, still reaching the flow's and the sigmas'
    parameters, when nothing is labelled (every parameter gets a gradient, as DDP needs)."""
    sigma = raw_sigma[labelled].sigmoid()  # (v, 2)
    error = (pred[labelled] - target[labelled]) / (sigma + EPS)
    weight = weights.expand_as(labelled)[labelled]  # (v,)
    finite = torch.isfinite(error).all(1)
    error, sigma, weight = error[finite].clamp(-100, 100), sigma[finite], weight[finite]
    log_phi = flow.log_prob(error)  # (v,)
    if error.shape[0] == 0:
        return (log_phi.sum() + sigma.sum() + raw_sigma.sum()) * 0.0
    loss = torch.log(sigma) - log_phi.unsqueeze(1) + torch.log(2 * sigma) + error.abs()  # (v, 2)
    return (loss * weight.unsqueeze(1)).sum().div(error.shape[0]).clamp(min=0)


class AnchorFreePoseLoss(AnchorFreeLoss):
    """See the module docstring. ``sigmas`` (K,) are the data set's OKS sigmas (None: COCO's for 17 keypoints, else
    1/K each)."""

    def __init__(self, model: nn.Module, hyp: dict, img_size: int = 640, label_smoothing: float = 0.0,
                 topk: int = 10, topk2: int | None = None, sigmas: Any = None) -> None:
        super().__init__(model, hyp, img_size, label_smoothing, topk, topk2)
        head = model.head
        self.kpt_shape = (int(head.kpt_shape[0]), int(head.kpt_shape[1]))
        self.decode_scale, self.decode_shift = float(head.KEYPOINT_SCALE), float(head.KEYPOINT_SHIFT)
        self.sigmas = torch.as_tensor(keypoint_sigmas(self.kpt_shape[0], sigmas), dtype=torch.float32)
        self.pose_gains = {k: float(hyp.get(k, v)) for k, v in GAINS.items()}
        self.flow = getattr(head, "flow_model", None)
        count = self.kpt_shape[0]
        self.rle_weights = torch.tensor(COCO_RLE_WEIGHTS if count == len(COCO_RLE_WEIGHTS) else (1.0,) * count)
        box, cls, side = self.names
        self.names = (box, "pose", "kobj", cls, side, *(("rle",) if self.flow is not None else ()))

    def __call__(self, preds: dict[str, Any], targets: torch.Tensor, keypoints: torch.Tensor,
                 kpt_sigmas: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        items = self.terms(preds, targets, keypoints, kpt_sigmas)
        return items.sum() * preds["scores"].shape[0], items.detach()

    def terms(self, preds: dict[str, Any], targets: torch.Tensor,  # type: ignore[override]
              keypoints: torch.Tensor, kpt_sigmas: torch.Tensor | None = None) -> torch.Tensor:
        """The gained terms in ``names`` order of one set of branches (``kpt_sigmas``: the batch's data set's,
        replacing the ones given at construction)."""
        if kpt_sigmas is not None:
            self.sigmas = self.checked_sigmas(kpt_sigmas)
        targets = targets.to(preds["scores"].device)
        detection, assigned, image_hw = self.assigned_terms(preds, targets)
        extra = self.keypoint_terms(preds, targets, keypoints.to(targets.device), assigned, image_hw)
        return torch.cat((detection[:1], extra[:2], detection[1:], extra[2:]))

    def checked_sigmas(self, sigmas: torch.Tensor) -> torch.Tensor:
        """A batch's sigmas (K,) as float32; a one-line error when the data set's keypoint count is not the head's."""
        sigmas = torch.as_tensor(sigmas, dtype=torch.float32).reshape(-1)
        if len(sigmas) != self.kpt_shape[0]:
            raise PoseDataError(f"the data set has {len(sigmas)} keypoints per object but the model's head predicts "
                                f"{self.kpt_shape[0]} (kpt_shape {list(self.kpt_shape)})")
        return sigmas

    def keypoints_by_image(self, keypoints: torch.Tensor, targets: torch.Tensor, batch_size: int,
                           image_hw: list[float]) -> torch.Tensor:
        """(n, K, 3) normalised -> (b, m, K, 3) in pixels, padded as ``targets_by_image`` pads the boxes."""
        order, image, slot, most = self.image_slots(targets[:, 0], batch_size)
        out = keypoints.new_zeros((batch_size, most, *keypoints.shape[1:]))
        scaled = keypoints[order].float().clone()
        scaled[..., 0] *= image_hw[1]
        scaled[..., 1] *= image_hw[0]
        out[image, slot] = scaled
        return out

    def keypoint_terms(self, preds: dict[str, Any], targets: torch.Tensor, keypoints: torch.Tensor,
                       assigned: Assignment, image_hw: list[float]) -> torch.Tensor:
        """(pose, kobj[, rle]) gained, from the positives of ``assigned``."""
        count, dims = self.kpt_shape
        raw = preds["keypoints"].float()  # (b, K * D, n)
        b, _, n = raw.shape
        fg = assigned.foreground
        if not fg.any():  # no positives: zero terms that still reach the keypoint outputs (DDP needs every gradient)
            zero = raw.sum() * 0.0
            rest = [self._untouched_rle(preds)] if self.flow is not None else []
            return torch.stack([zero, zero, *rest])
        strides = preds["stride_tensor"].float()  # (n, 1)
        cell_strides = strides.view(1, n).expand(b, n)[fg].view(-1, 1, 1)  # (f, 1, 1)
        by_image = self.keypoints_by_image(keypoints, targets, b, image_hw)  # (b, m, K, 3) pixels
        target = by_image.gather(1, assigned.gt_index.view(b, n, 1, 1).expand(b, n, count, 3))[fg]  # (f, K, 3)
        target_xy = target[..., :2] / cell_strides
        labelled = target[..., 2] > 0  # (f, K)
        pred = raw.permute(0, 2, 1).reshape(b, n, count, dims)[fg]  # (f, K, D)
        points = preds["anchor_points"].float().unsqueeze(0).expand(b, n, 2)[fg].unsqueeze(1)  # (f, 1, 2)
        pred_xy = pred[..., :2] * self.decode_scale + points + self.decode_shift
        box = assigned.boxes[fg] / cell_strides.view(-1, 1)  # (f, 4) xyxy, grid units
        area = ((box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1])).unsqueeze(1)
        pose = oks_keypoint_loss(pred_xy, target_xy, labelled, area, self.sigmas.to(raw.device))
        kobj = (F.binary_cross_entropy_with_logits(pred[..., 2], labelled.float()) if dims == 3
                else raw.sum() * 0.0)
        out = [pose * self.pose_gains["pose"], kobj * self.pose_gains["kobj"]]
        if self.flow is not None:
            raw_sigma = preds["keypoint_sigmas"].float().permute(0, 2, 1).reshape(b, n, count, 2)[fg]
            rle = residual_log_likelihood(self.flow, pred_xy, target_xy, raw_sigma, labelled,
                                          self.rle_weights.to(raw.device))
            out.append(rle * self.pose_gains["rle"])
        return torch.stack(out)

    def _untouched_rle(self, preds: dict[str, Any]) -> torch.Tensor:
        """A zero rle term through the flow and the sigma outputs (a batch without positives)."""
        nothing = preds["keypoint_sigmas"].new_zeros((0, 2)).float()
        return (self.flow.log_prob(nothing).sum() + preds["keypoint_sigmas"].sum()) * 0.0


class EndToEndPoseLoss(EndToEndLoss):
    """YOLO26-pose's loss: AnchorFreePoseLoss on both branch sets, weighted as EndToEndLoss weighs them; ``items``
    are the one-to-one terms. Called ``loss(preds, targets, keypoints=...)``."""

    branch_loss = AnchorFreePoseLoss
