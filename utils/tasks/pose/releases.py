"""The pose task's classes in ultralytics' release files (the weights reader's tables; plain data): the pickled
model and head classes of yolov8n-pose ... yolo26x-pose, the constructor settings compared on our head classes (the
keypoint shape and count, and the Linear layers of YOLO26's flow), and which of our classes each of theirs
becomes."""

from __future__ import annotations

RELEASES = {
    "ultralytics": {  # utils/weights/ultralytics_reader.py
        "models": ("ultralytics.nn.tasks.PoseModel",),
        "heads": ("ultralytics.nn.modules.head.Pose", "ultralytics.nn.modules.head.Pose26"),
        "settings": {"AnchorFreePoseHead": ("nc", "nl", "reg_max", "no", "kpt_shape", "nk"),
                     "EndToEndPoseHead": ("nc", "nl", "reg_max", "no", "kpt_shape", "nk"),
                     "Linear": ("in_features", "out_features")},
        "aliases": {"PoseModel": ("Model",), "Pose": ("AnchorFreePoseHead",), "Pose26": ("EndToEndPoseHead",)},
    },
}
