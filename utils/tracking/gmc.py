"""Camera-motion compensation for BoT-SORT: the affine motion of the background between consecutive frames.

Estimated on grey, downscaled frames (the longer side at most ``MAX_SIDE`` pixels), and returned in the frame's own
pixels as a (2, 3) matrix mapping the previous frame's points to the current frame's:

- ``sparseOptFlow``: corners of the previous frame away from its detections (objects move on their own) followed
  by pyramidal Lucas-Kanade optical flow, and a rotation + scale + translation fitted with RANSAC;
- ``ecc``: OpenCV's enhanced-correlation alignment of the two frames (a Euclidean motion);
- ``none``: the identity (a still camera).

Whatever fails (a flat frame, too few corners, no convergence) is the identity for that frame: the tracker then
predicts as without compensation.
"""

from __future__ import annotations

import cv2
import numpy as np

MAX_SIDE = 480  # frames are downscaled to at most this many pixels a side before estimating
MIN_POINTS = 8  # fewer tracked corners than this: no estimate


def identity() -> np.ndarray:
    return np.eye(2, 3)


class CameraMotion:
    """One video's camera motion, frame after frame; ``estimate`` is called once per frame, in order."""

    def __init__(self, method: str = "sparseOptFlow") -> None:
        self.method = method
        self.previous: np.ndarray | None = None  # the previous frame, grey and downscaled
        self.previous_boxes = np.zeros((0, 4))
        self.scale = 1.0

    def estimate(self, frame_bgr: np.ndarray, boxes: np.ndarray) -> np.ndarray:
        """The (2, 3) motion from the previous frame to ``frame_bgr`` (the identity for the first frame);
        ``boxes`` (n, 4) are this frame's detections in its pixels, kept out of the next estimate's corners."""
        if self.method == "none":
            return identity()
        grey = self._prepare(frame_bgr)
        previous, previous_boxes = self.previous, self.previous_boxes
        self.previous, self.previous_boxes = grey, np.asarray(boxes, np.float64).reshape(-1, 4) / self.scale
        if previous is None or previous.shape != grey.shape:
            return identity()
        small = _ecc(previous, grey) if self.method == "ecc" else _sparse_flow(previous, grey, previous_boxes)
        if small is None:
            return identity()
        small[:, 2] *= self.scale  # the translation back in the frame's pixels; the linear part has no unit
        return small

    def _prepare(self, frame_bgr: np.ndarray) -> np.ndarray:
        grey = cv2.cvtColor(frame_bgr, cv2.COLOR_BGR2GRAY) if frame_bgr.ndim == 3 else frame_bgr
        self.scale = max(1.0, max(grey.shape[:2]) / MAX_SIDE)
        if self.scale > 1:
            size = (max(1, round(grey.shape[1] / self.scale)), max(1, round(grey.shape[0] / self.scale)))
            grey = cv2.resize(grey, size, interpolation=cv2.INTER_AREA)
        return grey


def _sparse_flow(previous: np.ndarray, current: np.ndarray, boxes: np.ndarray) -> np.ndarray | None:
    """Corners of ``previous`` outside ``boxes`` followed into ``current``; their RANSAC partial-affine fit."""
    mask = np.full(previous.shape, 255, np.uint8)
    height, width = previous.shape
    for x1, y1, x2, y2 in boxes:
        x1, y1 = max(int(x1), 0), max(int(y1), 0)
        x2, y2 = min(int(np.ceil(x2)), width), min(int(np.ceil(y2)), height)
        if x2 > x1 and y2 > y1:
            mask[y1:y2, x1:x2] = 0
    corners = cv2.goodFeaturesToTrack(previous, maxCorners=400, qualityLevel=0.01, minDistance=3, blockSize=3,
                                      mask=mask)
    if corners is None or len(corners) < MIN_POINTS:
        return None
    moved, status, _ = cv2.calcOpticalFlowPyrLK(previous, current, corners, None)
    if moved is None:
        return None
    found = status.reshape(-1).astype(bool)
    if found.sum() < MIN_POINTS:
        return None
    affine, _ = cv2.estimateAffinePartial2D(corners[found], moved[found], method=cv2.RANSAC)
    return None if affine is None else affine.astype(np.float64)


def _ecc(previous: np.ndarray, current: np.ndarray) -> np.ndarray | None:
    """The Euclidean warp taking ``previous``'s points onto ``current``'s, by OpenCV's ECC (None: no convergence)."""
    warp = np.eye(2, 3, dtype=np.float32)
    criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 100, 1e-5)
    try:
        _, warp = cv2.findTransformECC(previous, current, warp, cv2.MOTION_EUCLIDEAN, criteria, None, 5)
    except cv2.error:
        return None
    return warp.astype(np.float64)
