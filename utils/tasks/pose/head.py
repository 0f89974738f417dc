"""Pose (keypoint) heads, the pose task's ``heads`` part: the anchor-free Pose head of YOLOv8-pose and YOLO11-pose, and
YOLO26-pose's end-to-end head, registered in the open registry under the YAML names ultralytics' files use (``Pose``,
``Pose26``).

A pose model predicts, for every box it predicts, ``kpt_shape = [K, D]`` keypoint values: K keypoints of (x, y) or
(x, y, visibility). The YAML row is ``[[16, 19, 22], 1, Pose, [nc, kpt_shape]]``; ``kpt_shape`` names the config's
own ``kpt_shape`` (or is written as a list).

- ``Pose`` (YOLOv8, YOLO11): the anchor-free detection head plus, per level, a keypoint branch ``cv4`` (3x3 Conv,
  3x3 Conv, 1x1 conv to K * D, with max(ch[0] // 4, K * D) hidden channels). A keypoint decodes around its cell as
  ``(2 * raw + cell index) * stride`` (the cell centre minus half a cell, plus twice the raw value); a visibility as
  its sigmoid.
- ``Pose26`` (YOLO26): the end-to-end head with a keypoint trunk ``cv4`` (two 3x3 Convs, max(ch[0] // 4, K * (D + 2))
  channels) feeding two 1x1 convs, ``cv4_kpts`` (K * D) and ``cv4_sigma`` (K * 2: a scale per coordinate, read by the
  residual log-likelihood loss only), one-to-one copies of all three, and ``flow_model`` (RealNVP), the learned error
  density of that loss. A keypoint decodes as ``(raw + cell centre) * stride``.

Train mode returns the anchor-free head's dict (models/head_anchor_free.py) with ``keypoints`` (b, K * D, n) raw,
and for Pose26 ``keypoint_sigmas`` (b, 2 K, n) raw, per branch set ({"one2many": ..., "one2one": ...} for Pose26).
Eval mode returns rows whose last 3 K columns are the keypoints in input pixels, x, y and visibility each, after the
detection columns: (b, n, 4 + nc + 3 K) for Pose (``xywh_cls``), (b, k, 6 + 3 K) for Pose26 (``xyxy_score_cls``
final rows). Those are the contract's ``extra`` columns, which ride through post-processing with their rows; a model
of keypoints without visibility (D = 2) reports each keypoint visible (1.0), so every pose row has K x (x, y, v)
and the contract's columns alone say K. The head also keeps the data set's ``flip_idx`` (a config key, like
``kpt_shape``: which keypoint a left-right flip turns each into) for test-time augmentation.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from models.common import Conv
from models.head_anchor_free import AnchorFreeDetect, head_args
from models.head_end_to_end import MAX_DET, EndToEndDetect
from models.registry import ModelConfigError, Row, RowArgs, is_number, register_module
from utils.tasks.contract import MAX_EXTRA, OutputContract

MAX_KEYPOINTS = MAX_EXTRA // 3  # keypoints per object a config may ask for (3 contract columns each)


def keypoint_shape(row: Row, index: int = 1) -> tuple[int, int]:
    """(K, D) from a Pose row's ``args[index]``: the name ``kpt_shape`` (the config's value) or a [K, D] list, with
    1 <= K <= MAX_KEYPOINTS, D 2 or 3, and K * D columns that an output contract can carry."""
    value = row.args[index] if len(row.args) > index else None
    if value == "kpt_shape":
        if "kpt_shape" not in row.cfg:
            raise ModelConfigError(f"{row.where}: missing key 'kpt_shape' (the keypoint count and 2 or 3 values each)")
        value = row.cfg["kpt_shape"]
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(is_number(v) and v == int(v) for v in value)
            and 1 <= value[0] <= MAX_KEYPOINTS and value[1] in (2, 3)):
        raise ModelConfigError(f"{row.where}: kpt_shape must be [keypoints, 2 or 3] with 1..{MAX_KEYPOINTS} keypoints, "
                               f"got {str(value)[:60]}")
    return int(value[0]), int(value[1])


def flip_index(row: Row, count: int) -> list[int] | None:
    """The config's ``flip_idx`` (None when it has none): a permutation of the ``count`` keypoints that undoes
    itself (left and right swapped), checked."""
    value = row.cfg.get("flip_idx")
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == count and sorted(value) == list(range(count))
            and all(is_number(v) and value[int(v)] == i for i, v in enumerate(value))):
        raise ModelConfigError(f"{row.where}: flip_idx must pair the {count} keypoints (a permutation with "
                               f"flip_idx[flip_idx[i]] == i), got {str(value)[:60]}")
    return [int(v) for v in value]


def keypoint_convs(ch: Sequence[int], outputs: int) -> nn.ModuleList:
    """The anchor-free Pose head's keypoint branch (``cv4``): per level 3x3 Conv, 3x3 Conv, 1x1 conv to
    ``outputs``, with max(ch[0] // 4, outputs) hidden channels (the reference's widths)."""
    hidden = max(ch[0] // 4, outputs)
    return nn.ModuleList(nn.Sequential(Conv(c, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, outputs, 1))
                         for c in ch)


def pose_args(row: Row) -> RowArgs:
    """``[nc, kpt_shape]`` -> ``(nc, [K, D], reg_max, depthwise_cls, source channels, flip_idx)``."""
    if len(row.args) != 2:
        raise ModelConfigError(f"{row.where}: {row.name} takes [nc, kpt_shape], got {str(row.args)[:60]}")
    shape = keypoint_shape(row)
    nc, reg_max, depthwise_cls, channels = head_args(dataclasses.replace(row, args=row.args[:1])).args
    return RowArgs([nc, list(shape), reg_max, depthwise_cls, channels, flip_index(row, shape[0])], row.repeats, 0)


def decode_keypoints(raw: torch.Tensor, points: torch.Tensor, strides: torch.Tensor, kpt_shape: Sequence[int],
                     scale: float, shift: float) -> torch.Tensor:
    """Raw keypoints (b, K * D, n) of cells at ``points`` (n, 2) (centres, grid units) with ``strides`` (n, 1) ->
    (b, 3 K, n) in input pixels: x, y = (scale * raw + centre + shift) * stride; a visibility its sigmoid (1 for
    D = 2). Out of place, and without sizes read from the tensors, so exports trace it with dynamic shapes."""
    values = raw.unflatten(1, (int(kpt_shape[0]), int(kpt_shape[1])))  # (b, K, D, n)
    centres = points.transpose(0, 1)[None, None].to(raw.dtype)  # (1, 1, 2, n)
    xy = (values[:, :, :2] * scale + centres + shift) * strides.transpose(0, 1)[None, None].to(raw.dtype)
    visible = values[:, :, 2:3].sigmoid() if int(kpt_shape[1]) == 3 else torch.ones_like(xy[:, :, :1])
    return torch.cat((xy, visible), 2).flatten(1, 2)


def keypoint_metadata(head: nn.Module) -> dict[str, Any]:
    """What a pose model's exported file records beside the detection metadata: the task, its keypoint shape and
    its flip index (None: none)."""
    return {"task": head.task, "kpt_shape": [int(v) for v in head.kpt_shape],
            "flip_idx": None if head.flip_idx is None else [int(v) for v in head.flip_idx]}


def _anchor_free_pose(cfg: Mapping[str, Any], args: list) -> bool:
    """A ``Pose`` row in a config that is not end-to-end."""
    return not cfg.get("end2end")


@register_module("Pose", when=_anchor_free_pose, table_name="utils.tasks.pose.head.AnchorFreePoseHead")
class AnchorFreePoseHead(AnchorFreeDetect):
    """The Pose head of YOLOv8-pose and YOLO11-pose (see the module docstring); YOLO11's depthwise class branch when a
    C3k2 row came before."""

    task = "pose"
    yaml_args = staticmethod(pose_args)
    KEYPOINT_SCALE, KEYPOINT_SHIFT = 2.0, -0.5  # (2 raw + centre - 0.5) * stride

    def __init__(self, nc: int = 80, kpt_shape: Sequence[int] = (17, 3), reg_max: int = 16,
                 depthwise_cls: bool = False, ch: Sequence[int] = (), flip_idx: Sequence[int] | None = None) -> None:
        super().__init__(nc, reg_max, depthwise_cls, ch)
        self.kpt_shape = [int(kpt_shape[0]), int(kpt_shape[1])]
        self.nk = self.kpt_shape[0] * self.kpt_shape[1]
        self.flip_idx = None if flip_idx is None else [int(v) for v in flip_idx]
        self.cv4 = keypoint_convs(ch, self.nk)  # per level: 3x3, 3x3, 1x1 to K * D

    @property
    def contract(self) -> OutputContract:
        return dataclasses.replace(super().contract, extra=3 * self.kpt_shape[0], task=self.task)

    def export_metadata(self) -> dict[str, Any]:
        return {**super().export_metadata(), **keypoint_metadata(self)}

    def forward(self, xs: list[torch.Tensor]) -> dict[str, Any] | torch.Tensor:
        out = self.branches(xs, self.cv2, self.cv3)
        out["keypoints"] = torch.cat([branch(x).flatten(2) for branch, x in zip(self.cv4, xs)], 2)  # (b, K * D, n)
        return out if self.training else self.decode(out)

    def decode(self, out: dict[str, Any], xywh: bool = True) -> torch.Tensor:
        """The raw dict -> (b, n, 4 + nc + 3 K): the detection rows, then the keypoints (x, y, v) in input pixels."""
        keypoints = decode_keypoints(out["keypoints"], out["anchor_points"], out["stride_tensor"], self.kpt_shape,
                                     self.KEYPOINT_SCALE, self.KEYPOINT_SHIFT)
        return torch.cat((super().decode(out, xywh), keypoints.transpose(1, 2)), 2)


class RealNVP(nn.Module):
    """A RealNVP normalising flow on 2-D points (Dinh et al.): six affine coupling layers whose scale (``s``, tanh
    bounded) and shift (``t``) nets each read the half of the point the layer's ``mask`` keeps; ``log_prob`` is the
    log density of a standard normal at the point mapped back through the layers, plus their log-Jacobians. YOLO26's
    keypoint loss learns its error density with it (utils/tasks/pose/loss.py); inference never runs it.
    Buffers and children carry the names ultralytics' files hold."""

    LAYERS, HIDDEN = 6, 64

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("loc", torch.zeros(2))
        self.register_buffer("cov", torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # not torch.eye: on the meta device
        # (the builder's size check) eye decomposes through torch._refs, a seconds-long first import
        self.register_buffer("mask", torch.tensor([[0.0, 1.0], [1.0, 0.0]] * (self.LAYERS // 2)))
        self.s = nn.ModuleList(self._net(bounded=True) for _ in range(self.LAYERS))
        self.t = nn.ModuleList(self._net(bounded=False) for _ in range(self.LAYERS))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight, gain=0.01)

    def _net(self, bounded: bool) -> nn.Sequential:
        layers = [nn.Linear(2, self.HIDDEN), nn.SiLU(), nn.Linear(self.HIDDEN, self.HIDDEN), nn.SiLU(),
                  nn.Linear(self.HIDDEN, 2)]
        return nn.Sequential(*layers, nn.Tanh()) if bounded else nn.Sequential(*layers)

    def inverse(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Points (m, 2) -> (their latent points (m, 2), the log-determinant of the Jacobian (m,))."""
        z, log_det = x, x.new_zeros(x.shape[0])
        for i in reversed(range(len(self.s))):
            keep = self.mask[i].to(x.dtype)
            kept = z * keep
            scale = self.s[i](kept) * (1 - keep)
            shift = self.t[i](kept) * (1 - keep)
            z = kept + (1 - keep) * (z - shift) * torch.exp(-scale)
            log_det = log_det - scale.sum(1)
        return z, log_det

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """(m, 2) -> (m,): the flow's log density at each point (float32 arithmetic)."""
        z, log_det = self.inverse(x.float())
        loc, cov = self.loc.float(), self.cov.float()
        centred = z - loc
        mahalanobis = (centred @ torch.linalg.inv(cov) * centred).sum(1)
        return -0.5 * (mahalanobis + torch.logdet(cov) + 2 * math.log(2 * math.pi)) + log_det


def pose26_args(row: Row) -> RowArgs:
    """``[nc, kpt_shape]`` of an end-to-end config -> ``(nc, [K, D], reg_max, depthwise_cls, source channels)``."""
    if not row.cfg.get("end2end"):
        raise ModelConfigError(f"{row.where}: Pose26 is the end-to-end head of YOLO26; its config needs end2end: True")
    return pose_args(row)


@register_module("Pose26", table_name="utils.tasks.pose.head.EndToEndPoseHead")
class EndToEndPoseHead(EndToEndDetect):
    """YOLO26-pose's head (see the module docstring): the end-to-end detection head with keypoint trunks and outputs
    in both branch sets, and the flow of its keypoint loss."""

    task = "pose"
    yaml_args = staticmethod(pose26_args)
    KEYPOINT_SCALE, KEYPOINT_SHIFT = 1.0, 0.0  # (raw + centre) * stride

    def __init__(self, nc: int = 80, kpt_shape: Sequence[int] = (17, 3), reg_max: int = 1,
                 depthwise_cls: bool = True, ch: Sequence[int] = (), flip_idx: Sequence[int] | None = None,
                 max_det: int = MAX_DET) -> None:
        super().__init__(nc, reg_max, depthwise_cls, ch, max_det)
        self.kpt_shape = [int(kpt_shape[0]), int(kpt_shape[1])]
        k, d = self.kpt_shape
        self.nk = k * d
        self.flip_idx = None if flip_idx is None else [int(v) for v in flip_idx]
        hidden = max(ch[0] // 4, k * (d + 2))
        self.cv4 = nn.ModuleList(nn.Sequential(Conv(c, hidden, 3), Conv(hidden, hidden, 3)) for c in ch)
        self.one2one_cv4 = copy.deepcopy(self.cv4)
        self.flow_model = RealNVP()
        self.cv4_kpts = nn.ModuleList(nn.Conv2d(hidden, self.nk, 1) for _ in ch)
        self.cv4_sigma = nn.ModuleList(nn.Conv2d(hidden, 2 * k, 1) for _ in ch)
        self.one2one_cv4_kpts = copy.deepcopy(self.cv4_kpts)
        self.one2one_cv4_sigma = copy.deepcopy(self.cv4_sigma)

    @property
    def contract(self) -> OutputContract:
        return dataclasses.replace(super().contract, extra=3 * self.kpt_shape[0], task=self.task)

    def export_metadata(self) -> dict[str, Any]:
        return {**super().export_metadata(), **keypoint_metadata(self)}

    def _branch_set(self, one2one: bool) -> tuple[nn.ModuleList, ...]:
        if one2one:
            return (self.one2one_cv2, self.one2one_cv3, self.one2one_cv4, self.one2one_cv4_kpts,
                    self.one2one_cv4_sigma)
        return self.cv2, self.cv3, self.cv4, self.cv4_kpts, self.cv4_sigma

    def pose_branches(self, xs: list[torch.Tensor], one2one: bool) -> dict[str, Any]:
        """One branch set's raw outputs: the detection dict plus ``keypoints`` (and, training, ``keypoint_sigmas``)."""
        box, cls, trunk, keypoint_convs, sigma_convs = self._branch_set(one2one)
        out = self.branches(xs, box, cls)
        features = [branch(x) for branch, x in zip(trunk, xs)]
        out["keypoints"] = torch.cat([conv(f).flatten(2) for conv, f in zip(keypoint_convs, features)], 2)
        if self.training:
            out["keypoint_sigmas"] = torch.cat([conv(f).flatten(2) for conv, f in zip(sigma_convs, features)], 2)
        return out

    def forward(self, xs: list[torch.Tensor]) -> dict[str, Any] | torch.Tensor:
        if self.training:
            return {"one2many": self.pose_branches(xs, one2one=False),
                    "one2one": self.pose_branches([x.detach() for x in xs], one2one=True)}
        if not self.end_to_end:
            return self.decode_one2many(xs)
        out = self.pose_branches(xs, one2one=True)
        return self.select(super().decode(out, xywh=False), self.keypoint_columns(out))

    def keypoint_columns(self, out: dict[str, Any]) -> torch.Tensor:
        """(b, n, 3 K): each cell's keypoints (x, y, v) in input pixels."""
        return decode_keypoints(out["keypoints"], out["anchor_points"], out["stride_tensor"], self.kpt_shape,
                                self.KEYPOINT_SCALE, self.KEYPOINT_SHIFT).transpose(1, 2)

    def decode(self, out: dict[str, Any], xywh: bool = True) -> torch.Tensor:
        """The raw dict -> (b, n, 4 + nc + 3 K): the detection rows, then the keypoints (x, y, v) in input pixels."""
        return torch.cat((super().decode(out, xywh), self.keypoint_columns(out)), 2)

    def decode_one2one(self, xs: list[torch.Tensor], xywh: bool = False) -> torch.Tensor:
        return self.decode(self.pose_branches(xs, one2one=True), xywh=xywh)

    def decode_one2many(self, xs: list[torch.Tensor], xywh: bool = True) -> torch.Tensor:
        return self.decode(self.pose_branches(xs, one2one=False), xywh=xywh)
