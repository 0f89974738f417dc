"""A pose model in the export formats (the pose task's ``export`` part): its heads' TensorFlow translations
(SavedModel, TFLite), registered with utils/deploy/tf_graph.py when this module is imported. The other formats
(TorchScript, ONNX, OpenVINO, NCNN, Core ML) carry the keypoints in the rows' columns by the output contract alone.

The translations compute what the PyTorch heads compute in eval mode (utils/tasks/pose/head.py): the detection
rows, then each cell's keypoints decoded in input pixels, x, y and visibility; YOLO26's head then its top-k
selection, which carries the keypoint columns of the cells it keeps. A raw-map (INT8) export decodes on the host
from its maps, which has no keypoint branch: it is refused in one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from models.head_anchor_free import make_anchors
from utils.deploy.formats import FormatError
from utils.deploy.tf_graph import Layer, Translator, register_translation, top_rows
from utils.tasks.pose.head import AnchorFreePoseHead, EndToEndPoseHead


def keypoint_decode(translator: Translator, head: Any, trunks: Any, outputs: Any) -> Layer:
    """Per level the keypoint branch (``trunks``, then ``outputs`` when the head splits it) -> (b, n, 3 K) in input
    pixels, P3 first: x, y = (scale * raw + cell centre + shift) * stride, visibility the sigmoid (1 for D = 2)."""
    tf, (count, dims) = translator.tf, head.kpt_shape
    branches = [translator.translate(branch) for branch in trunks]
    tails = None if outputs is None else [translator.translate(branch) for branch in outputs]
    scale, shift, strides = float(head.KEYPOINT_SCALE), float(head.KEYPOINT_SHIFT), head.stride.tolist()

    def run(xs: list) -> Any:
        maps = [branch(x) for branch, x in zip(branches, xs)]
        if tails is not None:
            maps = [tail(m) for tail, m in zip(tails, maps)]
        batch = -1 if maps[0].shape[0] is None else maps[0].shape[0]
        sizes = [(int(m.shape[1]), int(m.shape[2])) for m in maps]
        points, cell_strides = (t.numpy() for t in make_anchors(sizes, strides))  # (n, 2), (n, 1)
        raw = tf.concat([tf.reshape(m, (batch, h * w, count, dims)) for m, (h, w) in zip(maps, sizes)], 1)
        xy = (raw[..., :2] * scale + points[None, :, None, :] + shift) * cell_strides[None, :, :, None]
        visible = tf.sigmoid(raw[..., 2:3]) if dims == 3 else tf.ones_like(xy[..., :1])
        return tf.reshape(tf.concat([xy, visible], -1), (batch, int(np.sum([h * w for h, w in sizes])), 3 * count))
    return run


def _refuse_raw_maps(translator: Translator) -> None:
    if translator.raw_maps:
        raise FormatError("the TensorFlow export of a pose model has no raw-map (INT8) form; export it in float")


def anchor_free_pose(translator: Translator, module: AnchorFreePoseHead) -> Layer:
    """YOLOv8/YOLO11's Pose: the anchor-free rows (xywh) with the keypoint columns appended."""
    _refuse_raw_maps(translator)
    rows = translator.anchor_free_branches(module, module.cv2, module.cv3, xywh=True, final=None)
    keypoints, tf = keypoint_decode(translator, module, module.cv4, None), translator.tf
    return lambda xs: tf.concat([rows(xs), keypoints(xs)], -1)


def end_to_end_pose(translator: Translator, module: EndToEndPoseHead) -> Layer:
    """YOLO26's Pose26: the one-to-one rows (xyxy) with their keypoint columns, then the top-k selection (the
    one-to-many decode, xywh, for NMS when ``end_to_end`` is off)."""
    _refuse_raw_maps(translator)
    one2one, tf = module.end_to_end, translator.tf
    box, cls, trunk, kpts = ((module.one2one_cv2, module.one2one_cv3, module.one2one_cv4, module.one2one_cv4_kpts)
                             if one2one else (module.cv2, module.cv3, module.cv4, module.cv4_kpts))
    rows = translator.anchor_free_branches(module, box, cls, xywh=not one2one, final=None)
    keypoints = keypoint_decode(translator, module, trunk, kpts)
    final = top_rows(tf, module.nc, module.max_det) if one2one else (lambda x: x)
    return lambda xs: final(tf.concat([rows(xs), keypoints(xs)], -1))


register_translation(AnchorFreePoseHead, anchor_free_pose)
register_translation(EndToEndPoseHead, end_to_end_pose)
