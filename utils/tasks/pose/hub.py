"""The pose task's torch.hub entry points (hubconf.py defines one per row): the YAML name and its parameter count at
nc 80, the figure the entry's docstring states (tests/models/test_hub.py builds each and compares)."""

from __future__ import annotations

ENTRIES = (
    ("yolov8n-pose", 3_441_627), ("yolov8s-pose", 11_656_619), ("yolov8m-pose", 26_510_203),
    ("yolov8l-pose", 44_550_105), ("yolov8x-pose", 69_567_801),
    ("yolo11n-pose", 2_908_507), ("yolo11s-pose", 9_948_811), ("yolo11m-pose", 20_973_273),
    ("yolo11l-pose", 26_230_745), ("yolo11x-pose", 58_889_881),
    ("yolo26n-pose", 3_747_554), ("yolo26s-pose", 11_870_498), ("yolo26m-pose", 24_344_482),
    ("yolo26l-pose", 28_747_938), ("yolo26x-pose", 62_914_350),
)
