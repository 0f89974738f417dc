"""Inputs for detect.py: an image file, a folder, a glob, a .txt list of paths, a video file or a webcam.

Every source yields ``Frame``s: the letterboxed network input (3, h, w) RGB uint8, the original
BGR image (outputs keep its size) and where it came from. Unreadable images are skipped with a
warning and counted; a missing source, an empty folder or a video that cannot be opened raise a
one-line ``SourceError``.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from utils.augment import letterbox
from utils.errors import UserError
from utils.log import LOGGER
from utils.paths import IMG_SUFFIXES, VID_SUFFIXES


class SourceError(UserError, ValueError):
    """A --source that cannot be read; the message names it and what to do."""


@dataclass
class Frame:
    """One network input and where it came from (``frame``/``frames`` are 1-based, 0 for still images)."""

    path: str
    image: np.ndarray  # (3, h, w) RGB uint8, letterboxed, contiguous
    original: np.ndarray  # (h0, w0, 3) BGR uint8 as read
    ratio_pad: tuple  # ((gain, gain), (pad_w, pad_h)) for utils.boxes.scale_boxes
    kind: str  # "image", "video" or "webcam"
    index: int  # 1-based position among the source's files
    count: int  # number of files in the source
    frame: int = 0
    frames: int = 0
    fps: float = 0.0  # of a video or webcam, for the output video

    def describe(self) -> str:
        """``image 1/3 path:`` / ``video 1/1 (frame 3/30) path:`` / ``webcam 0 (frame 3):``."""
        if self.kind == "video":
            return f"video {self.index}/{self.count} (frame {self.frame}/{self.frames}) {self.path}:"
        if self.kind == "webcam":
            return f"webcam {self.path} (frame {self.frame}):"
        return f"image {self.index}/{self.count} {self.path}:"


def letterbox_image(image_bgr: np.ndarray, img_size: int | tuple[int, int], stride: int = 32,
                    auto: bool = True) -> tuple[np.ndarray, tuple]:
    """BGR image -> ((3, h, w) RGB uint8 network input, ratio_pad for scale_boxes)."""
    boxed, ratio, pad = letterbox(image_bgr, img_size, stride=stride, auto=auto)
    chw = np.ascontiguousarray(boxed.transpose(2, 0, 1)[::-1])  # HWC BGR -> CHW RGB
    return chw, ((ratio[1], ratio[0]), pad)


def collect_files(source: str | Path) -> list[Path]:
    """The image and video files a source names: a file, a folder, a glob or a .txt list of paths."""
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file())
    elif path.suffix.lower() == ".txt" and path.is_file():
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        files = [Path(line) if Path(line).is_absolute() or Path(line).exists() else path.parent / line
                 for line in lines]
    elif path.is_file():
        files = [path]
    elif any(c in text for c in "*?["):
        files = [Path(p) for p in sorted(glob.glob(text, recursive=True)) if Path(p).is_file()]
        if not files:
            raise SourceError(f"--source {text}: the pattern matches no files")
    else:
        raise SourceError(f"--source {text} does not exist (give an image, a folder, a glob, a .txt list, "
                          "a video or a webcam index)")
    media = [p for p in files if p.suffix.lower() in IMG_SUFFIXES | VID_SUFFIXES]
    if not media:
        raise SourceError(f"--source {text}: no images or videos found (supported: "
                          f"{' '.join(sorted(IMG_SUFFIXES | VID_SUFFIXES))})")
    return media


def open_video(path: str | int) -> cv2.VideoCapture:
    """An opened capture, or a SourceError naming the video (OpenCV's own multi-line complaints silenced)."""
    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        capture = cv2.VideoCapture(path)
    finally:
        cv2.utils.logging.setLogLevel(level)
    if not capture.isOpened():
        capture.release()
        kind = "webcam" if isinstance(path, int) else "video"
        raise SourceError(f"--source: cannot open {kind} {path} (missing codec, damaged file or no device)")
    return capture


class LoadImages:
    """Images and videos from files; videos are read frame by frame."""

    def __init__(self, source: str | Path, img_size: int | tuple[int, int] = 640, stride: int = 32,
                 auto: bool = True) -> None:
        self.files = collect_files(source)
        self.img_size, self.stride, self.auto = img_size, stride, auto
        self.skipped = 0  # unreadable images, counted and reported
        self.videos = [p for p in self.files if p.suffix.lower() in VID_SUFFIXES]
        for video in self.videos:  # fail before any work when a video cannot be opened
            open_video(str(video)).release()

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[Frame]:
        for index, path in enumerate(self.files, 1):
            if path.suffix.lower() in VID_SUFFIXES:
                yield from self._video_frames(path, index)
                continue
            original = cv2.imread(str(path)) if path.is_file() else None
            if original is None:
                self.skipped += 1
                LOGGER.warning(f"WARNING: skipping unreadable image {path}"
                               f"{'' if path.is_file() else ' (file not found)'}")
                continue
            image, ratio_pad = letterbox_image(original, self.img_size, self.stride, self.auto)
            yield Frame(str(path), image, original, ratio_pad, "image", index, len(self.files))

    def _video_frames(self, path: Path, index: int) -> Iterator[Frame]:
        capture = open_video(str(path))
        frames = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = capture.get(cv2.CAP_PROP_FPS) or 30.0
        try:
            frame = 0
            while True:
                ok, original = capture.read()
                if not ok:
                    break
                frame += 1
                image, ratio_pad = letterbox_image(original, self.img_size, self.stride, self.auto)
                yield Frame(str(path), image, original, ratio_pad, "video", index, len(self.files), frame,
                            max(frames, frame), fps)
        finally:
            capture.release()


class LoadWebcam:
    """Frames from a camera index (``--source 0``) until the stream ends or the user interrupts."""

    def __init__(self, source: int | str, img_size: int | tuple[int, int] = 640, stride: int = 32,
                 auto: bool = True) -> None:
        self.source = int(source) if str(source).isdigit() else source
        self.img_size, self.stride, self.auto = img_size, stride, auto
        self.capture = open_video(self.source)
        self.fps = self.capture.get(cv2.CAP_PROP_FPS) or 30.0
        self.skipped = 0

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[Frame]:
        frame = 0
        try:
            while True:
                ok, original = self.capture.read()
                if not ok:
                    break
                frame += 1
                image, ratio_pad = letterbox_image(original, self.img_size, self.stride, self.auto)
                yield Frame(str(self.source), image, original, ratio_pad, "webcam", 1, 1, frame, 0, self.fps)
        finally:
            self.capture.release()


def load_source(source: str | Path, img_size: int | tuple[int, int] = 640, stride: int = 32,
                auto: bool = True) -> LoadImages | LoadWebcam:
    """A webcam for a bare integer, otherwise image/video files."""
    if str(source).strip().isdigit():
        return LoadWebcam(str(source).strip(), img_size, stride, auto)
    return LoadImages(source, img_size, stride, auto)
