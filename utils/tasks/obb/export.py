"""An oriented-box detector in the export formats (the obb task's ``export`` part): the OBB heads' TensorFlow
translations, registered with utils/deploy/tf_graph.py when this module is imported (SavedModel, TFLite), computing
what the heads compute in eval mode: the anchor-free rows (b, n, 4 + nc + 1) [x, y, w, h, class scores, angle] of
the rotated decode, and YOLO26's final rows (b, k, 7) [x, y, w, h, score, class, angle] after its top-k selection.
The other formats carry the rows by the output contract alone; the raw maps (INT8) are not decoded for them."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from utils.deploy.formats import FormatError
from utils.deploy.tf_graph import AnchorFreeDecode, Layer, Translator, dfl_bins, register_translation, top_rows
from utils.tasks.obb.head import AnchorFreeOBB, EndToEndOBB


def rotated_rows(translator: Translator, module: AnchorFreeOBB, box_branches: nn.ModuleList,
                 cls_branches: nn.ModuleList, angle_branches: nn.ModuleList) -> Layer:
    """One set of branches decoded as utils.tasks.obb.head.dist2rbox does: (b, n, 4 + nc + 1)."""
    if translator.raw_maps:
        raise FormatError("an oriented-box detector's TensorFlow export has no raw-map (INT8) form; export it in "
                          "float")
    tf = translator.tf
    boxes, classes, angles = ([translator.translate(b) for b in branches]
                              for branches in (box_branches, cls_branches, angle_branches))
    decode = AnchorFreeDecode(tf, module.nc, module.reg_max, module.stride.tolist(), True, dfl_bins(module))
    sigmoid_angle = module.sigmoid_angle

    def run(xs: list) -> Any:
        box_maps = [branch(x) for branch, x in zip(boxes, xs)]
        points, strides, sides, scores = decode.sides(box_maps, [branch(x) for branch, x in zip(classes, xs)])
        angle = decode.sides(box_maps, [branch(x) for branch, x in zip(angles, xs)], module.ne)[3]
        if sigmoid_angle:
            angle = (tf.sigmoid(angle) - 0.25) * math.pi
        half = (sides[..., 2:] - sides[..., :2]) / 2  # (right - left, bottom - top) / 2 in the box's frame
        cos, sin = tf.cos(angle), tf.sin(angle)
        centre = tf.concat([half[..., :1] * cos - half[..., 1:] * sin, half[..., :1] * sin + half[..., 1:] * cos],
                           -1) + points
        size = sides[..., :2] + sides[..., 2:]
        return tf.concat([centre * strides, size * strides, tf.sigmoid(scores), angle], -1)
    return run


def anchor_free_obb(translator: Translator, module: AnchorFreeOBB) -> Layer:
    return rotated_rows(translator, module, module.cv2, module.cv3, module.cv4)


def end_to_end_obb(translator: Translator, module: EndToEndOBB) -> Layer:
    """The one-to-one branches decoded, then YOLO26's selection with the rotated box (x, y, w, h, angle) carried;
    with ``end_to_end`` off, the one-to-many rows as the anchor-free head's."""
    if not module.end_to_end:
        return rotated_rows(translator, module, module.cv2, module.cv3, module.cv4)
    tf = translator.tf
    rows = rotated_rows(translator, module, module.one2one_cv2, module.one2one_cv3, module.one2one_cv4)
    select = top_rows(tf, module.nc, module.max_det, box_columns=5)

    def run(xs: list) -> Any:
        decoded = rows(xs)  # (b, n, 4 + nc + 1): the angle moved beside the box for the selection
        chosen = select(tf.concat([decoded[..., :4], decoded[..., -1:], decoded[..., 4:-1]], -1))  # xywhr, s, c
        return tf.concat([chosen[..., :4], chosen[..., 5:7], chosen[..., 4:5]], -1)
    return run


register_translation(AnchorFreeOBB, anchor_free_obb)
register_translation(EndToEndOBB, end_to_end_obb)
