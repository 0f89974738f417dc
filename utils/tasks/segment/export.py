"""A segmenter in the export formats (the segment task's ``export`` part): its heads' TensorFlow translations,
registered with utils/deploy/tf_graph.py when this module is imported, and the head that decodes a YOLOv5
segmenter's raw maps (NCNN) from an exported file's metadata (utils/deploy/head_maps.py). The other formats carry
the prototypes as the second output by the output contract alone (``Task.outputs``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from utils.deploy.formats import FormatError
from utils.deploy.tf_graph import Layer, Translator, register_translation
from utils.tasks.contract import OutputContract
from utils.tasks.segment.head import AnchorFreeSegmentHead, Proto, Segment


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
    branches, nm, tf = [translator.translate(branch) for branch in module.cv4], module.nm, translator.tf

    def run(xs: list) -> Any:
        batch = -1 if xs[0].shape[0] is None else xs[0].shape[0]
        coefficients = tf.concat([tf.reshape(branch(x), (batch, x.shape[1] * x.shape[2], nm))
                                  for branch, x in zip(branches, xs)], 1)
        return tf.concat([rows(xs), coefficients], -1), protos(xs[0])
    return run


register_translation(Proto, proto)
register_translation(Segment, segment)
register_translation(AnchorFreeSegmentHead, anchor_free_segment)
