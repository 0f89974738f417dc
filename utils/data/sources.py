"""Inputs for detect.py: an image file, a folder, a glob, a .txt list of paths, a video file, a webcam, an image or
video URL, a live stream (rtsp://, rtmp://, http(s)://) or a ``.streams`` file listing streams, one a line.

Every source yields ``Frame``s: the letterboxed network input (3, h, w) RGB uint8, the original
BGR image (outputs keep its size) and where it came from. Images are decoded by utils.data.image_io (a listed
format decided from the content, the pixel count from the header, regular files only): an image it refuses, or
that does not decode, is skipped with a warning and counted; an image URL is read up to MAX_IMAGE_BYTES. The
entries of a ``.txt`` list are relative to its folder and must lie in it (no absolute path or ``../`` out of it,
links resolved); a list is a regular file of at most MAX_LIST_BYTES. A video
or stream with frames over the limit, a missing source, an empty folder, a video or stream that cannot be opened,
a video path that is not a regular file, or a ``.streams`` file without streams raise a one-line ``SourceError``.
A live stream is read by a background thread that keeps only its newest frame, so a slow model skips frames
instead of falling behind.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import math
import os
import stat
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from utils.data.augment import letterbox
from utils.data.download import read_url
from utils.data.errors import DataError
from utils.data.image_io import ImageRefused, decode_image, pixel_limit_refusal, read_image
from utils.data.regular_files import FileRefused, kind_of, read_regular
from utils.errors import UserError
from utils.log import LOGGER
from utils.paths import IMG_SUFFIXES, VID_SUFFIXES, confined

URL_SCHEMES = ("rtsp://", "rtmp://", "http://", "https://")
NETWORK_TIMEOUT_S = 10.0  # opening a network video or stream, and waiting for its next frame
MAX_IMAGE_BYTES = 64 << 20  # an image URL is read into memory: at most this much
MAX_LIST_BYTES = 64 << 20  # a .txt or .streams list


class SourceError(UserError, ValueError):
    """A --source that cannot be read; the message names it and what to do."""


@dataclass
class Frame:
    """One network input and where it came from (``frame``/``frames`` are 1-based, 0 for still images)."""

    path: str
    image: np.ndarray  # (3, h, w) RGB uint8, fitted to the network (letterboxed by default), contiguous
    original: np.ndarray  # (h0, w0, 3) BGR uint8 as read
    ratio_pad: tuple  # ((gain, gain), (pad_w, pad_h)) for utils.boxes.scale_boxes
    kind: str  # "image", "video", "webcam" or "stream"
    index: int  # 1-based position among the source's files
    count: int  # number of files in the source
    frame: int = 0
    frames: int = 0
    fps: float = 0.0  # of a video or webcam, for the output video

    def describe(self) -> str:
        """``image 1/3 path:`` / ``video 1/1 (frame 3/30) path:`` / ``webcam 0 (frame 3):`` /
        ``stream 2/2 (frame 41) url:``."""
        if self.kind == "video":
            return f"video {self.index}/{self.count} (frame {self.frame}/{self.frames}) {self.path}:"
        if self.kind == "webcam":
            return f"webcam {self.path} (frame {self.frame}):"
        if self.kind == "stream":
            return f"stream {self.index}/{self.count} (frame {self.frame}) {self.path}:"
        return f"image {self.index}/{self.count} {self.path}:"

    @property
    def stem(self) -> str:
        """The file name without suffix (of a URL's path too), for the outputs' names."""
        return media_name(self.path).rsplit(".", 1)[0] or "stream"


def is_url(source: str | Path) -> bool:
    """A network source: rtsp://, rtmp://, http:// or https://."""
    return str(source).strip().lower().startswith(URL_SCHEMES)


def media_name(source: str | Path) -> str:
    """The last part of a path, or of a URL's path (without its query)."""
    text = str(source)
    return Path(urllib.parse.urlparse(text).path if is_url(text) else text).name


def media_suffix(source: str | Path) -> str:
    """``.jpg``, ``.mp4``... of a file or URL (lower case; '' when it has none)."""
    return Path(media_name(source)).suffix.lower()


def letterbox_fit(image: np.ndarray, img_size: int | tuple[int, int], stride: int = 32,
                  auto: bool = True) -> tuple[np.ndarray, tuple]:
    """An (h0, w0, 3) image letterboxed to ``img_size`` (``auto``: padded only up to a multiple of ``stride``), in
    the channel order it came in, and its ratio_pad ((ratio_h, ratio_w), (pad_w, pad_h)) for scale_boxes: how the
    base task fits an image to the network (a task's TaskOutputs.fit_input may fit it otherwise)."""
    boxed, ratio, pad = letterbox(image, img_size, stride=stride, auto=auto)
    return boxed, ((ratio[1], ratio[0]), pad)


Fit = Callable[[np.ndarray, Any, int, bool], tuple[np.ndarray, tuple]]  # letterbox_fit's signature


def letterbox_shape(shapes: Sequence[tuple[int, int]], size: int, stride: int) -> tuple[int, int]:
    """The (h, w) input that holds every image of (h0, w0) ``shapes`` letterboxed with its longest side ``size``,
    each side rounded up to ``stride``: the base task's input for a batch of unlike images (the hub model's)."""
    scaled = [(h * size / max(h, w), w * size / max(h, w)) for h, w in shapes]
    height, width = max(s[0] for s in scaled), max(s[1] for s in scaled)
    return math.ceil(height / stride) * stride, math.ceil(width / stride) * stride


def network_input(image_bgr: np.ndarray, img_size: int | tuple[int, int], stride: int = 32,
                  auto: bool = True, fit: Fit = letterbox_fit) -> tuple[np.ndarray, tuple]:
    """BGR image -> ((3, h, w) RGB uint8 network input, ratio_pad for scale_boxes), fitted by ``fit`` (default:
    letterboxed)."""
    fitted, ratio_pad = fit(image_bgr, img_size, stride, auto)
    chw = np.ascontiguousarray(fitted.transpose(2, 0, 1)[::-1])  # HWC BGR -> CHW RGB
    return chw, ratio_pad


def read_list(listing: Path) -> list[str]:
    """The non-empty lines of a ``.txt`` or ``.streams`` list: a regular file of at most MAX_LIST_BYTES of UTF-8 text
    (a FIFO, a device or a larger file is one SourceError line)."""
    try:
        text = read_regular(listing, MAX_LIST_BYTES).decode("utf-8")
    except (OSError, FileRefused, UnicodeDecodeError) as e:
        raise SourceError(f"--source {listing}: cannot read the list ({str(e)[:120]})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _list_entries(listing: Path) -> list[Path | str]:
    """The lines of a .txt list: URLs as they are, paths relative to the list's folder, each of which must lie in
    that folder once resolved (links followed): an absolute path or ``../`` leading out is one SourceError line."""
    folder = listing.resolve().parent
    return [line if is_url(line) else confined(line, folder, f"--source {listing}: entry", SourceError)
            for line in read_list(listing)]


def collect_files(source: str | Path) -> list[Path | str]:
    """The image and video files a source names: a file, a folder, a glob, a .txt list of paths, or an image or
    video URL (kept as a string)."""
    text = str(source)
    path = Path(text).expanduser()
    if is_url(text):
        files: list[Path | str] = [text]
    elif path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file())
    elif path.suffix.lower() == ".txt" and path.exists():  # a FIFO too: read_list refuses it in one line
        files = _list_entries(path)
    elif path.is_file():
        files = [path]
    elif any(c in text for c in "*?["):
        files = [Path(p) for p in sorted(glob.glob(text, recursive=True)) if Path(p).is_file()]
        if not files:
            raise SourceError(f"--source {text}: the pattern matches no files")
    else:
        raise SourceError(f"--source {text} does not exist (give an image, a folder, a glob, a .txt list, "
                          "a video, a webcam index, a URL or a .streams file)")
    media = [p for p in files if media_suffix(p) in IMG_SUFFIXES | VID_SUFFIXES]
    if not media:
        raise SourceError(f"--source {text}: no images or videos found (supported: "
                          f"{' '.join(sorted(IMG_SUFFIXES | VID_SUFFIXES))})")
    return media


@contextlib.contextmanager
def _quiet_video_backends() -> Iterator[None]:
    """Silence OpenCV's and FFmpeg's own multi-line complaints: the SourceError says what failed."""
    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    ffmpeg_level = os.environ.get("OPENCV_FFMPEG_LOGLEVEL")
    os.environ["OPENCV_FFMPEG_LOGLEVEL"] = "-8"  # AV_LOG_QUIET, read by OpenCV when it opens a capture
    try:
        yield
    finally:
        cv2.utils.logging.setLogLevel(level)
        if ffmpeg_level is None:
            os.environ.pop("OPENCV_FFMPEG_LOGLEVEL", None)
        else:
            os.environ["OPENCV_FFMPEG_LOGLEVEL"] = ffmpeg_level


def open_video(path: str | int) -> cv2.VideoCapture:
    """An opened capture, or a SourceError naming the video, webcam or URL (network ones time out). A path must be a
    regular file: a FIFO would block the capture for ever."""
    if isinstance(path, str) and not is_url(path) and os.path.exists(path):
        if not stat.S_ISREG(mode := os.stat(path).st_mode):
            raise SourceError(f"--source: {path} is not a regular file ({kind_of(mode)})")
    with _quiet_video_backends():
        if is_url(path):
            timeout_ms = int(NETWORK_TIMEOUT_S * 1000)
            capture = cv2.VideoCapture(str(path).strip(), cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, timeout_ms,
                                                                          cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms])
        else:
            capture = cv2.VideoCapture(path)
    width, height = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)), int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    if capture.isOpened() and (refusal := pixel_limit_refusal(width, height)):
        capture.release()
        raise SourceError(f"--source: {path} has frames of {refusal}")
    if not capture.isOpened():
        capture.release()
        if is_url(path):
            raise SourceError(f"--source: cannot open stream {path} (unreachable, refused, or not a video stream)")
        kind = "webcam" if isinstance(path, int) else "video"
        raise SourceError(f"--source: cannot open {kind} {path} (missing codec, damaged file or no device)")
    return capture


