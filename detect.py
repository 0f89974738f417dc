"""Run a trained detector on images, videos or a webcam and save the annotated results.

    python detect.py                                       # newest runs/train/*/weights/best.pt on data/images
    python detect.py --weights best.pt --source img.jpg    # also: folder/, 'dir/*.jpg', list.txt, video.mp4, 0
    python detect.py --weights best.onnx --source folder/ --save-txt --save-conf --save-crop

Weights may be our .pt checkpoint, an exported .torchscript or an .onnx file (see export.py).
Outputs go to runs/detect/exp{N}: annotated images and videos at their original size,
labels/*.txt (YOLO rows normalised to the original image) and crops/<class>/*.jpg.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch

from utils import paths
from utils.annotate import class_name, draw_detections
from utils.backends import DetectBackend, check_img_size, find_trained_weights
from utils.boxes import label_rows, non_max_suppression, scale_boxes
from utils.cli import add_flags, project_dir, run_main
from utils.device import select_device
from utils.errors import UserError
from utils.log import LOGGER, colorstr, print_options, setup_logging
from utils.sources import Frame, LoadImages, LoadWebcam, load_source


class DetectError(UserError, ValueError):
    """A detect.py option that cannot be used; the message names the flag."""


@dataclass
class DetectResult:
    """What a run produced: the output folder and, per processed frame, (description, detections (k, 6))."""

    save_dir: Path
    weights: Path
    detections: list[tuple[str, np.ndarray]] = field(default_factory=list)  # xyxy in original pixels, conf, cls
    skipped: int = 0
    speed_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)  # pre-process, inference, NMS per image


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """detect.py's options (``argv=None`` reads sys.argv)."""
    parser = argparse.ArgumentParser(prog="detect.py", description="Detect objects in images, videos or a webcam")
    add_flags(parser, "weights")
    parser.add_argument("--source", type=str, default="", help="file, folder, glob, .txt list, video or "
                        "webcam index (default: data/images)")
    add_flags(parser, "img_size", "conf_thres", "iou_thres", "max_det", "device", conf_thres=0.25, iou_thres=0.45,
              max_det=1000)
    parser.add_argument("--classes", nargs="+", type=int, help="keep only these classes: --classes 0 2")
    add_flags(parser, "agnostic_nms", "save_txt", "save_conf")
    parser.add_argument("--save-crop", action="store_true", help="save cropped boxes to crops/<class>/")
    parser.add_argument("--nosave", action="store_true", help="do not save annotated images/videos")
    parser.add_argument("--hide-labels", action="store_true", help="draw boxes without labels")
    parser.add_argument("--hide-conf", action="store_true", help="draw labels without confidences")
    parser.add_argument("--line-thickness", type=int, default=3, help="box line thickness (pixels)")
    add_flags(parser, "half", "project", "name", "exist_ok", "trust_weights")
    opt = parser.parse_args(argv)
    opt.project = project_dir(opt, "detect")
    return opt


def check_options(opt: argparse.Namespace, device: torch.device) -> None:
    """Refuse option values that cannot work, naming the flag."""
    if opt.half and device.type != "cuda":
        raise DetectError(f"--half needs a CUDA device (this run uses {device}); drop --half or pass --device 0")
    for flag in ("conf_thres", "iou_thres"):
        if not 0 <= getattr(opt, flag) <= 1:
            raise DetectError(f"--{flag.replace('_', '-')} {getattr(opt, flag)} must be within [0, 1]")
    if opt.max_det < 1 or opt.line_thickness < 1:
        raise DetectError("--max-det and --line-thickness must be at least 1")


def resolve_img_size(opt: argparse.Namespace, backend: DetectBackend) -> tuple[int, int]:
    """The requested size on the stride grid; a static export's own size when it differs."""
    img_size = check_img_size(opt.img_size, backend.stride)
    if backend.img_size is not None and backend.img_size != img_size:
        LOGGER.warning(f"WARNING: {backend.weights.name} was exported for {list(backend.img_size)} inputs; "
                       f"using that instead of --img-size {list(img_size)}")
        img_size = backend.img_size
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


def save_crops(image: np.ndarray, det: np.ndarray, names: list[str], crop_dir: Path, stem: str) -> None:
    """Each box cut from the (un-annotated) original image to crops/<class>/<stem>.jpg (stem2.jpg, ...)."""
    for x1, y1, x2, y2, _, cls in det:
        x1, y1, x2, y2 = (int(round(v)) for v in (x1, y1, x2, y2))
        if x2 <= x1 or y2 <= y1:
            continue
        name = class_name(names, cls)
        folder = crop_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(paths.increment_path(folder / f"{stem}.jpg")), image[y1:y2, x1:x2])


