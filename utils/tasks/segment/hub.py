"""The segment task's torch.hub entry points (hubconf.py defines one per row): the YAML name and its parameter
count at nc 80, the figure the entry's docstring states (tests/models/test_hub.py builds each and compares)."""

from __future__ import annotations

ENTRIES = (
    ("yolov5n-seg", 1_991_549), ("yolov5s-seg", 7_621_277), ("yolov5m-seg", 21_990_397),
    ("yolov5l-seg", 47_924_957), ("yolov5x-seg", 88_819_517),
    ("yolov8n-seg", 3_409_968), ("yolov8s-seg", 11_821_056), ("yolov8m-seg", 27_285_968),
    ("yolov8l-seg", 45_997_728), ("yolov8x-seg", 71_827_888),
    ("yolo11n-seg", 2_876_848), ("yolo11s-seg", 10_113_248), ("yolo11m-seg", 22_420_896),
    ("yolo11l-seg", 27_678_368), ("yolo11x-seg", 62_142_656),
    ("yolo26n-seg", 3_126_280), ("yolo26s-seg", 11_505_800), ("yolo26m-seg", 27_112_072),
    ("yolo26l-seg", 31_515_528), ("yolo26x-seg", 70_693_800),
)