def fetch_image(url: str, max_bytes: int = MAX_IMAGE_BYTES) -> np.ndarray:
    """An image URL read into memory (at most ``max_bytes``) and decoded as a local file is (utils.data.image_io:
    a listed format decided from the content, the pixel count from the header); ImageRefused otherwise."""
    try:
        data = read_url(url, max_bytes, NETWORK_TIMEOUT_S)
    except DataError as e:
        raise SourceError(f"--source {e}") from None
    return decode_image(data)


def read_frames(capture: cv2.VideoCapture, vid_stride: int = 1) -> Iterator[tuple[int, np.ndarray]]:
    """(frame number, BGR image) of every ``vid_stride``-th frame (numbers vid_stride, 2 vid_stride, ...), as
    YOLOv5's --vid-stride reads them; the frames between are grabbed, never decoded."""
    number = 0
    while capture.grab():
        number += 1
        if number % vid_stride:
            continue
        ok, image = capture.retrieve()
        if not ok:
            break
        yield number, image


class LoadImages:
    """Images and videos from files or URLs; videos are read frame by frame (every ``vid_stride``-th)."""

    def __init__(self, source: str | Path, img_size: int | tuple[int, int] = 640, stride: int = 32,
                 auto: bool = True, vid_stride: int = 1, fit: Fit = letterbox_fit) -> None:
        self.files = collect_files(source)
        self.to_input = functools.partial(network_input, img_size=img_size, stride=stride, auto=auto, fit=fit)
        self.vid_stride = vid_stride
        self.skipped = 0  # unreadable images, counted and reported
        self.videos = [p for p in self.files if media_suffix(p) in VID_SUFFIXES]
        for video in self.videos:  # fail before any work when a video cannot be opened
            open_video(str(video)).release()

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[Frame]:
        for index, path in enumerate(self.files, 1):
            if media_suffix(path) in VID_SUFFIXES:
                yield from self._video_frames(str(path), index)
                continue
            try:
                original = fetch_image(str(path)) if is_url(path) else read_image(path)
            except ImageRefused as e:
                self.skipped += 1
                LOGGER.warning(f"WARNING: skipping unreadable image {path}: {e}")
                continue
            image, ratio_pad = self.to_input(original)
            yield Frame(str(path), image, original, ratio_pad, "image", index, len(self.files))

    def _video_frames(self, path: str, index: int) -> Iterator[Frame]:
        capture = open_video(path)
        frames = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = (capture.get(cv2.CAP_PROP_FPS) or 30.0) / self.vid_stride
        try:
            for number, original in read_frames(capture, self.vid_stride):
                image, ratio_pad = self.to_input(original)
                yield Frame(path, image, original, ratio_pad, "video", index, len(self.files), number,
                            max(frames, number), fps)
        finally:
            capture.release()


