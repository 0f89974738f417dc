"""The obb task's torch.hub entry points (hubconf.py defines one per row): the YAML name and its parameter count at
nc 80, the figure the entry's docstring states (tests build each and compare)."""

from __future__ import annotations

ENTRIES = (
    ("yolov8n-obb", 3_228_867), ("yolov8s-obb", 11_452_739), ("yolov8m-obb", 26_463_235),
    ("yolov8l-obb", 44_540_355), ("yolov8x-obb", 69_555_651),
    ("yolo11n-obb", 2_695_747), ("yolo11s-obb", 9_744_931), ("yolo11m-obb", 20_963_523),
    ("yolo11l-obb", 26_220_995), ("yolo11x-obb", 58_875_331),
    ("yolo26n-obb", 2_715_614), ("yolo26s-obb", 10_582_142), ("yolo26m-obb", 23_593_918),
    ("yolo26l-obb", 27_997_374), ("yolo26x-obb", 62_811_678),
)
