"""The obb task's torch.hub entry points (hubconf.py defines one per row): the YAML name, its parameter count at
nc 15 (the figure the entry's docstring states; tests build each and compare) and its default class count, 15 as in
ultralytics' DOTA v1 release files (the YAMLs' own nc 80 would re-initialise a release file's head)."""

from __future__ import annotations

ENTRIES = (
    ("yolov8n-obb", 3_085_440, 15), ("yolov8s-obb", 11_427_584, 15), ("yolov8m-obb", 26_425_600, 15),
    ("yolov8l-obb", 44_490_240, 15), ("yolov8x-obb", 69_493_056, 15),
    ("yolo11n-obb", 2_664_432, 15), ("yolo11s-obb", 9_719_776, 15), ("yolo11m-obb", 20_913_408, 15),
    ("yolo11l-obb", 26_170_880, 15), ("yolo11x-obb", 58_800_256, 15),
    ("yolo26n-obb", 2_652_984, 15), ("yolo26s-obb", 10_531_832, 15), ("yolo26m-obb", 23_493_688, 15),
    ("yolo26l-obb", 27_897_144, 15), ("yolo26x-obb", 62_661_528, 15),
)