class LoadWebcam:
    """Frames from a camera index (``--source 0``) until the stream ends or the user interrupts."""

    def __init__(self, source: int | str, img_size: int | tuple[int, int] = 640, stride: int = 32,
                 auto: bool = True, vid_stride: int = 1, fit: Fit = letterbox_fit) -> None:
        self.source = int(source) if str(source).isdigit() else source
        self.to_input = functools.partial(network_input, img_size=img_size, stride=stride, auto=auto, fit=fit)
        self.vid_stride = vid_stride
        self.capture = open_video(self.source)
        self.fps = (self.capture.get(cv2.CAP_PROP_FPS) or 30.0) / vid_stride
        self.skipped = 0

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[Frame]:
        try:
            for number, original in read_frames(self.capture, self.vid_stride):
                image, ratio_pad = self.to_input(original)
                yield Frame(str(self.source), image, original, ratio_pad, "webcam", 1, 1, number, 0, self.fps)
        finally:
            self.capture.release()


class StreamReader:
    """One live stream read on a background thread that keeps only the newest (every ``vid_stride``-th) frame."""

    def __init__(self, source: str | int, vid_stride: int = 1) -> None:
        self.source, self.vid_stride = source, vid_stride
        self.capture = open_video(source)
        self.fps = (self.capture.get(cv2.CAP_PROP_FPS) or 30.0) / vid_stride
        self.ended = False
        self._newest: tuple[int, np.ndarray] | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._read, name=f"stream {source}", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for number, image in read_frames(self.capture, self.vid_stride):
                with self._changed:
                    self._newest = (number, image)  # an older frame nobody took is dropped
                    self._changed.notify_all()
                if self._stop.is_set():
                    break
        finally:
            self.capture.release()
            with self._changed:
                self.ended = True
                self._changed.notify_all()

    def newest_after(self, number: int, timeout: float = NETWORK_TIMEOUT_S) -> tuple[int, np.ndarray] | None:
        """The newest frame later than frame ``number``; None once the stream has ended (or stalled)."""
        with self._changed:
            self._changed.wait_for(lambda: self.ended or (self._newest is not None and self._newest[0] > number),
                                   timeout)
            newest = self._newest
        return newest if newest is not None and newest[0] > number else None

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=NETWORK_TIMEOUT_S)


