"""Run a trained detector on images, videos, a webcam or network streams and save the annotated results.

    python detect.py                                       # newest runs/train/*/weights/best.pt on data/images
    python detect.py --weights best.pt --source img.jpg    # also: folder/, 'dir/*.jpg', list.txt, video.mp4, 0
    python detect.py --weights best.onnx --source folder/ --save-txt --save-conf --save-crop
    python detect.py --weights yolov5s.pt --source rtsp://host/live --view-img    # release name, live stream
    python detect.py --weights yolov5n-seg.pt --save-txt --retina-masks           # a segmenter: masks, polygons
    python detect.py --weights best.pt --source video.mp4 --track bytetrack         # track IDs (or botsort)

Weights may be our .pt checkpoint, a YOLOv5 release file or name, an exported .torchscript or .onnx file, or an
OpenVINO folder (see export.py). Outputs go to runs/detect/exp{N}: annotated images and videos at their original
size, labels/*.txt (YOLO rows normalised to the original image; a segmenter's as YOLO segment rows, the outline of
each mask), crops/<class>/*.jpg and, with --visualize, <image>/stage*_features.png. What a task predicts beyond the
boxes (a segmenter's masks) is made, drawn under the boxes and written by its ``predict`` part
(utils/evaluation/task_outputs.py), read from the model's output contract. With --track, each tracked object's ID is
drawn and ends its label rows, and tracks/<video>.txt is each video's MOT-challenge file (utils/tracking).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import utils.distributed.openmp  # noqa: F401  first: it sets OpenMP's wait before torch loads

# isort: split
import cv2
import numpy as np
import torch

from utils import api, paths
from utils.boxes import label_rows, scale_boxes
from utils.cli import (
    FLAGS,
    Parser,
    add_flags,
    add_refused_flags,
    check_refused_flags,
    collapse_weights,
    one_weights,
    project_dir,
    run_script,
    visible_options,
)
from utils.data.sources import Frame, LoadImages, LoadStreams, LoadWebcam, load_source, media_name
from utils.deploy.runtime import InferenceModel, check_img_size, default_img_size, resolve_weights_arg
from utils.device import check_half, one_device_warning, select_device
from utils.errors import UserError
from utils.evaluation.task_outputs import BOXES_ONLY, TaskOutputs, outputs_of
from utils.evaluation.tta import augmented_forward, merges
from utils.log import LOGGER, colorstr, print_options, setup_logging
from utils.plots.annotate import class_name, draw_detections
from utils.plots.feature_maps import capture_stages, save_feature_maps
from utils.plots.viewer import Viewer
from utils.tasks.contract import postprocess
from utils.tasks.registry import all_tasks, get_task
from utils.tracking.registry import load_tracker_config
from utils.tracking.session import TrackingSession

CONF_THRES = 0.25
DEFAULT_TRACKER = "botsort"  # --track without a name: ultralytics' track mode's default tracker
TRACK_CONF_THRES = 0.1  # a tracker's second association takes detections down to its track_low_thresh (0.1)


class DetectError(UserError, ValueError):
    """A detect.py option that cannot be used; the message names the flag."""


@dataclass
class DetectResult:
    """What a run produced: the output folder and, per processed frame, (description, detections (k, 6)); for a
    task that predicts more, per name of its frame summary, per frame its value (``result.<name>``: a segmenter's
    ``outlines``, each detection's mask's largest part, (n, 2) in original pixels)."""

    save_dir: Path
    weights: Path
    detections: list[tuple[str, np.ndarray]] = field(default_factory=list)  # xyxy in original pixels, conf, cls
    extras: dict[str, list] = field(default_factory=dict)  # a task's frame summaries by name, per frame
    track_ids: list[np.ndarray] = field(default_factory=list)  # --track: per frame, each detection's track ID
    mot_files: list[Path] = field(default_factory=list)  # --track: each video's or stream's MOT-challenge file
    skipped: int = 0
    speed_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)  # pre-process, inference, NMS per image

    def __getattr__(self, name: str) -> list:
        """A task's frame summary by name (empty for a model of another task)."""
        extras = self.__dict__.get("extras") or {}
        if name in extras or any(name in task.words for task in all_tasks()):
            return extras.get(name, [])
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


