"""The classify task's torch.hub entry points (hubconf.py defines one per row): the YAML name, its parameter count
at nc 1000 (the figure the entry's docstring states; tests build each and compare) and its default class count,
1000 as in ultralytics' ImageNet release files."""

from __future__ import annotations

ENTRIES = (
    ("yolov8n-cls", 2_719_288, 1000), ("yolov8s-cls", 6_361_736, 1000), ("yolov8m-cls", 17_053_336, 1000),
    ("yolov8l-cls", 37_480_744, 1000), ("yolov8x-cls", 57_422_840, 1000),
    ("yolo11n-cls", 2_812_104, 1000), ("yolo11s-cls", 6_724_008, 1000), ("yolo11m-cls", 11_634_216, 1000),
    ("yolo11l-cls", 14_115_624, 1000), ("yolo11x-cls", 29_637_064, 1000),
    ("yolo26n-cls", 2_812_104, 1000), ("yolo26s-cls", 6_724_008, 1000), ("yolo26m-cls", 11_634_216, 1000),
    ("yolo26l-cls", 14_115_624, 1000), ("yolo26x-cls", 29_637_064, 1000),
)
