"""A head's raw maps back into the rows of its output contract, in float, by the head's own decode rebuilt from an
exported file's metadata (its convolutions unused): for files whose graph ends before the decode (INT8 TFLite,
NCNN of YOLOv5 and YOLO26). An anchor-based head decodes by its anchors (YOLOv5's Detect), an anchor-free one by
its strides and DFL bins, YOLO26's with its top-k selection (which pnnx cannot convert)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from models.head import Detect
from models.head_anchor_free import AnchorFreeDetect
from models.head_end_to_end import EndToEndDetect
from models.registry import LIMITS
from utils.deploy.formats import FormatError, check_metadata
from utils.tasks.contract import ContractError, OutputContract
from utils.tasks.registry import get_task


def head_from_metadata(meta: dict, source: object = "metadata") -> nn.Module:
    """The Detect head (anchors and strides from the metadata, no convolutions) whose decode() turns raw maps into
    (b, n, 5 + nc) (YOLOv5's row layout); for a model of another task, the head its ``export`` part rebuilds
    (``raw_map_head(nc, anchors, contract)``: a segmenter's rows carry its mask coefficients); the fields are
    checked first (check_metadata), one FormatError line otherwise."""
    meta = check_metadata(meta, source)
    missing = [key for key in ("names", "anchors", "strides") if key not in meta]
    if missing:
        raise FormatError(f"{source}: its metadata lacks {', '.join(missing)}; re-export it with export.py")
    anchors = [[v for pair in level for v in pair] for level in meta["anchors"]]
    contract, task = recorded_contract(meta, source), get_task(recorded_contract(meta, source).task)
    rebuild = getattr(task.load("export"), "raw_map_head", None)
    if not task.base and rebuild is None:
        raise FormatError(f"{source}: the raw maps of {task.model_noun} are not decoded here; re-export it in float")
    head = Detect(len(meta["names"]), anchors, ()) if task.base else rebuild(len(meta["names"]), anchors, contract)
    head.stride.copy_(torch.tensor(meta["strides"]))
    return head.eval()


def recorded_contract(meta: dict, source: object = "metadata") -> OutputContract:
    """The output contract export.py recorded under ``head`` (a file from before contracts: YOLOv5's layout for its
    classes); one FormatError line for one that cannot be honoured."""
    head = meta.get("head")
    try:
        return OutputContract.from_metadata(head.get("contract") if isinstance(head, dict) else None,
                                            nc=len(meta.get("names") or ()) or None)
    except ContractError as e:
        raise FormatError(f"{source}: {e}") from None


class RawMapDecoder:
    """An anchor-free head's raw maps (``raw_maps``: NHWC, one (b, ny, nx, 4 * reg_max + nc) per level, P3 first,
    as an INT8 .tflite returns them) -> the rows the head's recorded contract lays out, in float, by the head's own
    decode (and YOLO26's selection): the head class rebuilt from its export metadata (``head.export_metadata()``:
    contract, stride, reg_max, max_det), its convolutions unused. Metadata from a file is checked first: a value
    out of range is a one-line FormatError."""

    def __init__(self, head_meta: Any, source: object = "the file") -> None:
        contract, strides, reg_max, max_det = checked_head_metadata(head_meta, source)
        if contract.layout not in ("xywh_cls", "xyxy_score_cls") or contract.extra:
            raise FormatError(f"{source}: raw maps of a {contract.layout} head with {contract.extra} extra columns "
                              f"({contract.task}) are not decoded here (anchor-free detection heads only)")
        self.contract, self.end_to_end, self.source = contract, contract.end_to_end, source
        channels = [4] * len(strides)  # the convolutions are never run: the smallest that builds
        self.head = (EndToEndDetect(contract.nc, reg_max, False, channels, max_det) if self.end_to_end
                     else AnchorFreeDetect(contract.nc, reg_max, False, channels)).eval()
        self.head.set_strides(torch.tensor(strides, dtype=torch.float32))

    def __call__(self, maps: Sequence[torch.Tensor]) -> torch.Tensor:
        head, box_channels = self.head, 4 * self.head.reg_max
        if len(maps) != head.nl or any(m.dim() != 4 or m.shape[-1] != box_channels + head.nc for m in maps):
            raise FormatError(f"{self.source}: expected {head.nl} maps of (b, ny, nx, {box_channels + head.nc}), "
                              f"got {[tuple(m.shape) for m in maps]}")
        b = maps[0].shape[0]
        rows = [m.float().reshape(b, -1, box_channels + head.nc) for m in maps]  # (b, ny * nx, 4 reg_max + nc)
        boxes = torch.cat([r[..., :box_channels] for r in rows], 1).transpose(1, 2)  # (b, 4 reg_max, n)
        scores = torch.cat([r[..., box_channels:] for r in rows], 1).transpose(1, 2)  # (b, nc, n)
        points, strides = head.anchors([(int(m.shape[1]), int(m.shape[2])) for m in maps], boxes)
        with torch.no_grad():
            decoded = head.decode({"boxes": boxes, "scores": scores, "anchor_points": points,
                                   "stride_tensor": strides}, xywh=not self.end_to_end)
            return head.select(decoded) if self.end_to_end else decoded


def checked_head_metadata(meta: Any, source: object) -> tuple[OutputContract, list[float], int, int]:
    """(contract, strides, reg_max, max_det) from ``source``'s head metadata, each checked (one-line FormatError)."""
    if not isinstance(meta, dict):
        raise FormatError(f"{source} returns head maps but carries no head metadata; re-export it with export.py")
    try:
        contract = OutputContract.from_metadata(meta.get("contract"))
    except ContractError as e:
        raise FormatError(f"{source}: {e}") from None
    strides, reg_max, max_det = meta.get("stride"), meta.get("reg_max", 16), meta.get("max_det", 300)
    if not (isinstance(strides, list) and 1 <= len(strides) <= LIMITS["levels"]
            and all(is_count(s, 1024) for s in strides)):
        raise FormatError(f"{source}: its head metadata's stride must be 1..{LIMITS['levels']} numbers in 1..1024")
    if not is_count(reg_max, LIMITS["reg_max"]) or not is_count(max_det, 100_000):
        raise FormatError(f"{source}: its head metadata's reg_max (1..{LIMITS['reg_max']}) or max_det (1..100000) is "
                          "out of range")
    return contract, [float(s) for s in strides], int(reg_max), int(max_det)


def is_count(value: Any, top: float) -> bool:
    """A number in 1..top that is a whole number (a stride, a bin count, a row count)."""
    return (isinstance(value, int | float) and not isinstance(value, bool) and 1 <= value <= top
            and float(value).is_integer())