def build_parser() -> argparse.ArgumentParser:
    """detect.py's parser."""
    parser = Parser(prog="detect.py", description="Detect objects in images, videos, a webcam or "
                                     "network streams")
    add_flags(parser, "weights", nargs={"weights": "+"})
    parser.add_argument("--source", type=str, default="", help="file, folder, glob, .txt list, video, webcam index, "
                        "URL (rtsp://, rtmp://, http(s)://) or .streams file of URLs (default: data/images)")
    add_flags(parser, "img_size", img_size=None)
    parser.add_argument(*FLAGS["conf_thres"][0], type=float, default=None, help=f"confidence threshold (default "
                        f"{CONF_THRES}; {TRACK_CONF_THRES} with --track, for ByteTrack's low-score association)")
    add_flags(parser, "iou_thres", "max_det", "device", iou_thres=0.45, max_det=1000)
    parser.add_argument("--view-img", action="store_true", help="show results in a window (where a display exists)")
    parser.add_argument("--classes", nargs="+", type=int, help="keep only these classes: --classes 0 2")
    add_flags(parser, "agnostic_nms", "augment")
    parser.add_argument("--visualize", action="store_true", help="save the feature maps of every stage as "
                        "images (.pt weights)")
    parser.add_argument("--vid-stride", type=int, default=1, help="video frame-rate stride: read every N-th frame")
    parser.add_argument("--track", type=str, nargs="?", default="", const=DEFAULT_TRACKER, metavar="TRACKER",
                        help="keep an ID per object across the frames of each video or stream: bytetrack, botsort, or "
                        f"a tracker YAML (data/trackers); alone: {DEFAULT_TRACKER}, as ultralytics' track mode")
    add_flags(parser, "save_txt", "save_conf")
    parser.add_argument("--save-crop", action="store_true", help="save cropped boxes to crops/<class>/")
    parser.add_argument("--retina-masks", action="store_true", help="segmenters: make the masks at the original "
                        "image's resolution (default: at the input's, then resized)")
    parser.add_argument("--nosave", action="store_true", help="do not save annotated images/videos")
    parser.add_argument("--hide-labels", action="store_true", help="draw boxes without labels")
    parser.add_argument("--hide-conf", action="store_true", help="draw labels without confidences")
    parser.add_argument("--line-thickness", type=int, default=3, help="box line thickness (pixels)")
    add_flags(parser, "half", "project", "name", "exist_ok", "trust_weights")
    add_refused_flags(parser, "dnn", "update", "data")
    return parser


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """detect.py's options (``argv=None`` reads sys.argv)."""
    opt = build_parser().parse_args(argv)
    opt.weights = collapse_weights(opt.weights)
    if opt.conf_thres is None:
        opt.conf_thres = TRACK_CONF_THRES if opt.track else CONF_THRES
    opt.project = project_dir(opt, "detect")
    return opt


def check_options(opt: argparse.Namespace, device: torch.device) -> None:
    """Refuse option values that cannot work, naming the flag."""
    check_half(opt.half, device)
    for flag in ("conf_thres", "iou_thres"):
        if not 0 <= getattr(opt, flag) <= 1:
            raise DetectError(f"--{flag.replace('_', '-')} {getattr(opt, flag)} must be within [0, 1]")
    if opt.max_det < 1 or opt.line_thickness < 1:
        raise DetectError("--max-det and --line-thickness must be at least 1")
    if opt.vid_stride < 1:
        raise DetectError(f"--vid-stride {opt.vid_stride} must be at least 1 (1 reads every frame)")


