"""utils/tasks/segment/head_end_to_end.py: YOLO26-seg's Segment26 head and Proto26, their modes, the final rows'
coefficients and the fused prototypes by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.registry import ModelConfigError
from models.yolo import Model, load_model_config
from utils.tasks.contract import OutputContract
from utils.tasks.segment.head_end_to_end import EndToEndSegmentHead, Proto26

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(name: str) -> Model:
    cfg, _ = load_model_config(f"{name}.yaml")
    cfg.update(nc=2, scales={"n": [0.33, 0.25, 1024]}, scale="n")
    return Model(cfg)


def test_yolo26_seg_modes_prototypes_and_final_rows() -> None:
    model = tiny("yolo26-seg")
    head = model.head
    assert isinstance(head, EndToEndSegmentHead) and isinstance(head.proto, Proto26)
    assert list(dict(head.named_children())) == ["cv2", "cv3", "dfl", "one2one_cv2", "one2one_cv3", "proto", "cv4",
                                                 "one2one_cv4"]
    assert list(dict(head.proto.named_children())) == ["cv1", "upsample", "cv2", "cv3", "feat_refine", "feat_fuse",
                                                       "semseg"]
    out = model(torch.rand(2, 3, 64, 96))
    n = 8 * 12 + 4 * 6 + 2 * 3
    many, one = out["one2many"], out["one2one"]
    assert many["coefficients"].shape == one["coefficients"].shape == (2, 32, n)
    assert many["protos"].shape == (2, 32, 16, 24) and many["semantic"].shape == (2, 2, 8, 12)
    assert many["protos"].requires_grad and not one["protos"].requires_grad and not one["semantic"].requires_grad
    model.eval()
    with torch.no_grad():
        rows, protos = model(torch.rand(2, 3, 64, 96))
        head.end_to_end = False
        many_rows, _ = model(torch.rand(2, 3, 64, 96))
    assert rows.shape == (2, n, 6 + 32) and protos.shape == (2, 32, 16, 24) and many_rows.shape == (2, n, 4 + 2 + 32)
    assert head.contract == OutputContract("xywh_cls", 2, 32, "segment")
    head.end_to_end = True
    assert head.contract == OutputContract("xyxy_score_cls", 2, 32, "segment")
    meta = head.export_metadata()
    assert meta["task"] == "segment" and meta["nm"] == 32 and meta["proto_stride"] == 4.0
    not_end_to_end, _ = load_model_config("yolo26n-seg.yaml")
    not_end_to_end["end2end"] = False
    with pytest.raises(ModelConfigError, match="Segment26 is the end-to-end head"):
        Model(not_end_to_end)


def test_proto26_adds_the_upsampled_levels_to_p3() -> None:
    """With 1x1 refinements that copy their input, the fused map is P3 + nearest-upsampled P4 + P5, by hand."""
    proto = Proto26((2, 2, 2), 8, 4, 3).eval()
    for refine in proto.feat_refine:
        refine.conv.weight.data = torch.eye(2).view(2, 2, 1, 1)
        refine.bn = nn.Identity()
        refine.act = nn.Identity()
    p3, p4, p5 = torch.rand(1, 2, 4, 4), torch.rand(1, 2, 2, 2), torch.rand(1, 2, 1, 1)
    expected = p3 + p4.repeat_interleave(2, 2).repeat_interleave(2, 3) + p5.expand(1, 2, 4, 4)
    assert torch.allclose(proto.fused([p3, p4, p5]), expected)
    assert proto([p3, p4, p5]).shape == (1, 4, 8, 8)
    proto.train()
    protos, semantic = proto([p3, p4, p5])
    assert protos.shape == (1, 4, 8, 8) and semantic.shape == (1, 3, 4, 4)
