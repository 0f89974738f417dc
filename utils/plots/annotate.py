"""Drawing detections on images: one colour per class, boxes with 'name conf' labels (OpenCV, BGR); a task draws
what it predicts beyond the boxes itself (utils/evaluation/task_outputs.py)."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

# A 20-colour palette (hex RGB) that keeps neighbouring class indices apart.
_PALETTE_HEX = (
    "FF3838", "FF9D97", "FF701F", "FFB21D", "CFD231", "48F90A", "92CC17", "3DDB86", "1A9334", "00D4BB",
    "2C99A8", "00C2FF", "344593", "6473FF", "0018EC", "8438FF", "520085", "CB38FF", "FF95C8", "FF37C7",
)
_PALETTE_BGR = tuple((int(h[4:6], 16), int(h[2:4], 16), int(h[0:2], 16)) for h in _PALETTE_HEX)


def class_color(index: int) -> tuple[int, int, int]:
    """The (b, g, r) colour of class ``index``; classes beyond the palette wrap around."""
    return _PALETTE_BGR[int(index) % len(_PALETTE_BGR)]


def class_color_rgb(index: int) -> tuple[float, float, float]:
    """The same colour as matplotlib wants it: (r, g, b) in [0, 1]."""
    b, g, r = class_color(index)
    return r / 255, g / 255, b / 255


def class_name(names: Sequence[str] | None, cls: int) -> str:
    """The name of class ``cls``, or its number when ``names`` does not list it."""
    cls = int(cls)
    return names[cls] if names is not None and 0 <= cls < len(names) else str(cls)


def _label_text(cls: int, conf: float | None, names: Sequence[str] | None, hide_conf: bool,
                track_id: int | None = None) -> str:
    """``person 0.91``; with a track ID ``id:7 person 0.91``."""
    name = class_name(names, cls) if track_id is None else f"id:{track_id} {class_name(names, cls)}"
    return name if conf is None or hide_conf else f"{name} {conf:.2f}"


def _draw_label(img: np.ndarray, text: str, corner: tuple[int, int], color: tuple[int, int, int],
                thickness: int) -> None:
    """A filled tag above the box's top-left corner (inside the box when there is no room above)."""
    font_scale = max(thickness / 3, 0.35)
    font_thickness = max(thickness - 1, 1)
    (tw, th), baseline = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font_scale, font_thickness)
    x, y = corner
    above = y - th - baseline >= 0
    y_top = y - th - baseline if above else y
    cv2.rectangle(img, (x, y_top), (x + tw, y_top + th + baseline), color, -1, cv2.LINE_AA)
    brightness = 0.299 * color[2] + 0.587 * color[1] + 0.114 * color[0]
    text_color = (0, 0, 0) if brightness > 150 else (255, 255, 255)
    cv2.putText(img, text, (x, y_top + th), cv2.FONT_HERSHEY_SIMPLEX, font_scale, text_color, font_thickness,
                cv2.LINE_AA)


def draw_detections(img_bgr: np.ndarray, boxes_xyxy: np.ndarray | Sequence, classes: np.ndarray | Sequence,
                    confs: np.ndarray | Sequence | None = None, names: Sequence[str] | None = None,
                    line_thickness: int = 2, hide_labels: bool = False, hide_conf: bool = False,
                    ids: np.ndarray | Sequence | None = None) -> np.ndarray:
    """Draw xyxy pixel boxes on a uint8 BGR image in place (class colours, 'name conf' tags, 'id:7 name conf' with
    track ``ids``); returns it."""
    boxes = np.asarray(boxes_xyxy, dtype=np.float64).reshape(-1, 4)
    classes = np.asarray(classes).reshape(-1).astype(int)
    conf_values = None if confs is None else np.asarray(confs, dtype=np.float64).reshape(-1)
    for i, (box, cls) in enumerate(zip(boxes, classes)):
        color = class_color(cls)
        p1, p2 = (int(round(box[0])), int(round(box[1]))), (int(round(box[2])), int(round(box[3])))
        cv2.rectangle(img_bgr, p1, p2, color, line_thickness, cv2.LINE_AA)
        if not hide_labels:
            conf = None if conf_values is None else float(conf_values[i])
            track_id = None if ids is None else int(ids[i])
            _draw_label(img_bgr, _label_text(int(cls), conf, names, hide_conf, track_id), p1, color, line_thickness)
    return img_bgr