def check_model_options(opt: argparse.Namespace, model: InferenceModel) -> None:
    """Refuse flags these weights cannot serve: --visualize needs the PyTorch model, --augment a dynamic one whose
    rows go through NMS (an end-to-end head's final rows cannot be merged) and whose task columns follow the boxes
    (utils.evaluation.tta.merges)."""
    if opt.augment and not model.contract.end_to_end and not merges(model.contract):
        task = get_task(model.contract.task)
        raise DetectError(f"--augment merges boxes of three passes; {model.weights.name} is {task.model_noun}, whose "
                          f"{task.results_noun} it cannot merge: drop --augment")
    if opt.augment and model.contract.end_to_end:
        raise DetectError(f"--augment merges three passes before NMS; {model.weights.name} returns final rows "
                          f"({model.contract.layout}, no NMS): drop --augment")
    if opt.track and not model.contract.has_boxes:
        task = get_task(model.contract.task)
        raise DetectError(f"--track follows boxes across frames; {model.weights.name} is {task.model_noun}, which "
                          f"predicts {task.results_noun} and no boxes: drop --track")
    if opt.visualize and model.module is None:
        raise DetectError(f"--visualize draws the stages of the PyTorch model; {model.weights.name} is an export: "
                          "pass the .pt")
    if opt.augment and not model.dynamic:
        raise DetectError(f"--augment runs 3 image sizes; {model.weights.name} is a static export (one input "
                          "size): export it with --dynamic, or use the .pt")


def resolve_img_size(opt: argparse.Namespace, model: InferenceModel) -> tuple[int, int]:
    """The requested size on the stride grid; a static export's own size when it differs."""
    img_size = check_img_size(default_img_size(opt.img_size, model), model.stride)
    if model.img_size is not None and model.img_size != img_size:
        LOGGER.warning(f"WARNING: {model.weights.name} was exported for {list(model.img_size)} inputs; "
                       f"using that instead of --img-size {list(img_size)}")
        img_size = model.img_size
    return img_size


def summarize(det: torch.Tensor, names: list[str]) -> str:
    """``2 circles, 1 square`` for a (k, 6) detection tensor; ``no detections`` when empty."""
    if not len(det):
        return "no detections"
    parts = []
    for cls in det[:, 5].unique():
        n = int((det[:, 5] == cls).sum())
        name = class_name(names, cls)
        parts.append(f"{n} {name}{'s' * (n > 1)}")
    return ", ".join(parts)


def crop_folder(crop_dir: Path, names: list[str], cls: float) -> Path:
    """crops/<class name>/, the name made safe (paths.safe_stem: no separator or unprintable character, no leading
    dot, at most 64 characters, the class index when nothing is left); always a folder inside ``crop_dir``."""
    return paths.derived_path(crop_dir, paths.safe_stem(class_name(names, cls), str(int(cls)), limit=64))


def save_crops(image: np.ndarray, det: np.ndarray, names: list[str], crop_dir: Path, stem: str) -> None:
    """Each box cut from the (un-annotated) original image to crops/<class>/<stem>.jpg (stem2.jpg, ...)."""
    for x1, y1, x2, y2, _, cls in det:
        x1, y1, x2, y2 = (int(round(v)) for v in (x1, y1, x2, y2))
        if x2 <= x1 or y2 <= y1:
            continue
        folder = crop_folder(crop_dir, names, cls)
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(paths.increment_path(paths.derived_path(folder, stem, suffix=".jpg"))), image[y1:y2, x1:x2])


def output_stem(frame: Frame) -> str:
    """What a frame's outputs are named after: the file (or URL) stem made safe (paths.safe_stem; ``image<N>`` when
    nothing is left, as of ``...jpg``), ``webcam0``, ``stream2``."""
    if frame.kind == "webcam":
        return f"webcam{paths.safe_stem(str(frame.path), '')}"
    if frame.kind == "stream":
        return f"stream{frame.index}"
    return paths.safe_stem(frame.stem, f"image{frame.index}")


def frame_stem(frame: Frame) -> str:
    """An image's output stem; a video or stream frame's with its frame number (``clip_12``)."""
    return output_stem(frame) if frame.kind == "image" else f"{output_stem(frame)}_{frame.frame}"