class OutputWriter:
    """Saves what a run produces: annotated images and videos, label files, crops."""

    def __init__(self, save_dir: Path, opt: argparse.Namespace, names: list[str]) -> None:
        self.save_dir, self.opt, self.names = save_dir, opt, names
        self.videos: dict[str, cv2.VideoWriter] = {}
        if opt.save_txt:
            (save_dir / "labels").mkdir(parents=True, exist_ok=True)

    def write(self, frame: Frame, det: np.ndarray) -> None:
        """Save one processed frame; ``det`` (k, 6) is in original-image pixels."""
        opt = self.opt
        stem = Path(frame.path).stem if frame.kind == "image" else f"{Path(frame.path).stem}_{frame.frame}"
        if opt.save_txt and len(det):  # as the reference does: no file for an image without detections
            rows = label_rows(det, frame.original.shape[:2], opt.save_conf)
            (self.save_dir / "labels" / f"{stem}.txt").write_text("".join(f"{r}\n" for r in rows))
        if opt.save_crop:
            save_crops(frame.original, det, self.names, self.save_dir / "crops", stem)
        if opt.nosave:
            return
        annotated = draw_detections(frame.original.copy(), det[:, :4], det[:, 5], det[:, 4], self.names,
                                    opt.line_thickness, opt.hide_labels, opt.hide_conf)
        if frame.kind == "image":
            cv2.imwrite(str(self.save_dir / Path(frame.path).name), annotated)
        else:
            self._video(frame).write(annotated)

    def _video(self, frame: Frame) -> cv2.VideoWriter:
        if frame.path not in self.videos:
            name = Path(frame.path).stem if frame.kind == "video" else f"webcam{frame.path}"
            height, width = frame.original.shape[:2]
            self.videos[frame.path] = cv2.VideoWriter(str(self.save_dir / f"{name}.mp4"),
                                                      cv2.VideoWriter_fourcc(*"mp4v"), frame.fps or 30.0,
                                                      (width, height))
        return self.videos[frame.path]

    def close(self) -> None:
        for writer in self.videos.values():
            writer.release()
        self.videos.clear()


def detect_frame(backend: DetectBackend, frame: Frame, opt: argparse.Namespace) -> tuple[np.ndarray, list[float]]:
    """Detections (k, 6) in original-image pixels for one frame, and the seconds of each step."""
    start = time.perf_counter()
    image = torch.from_numpy(frame.image).to(backend.device)
    image = (image.half() if backend.half else image.float())[None] / 255  # (1, 3, h, w) in [0, 1]
    prepared = time.perf_counter()
    pred = backend(image)
    inferred = time.perf_counter()
    det = non_max_suppression(pred.float(), opt.conf_thres, opt.iou_thres, opt.classes, opt.agnostic_nms,
                              max_det=opt.max_det)[0]
    det[:, :4] = scale_boxes(image.shape[2:], det[:, :4], frame.original.shape[:2], frame.ratio_pad)
    done = time.perf_counter()
    return det.cpu().numpy(), [prepared - start, inferred - prepared, done - inferred]


def run(backend: DetectBackend, source: LoadImages | LoadWebcam, writer: OutputWriter,
        opt: argparse.Namespace) -> DetectResult:
    """Detect on every frame of ``source``, log one line each, save the outputs."""
    result = DetectResult(writer.save_dir, backend.weights)
    totals = np.zeros(3)
    for frame in source:
        det, seconds = detect_frame(backend, frame, opt)
        totals += seconds
        h, w = frame.image.shape[1:]
        summary = summarize(torch.from_numpy(det), backend.names)
        LOGGER.info(f"{frame.describe()} {h}x{w} {summary}, Done. ({seconds[1]:.3f}s)")
        writer.write(frame, det)
        result.detections.append((frame.describe(), det))
    result.skipped = source.skipped
    result.speed_ms = tuple(totals / max(len(result.detections), 1) * 1e3)
    return result


def main(opt: argparse.Namespace) -> DetectResult:
    """Load the weights, run every frame of --source, save the outputs, print the speed summary."""
    setup_logging(0)
    print_options("detect", opt)
    weights = Path(opt.weights) if opt.weights else find_trained_weights()
    source = opt.source or str(paths.ROOT / "data" / "images")
    device = select_device(opt.device)
    check_options(opt, device)
    backend = DetectBackend(weights, device, half=opt.half, trusted=opt.trust_weights)
    img_size = resolve_img_size(opt, backend)
    dataset = load_source(source, img_size, backend.stride, auto=backend.dynamic)
    save_dir = paths.increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok, mkdir=True)
    backend.warmup(img_size)
    writer = OutputWriter(save_dir, opt, backend.names)
    try:
        result = run(backend, dataset, writer, opt)
    finally:
        writer.close()
    if result.skipped:
        LOGGER.warning(f"WARNING: {result.skipped} unreadable image(s) skipped")
    pre, inference, nms = result.speed_ms
    LOGGER.info(f"Speed: {pre:.1f}/{inference:.1f}/{nms:.1f} ms pre-process/inference/NMS per image at shape "
                f"(1, 3, {img_size[0]}, {img_size[1]})")
    labels = f", {len(list(save_dir.glob('labels/*.txt')))} labels saved to {save_dir / 'labels'}" \
        if opt.save_txt else ""
    LOGGER.info(f"Results saved to {colorstr('bold', str(save_dir))}{labels}")
    return result


if __name__ == "__main__":
    sys.exit(run_main(main, parse_opt(), "detect"))
