"""The segment task's classes in other projects' release files (the weights readers' tables; plain data): the
pickled model and head classes that hold its models, the constructor settings compared on our head classes, and
which of our classes each of theirs becomes."""

from __future__ import annotations

RELEASES = {
    "yolov5": {  # YOLOv5 v7.0's segmentation models (utils/weights/release_reader.py)
        "models": ("models.yolo.SegmentationModel",),
        "settings": {"Segment": ("nc", "na", "nl", "nm", "npr", "no")},
        "aliases": {"SegmentationModel": ("Model",)},
    },
    "ultralytics": {  # yolov8n-seg ... yolo11x-seg, yolo26n-seg ... (utils/weights/ultralytics_reader.py)
        "models": ("ultralytics.nn.tasks.SegmentationModel",),
        "heads": ("ultralytics.nn.modules.head.Segment", "ultralytics.nn.modules.head.Segment26"),
        "settings": {"AnchorFreeSegmentHead": ("nc", "nl", "reg_max", "no", "nm", "npr"),
                     "EndToEndSegmentHead": ("nc", "nl", "reg_max", "no", "nm", "npr")},
        "aliases": {"SegmentationModel": ("Model",), "Segment": ("AnchorFreeSegmentHead",),
                    "Segment26": ("EndToEndSegmentHead",)},
    },
}