class OutputWriter:
    """Saves what a run produces: annotated images and videos, label files, crops; --view-img also shows them."""

    def __init__(self, save_dir: Path, opt: argparse.Namespace, names: list[str],
                 outputs: TaskOutputs = BOXES_ONLY) -> None:
        self.save_dir, self.opt, self.names, self.outputs = save_dir, opt, names, outputs
        self.videos: dict[str, cv2.VideoWriter] = {}
        self.viewer = Viewer(opt.view_img)
        if opt.save_txt:
            (save_dir / "labels").mkdir(parents=True, exist_ok=True)

    def write(self, frame: Frame, det: np.ndarray, extras: dict[str, Any] | None = None,
              ids: np.ndarray | None = None) -> None:
        """Save (and show) one processed frame; ``det`` (k, 6) is in original-image pixels; ``extras`` what the
        model's task predicts beyond the boxes, at the original image's size (its ``image`` results and frame
        ``summary``: a segmenter's masks and outlines); ``ids`` --track's track IDs."""
        opt, extras = self.opt, extras or {}
        stem = frame_stem(frame)
        if opt.save_txt and len(det):  # as the reference does: no file for an image without detections
            shape = frame.original.shape[:2]
            rows = self._label_rows(det, extras, shape) if ids is None else [
                f"{row} {int(i)}" for k, i in enumerate(ids)  # the track ID ends each of a detection's rows
                for row in self._label_rows(det[k:k + 1], select_extras(extras, np.array([k])), shape)]
            paths.derived_path(self.save_dir, "labels", stem, suffix=".txt").write_text("".join(f"{r}\n" for r in rows))
        if opt.save_crop:
            save_crops(frame.original, det, self.names, self.save_dir / "crops", stem)
        if opt.nosave and not self.viewer.enabled:
            return
        annotated = self.outputs.draw(frame.original.copy(), det, extras)
        own = self.outputs.draw_labelled(annotated, det, extras, self.names, opt.line_thickness, opt.hide_labels,
                                         opt.hide_conf)  # the task's own drawing of its detections, else boxes
        annotated = own if own is not None else draw_detections(annotated, det[:, :4], det[:, 5], det[:, 4],
                                                                self.names, opt.line_thickness, opt.hide_labels,
                                                                opt.hide_conf, ids)
        self.viewer.show(output_stem(frame) if frame.kind != "image" else frame.path, annotated)
        if opt.nosave:
            return
        if frame.kind == "image":
            suffix = Path(media_name(frame.path)).suffix
            suffix = suffix if suffix.lower() in paths.IMG_SUFFIXES else ".jpg"
            cv2.imwrite(str(paths.derived_path(self.save_dir, output_stem(frame), suffix=suffix)), annotated)
        else:
            self._video(frame).write(annotated)

    def _label_rows(self, det: np.ndarray, extras: dict[str, Any], shape: tuple[int, int]) -> list[str]:
        rows = self.outputs.label_rows(det, extras, shape, self.opt.save_conf)
        return label_rows(det, shape, self.opt.save_conf) if rows is None else rows

    def _video(self, frame: Frame) -> cv2.VideoWriter:
        name = output_stem(frame)
        if name not in self.videos:
            height, width = frame.original.shape[:2]
            self.videos[name] = cv2.VideoWriter(str(paths.derived_path(self.save_dir, name, suffix=".mp4")),
                                                cv2.VideoWriter_fourcc(*"mp4v"), frame.fps or 30.0, (width, height))
        return self.videos[name]

    def close(self) -> None:
        for writer in self.videos.values():
            writer.release()
        self.videos.clear()
        self.viewer.close()


def feature_folder(save_dir: Path, frame: Frame) -> Path:
    """--visualize: <save_dir>/<image stem>/, or <stem>_<frame number>/ for a video or stream frame."""
    return paths.derived_path(save_dir, frame_stem(frame))


