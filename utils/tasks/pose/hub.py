"""The pose task's torch.hub entry points (hubconf.py defines one per row): the YAML name, its parameter count at the
class count of ultralytics' release files (1: person, with COCO's 17 keypoints), the figure the entry's docstring
states (tests/models/test_hub.py builds each and compares), and that class count, the entry's default."""

from __future__ import annotations

RELEASE_CLASSES = 1

ENTRIES = (
    ("yolov8n-pose", 3_295_470, RELEASE_CLASSES), ("yolov8s-pose", 11_626_046, RELEASE_CLASSES),
    ("yolov8m-pose", 26_464_462, RELEASE_CLASSES), ("yolov8l-pose", 44_489_196, RELEASE_CLASSES),
    ("yolov8x-pose", 69_491_724, RELEASE_CLASSES),
    ("yolo11n-pose", 2_874_462, RELEASE_CLASSES), ("yolo11s-pose", 9_918_238, RELEASE_CLASSES),
    ("yolo11m-pose", 20_912_364, RELEASE_CLASSES), ("yolo11l-pose", 26_169_836, RELEASE_CLASSES),
    ("yolo11x-pose", 58_798_636, RELEASE_CLASSES),
    ("yolo26n-pose", 3_679_464, RELEASE_CLASSES), ("yolo26s-pose", 11_809_352, RELEASE_CLASSES),
    ("yolo26m-pose", 24_222_664, RELEASE_CLASSES), ("yolo26l-pose", 28_626_120, RELEASE_CLASSES),
    ("yolo26x-pose", 62_731_860, RELEASE_CLASSES),
)
