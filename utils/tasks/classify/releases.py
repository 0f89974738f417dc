"""The classify task's classes in ultralytics' release files (the weights reader's tables; plain data): the pickled
model and head classes that hold its models, the settings compared on our classes, which of our classes each of
theirs becomes, and that its head keeps no strides in the file (its model keeps those its yaml builds)."""

from __future__ import annotations

RELEASES = {
    "ultralytics": {  # yolov8n-cls ... yolo11x-cls (utils/weights/ultralytics_reader.py)
        "models": ("ultralytics.nn.tasks.ClassificationModel",),
        "heads": ("ultralytics.nn.modules.head.Classify",),
        "strideless": ("ultralytics.nn.modules.head.Classify",),
        "settings": {"Dropout": ("p",), "AdaptiveAvgPool2d": ("output_size",)},
        "aliases": {"ClassificationModel": ("Model",)},
    },
}
