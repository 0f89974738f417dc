"""torch.hub entry points: ``torch.hub.load(REPO_DIR, "yolov5s", source="local", pretrained=True, classes=80)``;
``yolov5n`` ... ``yolov5x``, ``yolov8n`` ... ``yolov8x``, ``yolo11n`` ... ``yolo11x`` and ``yolo26n`` ... ``yolo26x``;
and each task's own, from its record (utils/tasks/registry.py, ``hub``): the segmenters ``yolov5n_seg`` ...
``yolov5x_seg``, ``yolov8n_seg`` ... ``yolov8x_seg``, ``yolo11n_seg`` ... ``yolo11x_seg``, ``yolo26n_seg`` ...
``yolo26x_seg``, and the pose models ``yolov8n_pose`` ... ``yolo26x_pose`` (1 class, person, by default: their
release files'); the classifiers ``yolov8n_cls`` ... ``yolo26x_cls`` (1000 classes unless told, as their release
files); the oriented-box models ``yolov8n_obb`` ... ``yolo26x_obb`` (15 classes unless told, DOTA v1's, as their
release files).

Each returns a :class:`models.hub.Detector` (images in, detections in original pixels out; see models/hub.py).
``pretrained=True`` fetches the official release file (``yolov5s.pt``, ``yolo11n.pt``, ...; cached, see
utils/weights/downloads.py for ``YOLO_WEIGHTS_DIR`` / ``YOLO_WEIGHTS_URL``) and reads it without running pickled
code; ``pretrained=False`` builds the model from its YAML (``yolo11n.yaml``: the family file at scale n).
``classes`` other than the file's (80; a classifier's 1000, an oriented-box model's 15) re-initialise the head and
transfer every other tensor.
``custom(path=...)`` loads a checkpoint of ours or any export with a runtime here (.torchscript, .onnx,
*_openvino_model/, ...; see utils/deploy/formats.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from models.hub import Detector, transfer_weights
from models.yolo import Model
from utils.deploy.runtime import InferenceModel, weights_format
from utils.device import select_device
from utils.log import LOGGER
from utils.tasks.registry import all_tasks as _all_tasks
from utils.weights.checkpoint import load_checkpoint, model_from_checkpoint
from utils.weights.downloads import attempt_download_once_per_node

dependencies = ["torch", "torchvision", "numpy", "cv2", "yaml", "tqdm"]
Device = str | torch.device | None


def _device(device: Device) -> torch.device:
    return select_device("" if device is None else str(device))


def _create(name: str, pretrained: bool = True, classes: int = 80, device: Device = None,
            autoshape: bool = True) -> Detector | Model:
    """Build ``name`` (a models/*.yaml), with release weights when ``pretrained``, wrapped in a Detector."""
    if pretrained:
        weights = attempt_download_once_per_node(f"{name}.pt")
        ckpt = load_checkpoint(weights)
        model = model_from_checkpoint(ckpt, str(weights))
        if classes != model.nc:  # a new head: everything else comes from the file
            pretrained_model, model = model, Model(ckpt["model_yaml"], nc=classes)
            count = transfer_weights(model, pretrained_model.state_dict())
            LOGGER.info(f"Transferred {count}/{len(model.state_dict())} items from {weights} "
                        f"(the Detect head is re-initialised for {classes} classes)")
    else:
        model = Model(f"{name}.yaml", nc=classes)
    model = model.to(_device(device))
    return Detector(model) if autoshape else model


def custom(path: str | Path, device: Device = None, autoshape: bool = True,
           trust_weights: bool = False) -> Detector | Model:
    """A checkpoint of this project (or a release file), or an export, at ``path``, wrapped in a Detector.
    ``trust_weights``: as --trust-weights (needed for TorchScript files, which hold code)."""
    if weights_format(Path(path)).name != "pytorch":  # an export: its runtime, names and stride from its metadata
        exported = InferenceModel(path, _device(device), trusted=trust_weights).as_module()
        return Detector(exported) if autoshape else exported
    weights = attempt_download_once_per_node(path)
    model = model_from_checkpoint(load_checkpoint(weights), str(weights)).to(_device(device))
    return Detector(model) if autoshape else model


def yolov5n(pretrained: bool = True, classes: int = 80, device: Device = None,
            autoshape: bool = True) -> Detector | Model:
    """YOLOv5n: 1.9 M parameters, 4.6 GFLOPs at 640 px (the reference's figures)."""
    return _create("yolov5n", pretrained, classes, device, autoshape)


def yolov5s(pretrained: bool = True, classes: int = 80, device: Device = None,
            autoshape: bool = True) -> Detector | Model:
    """YOLOv5s: 7.2 M parameters, 16.6 GFLOPs at 640 px (the reference's figures)."""
    return _create("yolov5s", pretrained, classes, device, autoshape)


def yolov5m(pretrained: bool = True, classes: int = 80, device: Device = None,
            autoshape: bool = True) -> Detector | Model:
    """YOLOv5m: 21.2 M parameters, 49.2 GFLOPs at 640 px (the reference's figures)."""
    return _create("yolov5m", pretrained, classes, device, autoshape)


def yolov5l(pretrained: bool = True, classes: int = 80, device: Device = None,
            autoshape: bool = True) -> Detector | Model:
    """YOLOv5l: 46.6 M parameters, 109.6 GFLOPs at 640 px (the reference's figures)."""
    return _create("yolov5l", pretrained, classes, device, autoshape)


def yolov5x(pretrained: bool = True, classes: int = 80, device: Device = None,
            autoshape: bool = True) -> Detector | Model:
    """YOLOv5x: 86.7 M parameters, 206.3 GFLOPs at 640 px (the reference's figures)."""
    return _create("yolov5x", pretrained, classes, device, autoshape)


def _entry(name: str, summary: str, classes: int = 80) -> Callable[..., Detector | Model]:
    """The entry point ``name`` (a scaled YAML name such as ``yolo11n``), built by ``_create`` as the YOLOv5 ones;
    ``classes`` is its default class count (its release file's)."""
    default = classes

    def entry(pretrained: bool = True, classes: int = default, device: Device = None,
              autoshape: bool = True) -> Detector | Model:
        return _create(name, pretrained, classes, device, autoshape)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = f"{summary} (nc {default}); ``pretrained``: ultralytics' release file {name}.pt."
    return entry


yolov8n = _entry("yolov8n", "YOLOv8n: 3,157,200 parameters")
yolov8s = _entry("yolov8s", "YOLOv8s: 11,166,560 parameters")
yolov8m = _entry("yolov8m", "YOLOv8m: 25,902,640 parameters")
yolov8l = _entry("yolov8l", "YOLOv8l: 43,691,520 parameters")
yolov8x = _entry("yolov8x", "YOLOv8x: 68,229,648 parameters")
yolo11n = _entry("yolo11n", "YOLO11n: 2,624,080 parameters")
yolo11s = _entry("yolo11s", "YOLO11s: 9,458,752 parameters")
yolo11m = _entry("yolo11m", "YOLO11m: 20,114,688 parameters")
yolo11l = _entry("yolo11l", "YOLO11l: 25,372,160 parameters")
yolo11x = _entry("yolo11x", "YOLO11x: 56,966,176 parameters")
yolo26n = _entry("yolo26n", "YOLO26n: 2,572,280 parameters")
yolo26s = _entry("yolo26s", "YOLO26s: 10,009,784 parameters")
yolo26m = _entry("yolo26m", "YOLO26m: 21,896,248 parameters")
yolo26l = _entry("yolo26l", "YOLO26l: 26,299,704 parameters")
yolo26x = _entry("yolo26x", "YOLO26x: 58,993,368 parameters")


def _task_entry(name: str, parameters: int, noun: str, classes: int = 80) -> Callable[..., Detector | Model]:
    """The entry point of a task's model ``name`` (``yolov5n-seg``: Python name ``yolov5n_seg``); its Detector's
    results carry what the task predicts beyond boxes (models/hub.py); ``classes``: its release file's count."""
    entry = _entry(name, "", classes)
    entry.__name__ = entry.__qualname__ = name.replace("-", "_")
    entry.__doc__ = (f"{name}: {parameters:,} parameters (nc {classes}), {noun}; ``pretrained``: the release file "
                     f"{name}.pt.")
    return entry


for _task in _all_tasks():  # each task's entry points (its ``hub`` part: (name, parameters[, classes]) rows)
    for _name, _parameters, *_classes in _task.load("hub") or ():
        globals()[_name.replace("-", "_")] = _task_entry(_name, _parameters, _task.model_noun, *_classes)