def predict(model: InferenceModel, image: torch.Tensor, opt: argparse.Namespace,
            feature_dir: Path | None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decoded predictions for one image batch: plain, or test-time augmented; stages saved with --visualize."""
    if feature_dir is None:
        return augmented_forward(model, image, model.layout, model.contract) if opt.augment else model(image)
    with capture_stages(model.module) as stages:
        pred = augmented_forward(model, image, model.layout, model.contract) if opt.augment else model(image)
    save_feature_maps(stages, feature_dir)
    return pred


def task_outputs(model: InferenceModel) -> TaskOutputs:
    """What the model's task predicts beyond the boxes, made, drawn and written (its ``predict`` part)."""
    return outputs_of(model.contract.task)


def detect_frame(model: InferenceModel, frame: Frame, opt: argparse.Namespace,
                 feature_dir: Path | None = None) -> tuple[np.ndarray, dict[str, Any], list[float]]:
    """Detections (k, 6) in original-image pixels for one frame, what the model's task predicts beyond the boxes
    at the original image's size (a segmenter's ``masks`` (k, h0, w0); nothing for a detector), and the seconds of
    each step."""
    start = time.perf_counter()
    image = torch.from_numpy(frame.image).to(model.device)
    image = image.to(model.dtype)[None] / 255  # (1, 3, h, w) in [0, 1]
    prepared = time.perf_counter()
    output = predict(model, image, opt, feature_dir)
    inferred = time.perf_counter()
    pred, others = (output[0], tuple(output[1:])) if isinstance(output, (list, tuple)) else (output, ())
    det = postprocess(pred.float(), model.contract, opt.conf_thres, opt.iou_thres, opt.classes, opt.agnostic_nms,
                      max_det=opt.max_det)[0]
    boxes0 = scale_boxes(image.shape[2:], det[:, :4].clone(), frame.original.shape[:2], frame.ratio_pad)
    extras = {} if model.contract.boxes_alone else task_outputs(model).image(
        det, others, 0, tuple(image.shape[2:]), boxes0, frame.original.shape[:2], frame.ratio_pad,
        native=opt.retina_masks)
    det = torch.cat((boxes0, det[:, 4:6]), 1)
    done = time.perf_counter()
    return det.cpu().numpy(), extras, [prepared - start, inferred - prepared, done - inferred]


def select_extras(extras: dict[str, Any], index: np.ndarray) -> dict[str, Any]:
    """A task's per-detection results (arrays, tensors and lists with one entry per detection) of the detections
    at ``index``."""
    return {name: [value[i] for i in index] if isinstance(value, list) else value[index]
            for name, value in extras.items()}


def track_frame(tracking: TrackingSession, frame: Frame, det: np.ndarray,
                extras: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any], np.ndarray]:
    """--track: the frame's detections a track holds, their task results (a segmenter's masks) and their track IDs.
    Each video, webcam and stream has its own tracker; a source's still images are one sequence, in order."""
    still = frame.kind == "image"
    stream = "images" if still else f"{frame.kind} {frame.index} {frame.path}"
    tracked = tracking.update(stream, det, frame.original, "images" if still else output_stem(frame),
                              None if still else frame.frame, frame.fps)
    return tracked.rows, select_extras(extras, tracked.index), tracked.ids


