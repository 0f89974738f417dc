"""A segmenter in the export formats (the segment task's ``export`` part): its heads' TensorFlow translations (YOLOv5's,
YOLOv8/YOLO11's and YOLO26's Segment26 with Proto26), registered with utils/deploy/tf_graph.py when this module is
imported, and the head that decodes a YOLOv5 segmenter's raw maps (NCNN) from an exported file's metadata
(utils/deploy/head_maps.py). The other formats carry the prototypes as the second output by the output contract
alone (``Task.outputs``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from utils.deploy.formats import FormatError
from utils.deploy.tf_graph import Layer, Translator, register_translation, top_rows
from utils.tasks.contract import OutputContract
from utils.tasks.segment.head import AnchorFreeSegmentHead, Proto, Segment
from utils.tasks.segment.head_end_to_end import EndToEndSegmentHead, Proto26


def raw_map_head(nc: int, anchors: Sequence[Sequence[float]], contract: OutputContract) -> nn.Module:
    """YOLOv5's Segment head without convolutions, for its decode of raw maps (the rows carry the ``extra`` mask
    coefficients); the caller sets ``stride``."""
    return Segment.decoder(nc, anchors, contract.extra)


def proto(translator: Translator, module: Proto) -> Layer:
    cv1, upsample, cv2, cv3 = (translator.translate(m) for m in (module.cv1, module.upsample, module.cv2, module.cv3))
    return lambda x: cv3(cv2(upsample(cv1(x))))


def _refuse_raw_maps(translator: Translator) -> None:
    if translator.raw_maps:
        raise FormatError("the TensorFlow export of a segmenter has no raw-map (INT8) form; export it in float")


def segment(translator: Translator, module: Segment) -> Layer:
    """YOLOv5's Segment: Detect's rows, the mask coefficients left raw, and the prototypes of the P3 map."""
    _refuse_raw_maps(translator)
    rows, protos = translator.detect(module, scored=5 + module.nc), proto(translator, module.proto)
    return lambda xs: (rows(xs), protos(xs[0]))


def anchor_free_segment(translator: Translator, module: AnchorFreeSegmentHead) -> Layer:
    """YOLOv8/YOLO11's Segment: the anchor-free rows with cv4's coefficients appended (level by level, row-major,
    as the head flattens them), and the prototypes of the P3 map."""
    _refuse_raw_maps(translator)
    rows, protos = translator.anchor_free_detect(module), proto(translator, module.proto)
    coefficients, tf = coefficient_columns(translator, module.cv4, module.nm), translator.tf
    return lambda xs: (tf.concat([rows(xs), coefficients(xs)], -1), protos(xs[0]))


def proto26(translator: Translator, module: Proto26) -> Layer:
    """Proto26: P3 plus each later level refined and brought to P3's size (nearest), fused, then Proto's layers."""
    refine = [translator.translate(m) for m in module.feat_refine]
    fuse, base, tf = translator.translate(module.feat_fuse), proto(translator, module), translator.tf

    def run(xs: list) -> Any:
        fused = xs[0]
        for layer, x in zip(refine, xs[1:]):
            fused = fused + tf.image.resize(layer(x), (fused.shape[1], fused.shape[2]), "nearest")
        return base(fuse(fused))
    return run


def coefficient_columns(translator: Translator, branches: Any, nm: int) -> Layer:
    """Per level the coefficient branch -> (b, n, nm), level by level, row-major (as the heads flatten them)."""
    layers, tf = [translator.translate(branch) for branch in branches], translator.tf

    def run(xs: list) -> Any:
        batch = -1 if xs[0].shape[0] is None else xs[0].shape[0]
        return tf.concat([tf.reshape(layer(x), (batch, x.shape[1] * x.shape[2], nm)) for layer, x in zip(layers, xs)],
                         1)
    return run


def end_to_end_segment(translator: Translator, module: EndToEndSegmentHead) -> Layer:
    """YOLO26's Segment26: the one-to-one rows (xyxy) with their coefficients, then the top-k selection (the
    one-to-many decode, xywh, when ``end_to_end`` is off), and Proto26's prototypes of every level."""
    _refuse_raw_maps(translator)
    one2one, tf = module.end_to_end, translator.tf
    box, cls, coefficient = ((module.one2one_cv2, module.one2one_cv3, module.one2one_cv4) if one2one
                             else (module.cv2, module.cv3, module.cv4))
    rows = translator.anchor_free_branches(module, box, cls, xywh=not one2one, final=None)
    coefficients, protos = coefficient_columns(translator, coefficient, module.nm), proto26(translator, module.proto)
    final = top_rows(tf, module.nc, module.max_det) if one2one else (lambda x: x)
    return lambda xs: (final(tf.concat([rows(xs), coefficients(xs)], -1)), protos(xs))


register_translation(Proto, proto)
register_translation(Proto26, proto26)
register_translation(EndToEndSegmentHead, end_to_end_segment)
register_translation(Segment, segment)
register_translation(AnchorFreeSegmentHead, anchor_free_segment)