def read_streams_file(path: Path) -> list[str]:
    """The stream URLs (or webcam indices) of a ``.streams`` file, one a line; '#' starts a comment line."""
    if not path.is_file():
        raise SourceError(f"--source {path} does not exist")
    lines = [line for line in read_list(path) if not line.startswith("#")]
    if not lines:
        raise SourceError(f"--source {path} lists no streams (write one rtsp://, rtmp:// or http(s):// URL a line)")
    bad = [line for line in lines if not is_url(line) and not line.isdigit()]
    if bad:
        raise SourceError(f"--source {path}: '{bad[0]}' is not a stream URL (rtsp://, rtmp://, http(s)://) "
                          "or a webcam index")
    return lines


class LoadStreams:
    """Live streams, each read by its own thread; every step yields each stream's newest frame not yet seen,
    until every stream has ended."""

    def __init__(self, sources: list[str], img_size: int | tuple[int, int] = 640, stride: int = 32,
                 auto: bool = True, vid_stride: int = 1, fit: Fit = letterbox_fit) -> None:
        self.sources = sources
        self.to_input = functools.partial(network_input, img_size=img_size, stride=stride, auto=auto, fit=fit)
        self.skipped = 0
        self.readers: list[StreamReader] = []
        try:
            for source in sources:
                self.readers.append(StreamReader(int(source) if source.isdigit() else source, vid_stride))
        except SourceError:
            self.close()
            raise
        LOGGER.info(f"{len(sources)} stream(s) opened: {', '.join(sources)}")

    def __len__(self) -> int:
        return len(self.sources)

    def __iter__(self) -> Iterator[Frame]:
        seen = [0] * len(self.readers)
        active = list(range(len(self.readers)))
        try:
            while active:
                for i in list(active):
                    newest = self.readers[i].newest_after(seen[i])
                    if newest is None:
                        active.remove(i)
                        LOGGER.info(f"stream {i + 1}/{len(self.readers)} {self.sources[i]} ended")
                        continue
                    seen[i], original = newest
                    image, ratio_pad = self.to_input(original)
                    yield Frame(self.sources[i], image, original, ratio_pad, "stream", i + 1, len(self.readers),
                                seen[i], 0, self.readers[i].fps)
        finally:
            self.close()

    def close(self) -> None:
        for reader in self.readers:
            reader.stop()


def load_source(source: str | Path, img_size: int | tuple[int, int] = 640, stride: int = 32, auto: bool = True,
                vid_stride: int = 1, fit: Fit = letterbox_fit) -> LoadImages | LoadWebcam | LoadStreams:
    """A webcam for a bare integer; streams for a ``.streams`` file, an rtsp:// or rtmp:// URL, or an http(s) URL
    that names no image or video file; otherwise image/video files (and http(s) URLs of such files). Every frame is
    fitted to the network by ``fit`` (default: letterboxed; a task's TaskOutputs.fit_input)."""
    if vid_stride < 1:
        raise SourceError(f"--vid-stride {vid_stride} must be at least 1")
    text = str(source).strip()
    if text.isdigit():
        return LoadWebcam(text, img_size, stride, auto, vid_stride, fit)
    if text.lower().endswith(".streams"):
        return LoadStreams(read_streams_file(Path(text).expanduser()), img_size, stride, auto, vid_stride, fit)
    live = text.lower().startswith(("rtsp://", "rtmp://"))
    if is_url(text) and (live or media_suffix(text) not in IMG_SUFFIXES | VID_SUFFIXES):
        return LoadStreams([text], img_size, stride, auto, vid_stride, fit)
    return LoadImages(text, img_size, stride, auto, vid_stride, fit)