def detect_source(model: InferenceModel, source: LoadImages | LoadWebcam | LoadStreams, writer: OutputWriter,
                  opt: argparse.Namespace, tracking: TrackingSession | None = None) -> DetectResult:
    """Detect (and with ``tracking``, track) on every frame of ``source``, log one line each, save the outputs."""
    result, outputs = DetectResult(writer.save_dir, model.weights), task_outputs(model)
    totals = np.zeros(3)
    for frame in source:
        feature_dir = feature_folder(writer.save_dir, frame) if opt.visualize else None
        det, extras, seconds = detect_frame(model, frame, opt, feature_dir)
        ids = None
        if tracking is not None:
            det, extras, ids = track_frame(tracking, frame, det, extras)
            result.track_ids.append(ids)
        totals += seconds
        h, w = frame.image.shape[1:]
        summary = outputs.describe(det, extras, model.names) or summarize(torch.from_numpy(det), model.names)
        LOGGER.info(f"{frame.describe()} {h}x{w} {summary}, Done. ({seconds[1]:.3f}s)")
        frame_summary = outputs.summary(extras)
        writer.write(frame, det, {**extras, **frame_summary}, ids)
        result.detections.append((frame.describe(), det))
        for name, value in frame_summary.items():
            result.extras.setdefault(name, []).append(value)
    result.skipped = source.skipped
    result.speed_ms = tuple(totals / max(len(result.detections), 1) * 1e3)
    return result


def main(opt: argparse.Namespace) -> DetectResult:
    """Load the weights, run every frame of --source, save the outputs, print the speed summary."""
    setup_logging(0)
    print_options("detect", visible_options(opt), visible_options(parse_opt([])))
    check_refused_flags(opt)
    device = select_device(opt.device)
    if (several := one_device_warning(opt.device, "detect.py")) is not None:
        LOGGER.warning(several)
    check_options(opt, device)
    tracker = load_tracker_config(opt.track) if opt.track else None
    weights = resolve_weights_arg(one_weights(opt.weights))
    source = opt.source or str(paths.ROOT / "data" / "images")
    model = InferenceModel(weights, device, half=opt.half, trusted=opt.trust_weights)
    check_model_options(opt, model)
    img_size = resolve_img_size(opt, model)
    dataset = load_source(source, img_size, model.stride, auto=model.dynamic, vid_stride=opt.vid_stride,
                          fit=task_outputs(model).fit_input)
    save_dir = paths.new_run_folder(opt.project, opt.name, opt.exist_ok)
    with paths.discarded_on_failure(save_dir):  # a run that fails before writing anything leaves no empty folder
        model.warmup(img_size)
        writer = OutputWriter(save_dir, opt, model.names, task_outputs(model))
        tracking = None if tracker is None else \
            TrackingSession(tracker, save_dir / "tracks", concurrent=isinstance(dataset, LoadStreams))
        try:
            result = detect_source(model, dataset, writer, opt, tracking)
        finally:
            writer.close()
            if tracking is not None:
                tracking.close()
        result.mot_files = [] if tracking is None else tracking.mot_files
    if result.skipped:
        LOGGER.warning(f"WARNING: {result.skipped} unreadable image(s) skipped")
    pre, inference, nms = result.speed_ms
    LOGGER.info(f"Speed: {pre:.1f}/{inference:.1f}/{nms:.1f} ms pre-process/inference/NMS per image at shape "
                f"(1, 3, {img_size[0]}, {img_size[1]})")
    labels = f", {len(list(save_dir.glob('labels/*.txt')))} labels saved to {save_dir / 'labels'}" \
        if opt.save_txt else ""
    tracks = f", {len(result.mot_files)} MOT track file(s) in {save_dir / 'tracks'}" if result.mot_files else ""
    if paths.discard_if_unused(save_dir):  # --nosave without --save-txt/--save-crop: no empty folder left behind
        LOGGER.info("Nothing saved (--nosave)")
    else:
        LOGGER.info(f"Results saved to {colorstr('bold', str(save_dir))}{labels}{tracks}")
    return result


def run(**options: Any) -> DetectResult:
    """detect.py from Python: ``detect.run(weights="best.pt", source="images/")`` takes the command line's option
    names (utils/api.py) and returns the DetectResult: the output folder and, per image or frame, its detections
    (k, 6): x1, y1, x2, y2 in original pixels, confidence, class (and a segmenter's outlines). Errors are the
    UserErrors the command line prints."""
    argv = api.to_argv(build_parser(), options, "detect")
    return main(api.parse(parse_opt, argv, "detect"))


if __name__ == "__main__":
    sys.exit(run_script(main, parse_opt(), "detect"))
