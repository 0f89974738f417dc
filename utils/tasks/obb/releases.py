"""The obb task's classes in ultralytics' release files (the weights reader's tables; plain data): the pickled
model and head classes that hold its models, the constructor settings compared on our head classes, and which of
our classes each of theirs becomes."""

from __future__ import annotations

RELEASES = {
    "ultralytics": {  # yolov8n-obb ... yolo26x-obb (utils/weights/ultralytics_reader.py)
        "models": ("ultralytics.nn.tasks.OBBModel",),
        "heads": ("ultralytics.nn.modules.head.OBB", "ultralytics.nn.modules.head.OBB26"),
        "settings": {"AnchorFreeOBB": ("nc", "nl", "reg_max", "no", "ne"),
                     "EndToEndOBB": ("nc", "nl", "reg_max", "no", "ne")},
        "aliases": {"OBBModel": ("Model",), "OBB": ("AnchorFreeOBB",), "OBB26": ("EndToEndOBB",)},
    },
}
