"""detect.py's inputs: --vid-stride, URLs of files, live streams read by background threads, .streams files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.helpers import free_port, serve_folder, write_video
from utils.data.sources import LoadImages, LoadStreams, SourceError, StreamReader, load_source, read_streams_file


def numbered_frames(count: int) -> list[np.ndarray]:
    """Frames whose brightness encodes their number (1-based: 10, 20, ...), so a decoded frame says which it is."""
    return [np.full((48, 64, 3), 10 * (i + 1), np.uint8) for i in range(count)]


def frame_number(image: np.ndarray) -> int:
    return int(round(image.mean() / 10))


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_video(tmp_path_factory.mktemp("video") / "v.mp4", numbered_frames(7))


def test_vid_stride_reads_every_nth_frame(video: Path) -> None:
    frames = list(LoadImages(video, img_size=64, vid_stride=3))
    assert [f.frame for f in frames] == [3, 6] and [frame_number(f.original) for f in frames] == [3, 6]
    assert frames[0].describe().startswith("video 1/1 (frame 3/7)") and frames[0].fps == pytest.approx(10 / 3)
    with pytest.raises(SourceError, match="--vid-stride 0"):
        load_source(video, vid_stride=0)


def test_url_of_a_video_or_image_file_is_read_over_http(video: Path, tmp_path: Path) -> None:
    cv2.imwrite(str(video.parent / "still.png"), numbered_frames(3)[2])
    with serve_folder(video.parent) as url:
        frames = list(load_source(f"{url}/v.mp4", img_size=64))
        assert [f.frame for f in frames] == list(range(1, 8)) and frames[0].kind == "video"
        assert [frame_number(f.original) for f in frames] == list(range(1, 8))
        still = list(load_source(f"{url}/still.png?size=1", img_size=64))
        assert len(still) == 1 and still[0].kind == "image" and frame_number(still[0].original) == 3
        assert still[0].stem == "still"


def test_streams_file_reads_each_stream_on_its_own_thread(video: Path, tmp_path: Path) -> None:
    with serve_folder(video.parent) as url:
        listing = tmp_path / "cams.streams"
        listing.write_text(f"# two cameras\n{url}/v.mp4\n\n{url}/v.mp4\n")
        source = load_source(listing, img_size=64)
        assert isinstance(source, LoadStreams) and len(source) == 2
        frames = list(source)
    by_stream = {i: [f.frame for f in frames if f.index == i] for i in (1, 2)}
    for numbers in by_stream.values():  # every stream delivers, newest first-seen frames in order, up to its end
        assert numbers and numbers == sorted(set(numbers)) and numbers[-1] == 7
    assert frames[0].kind == "stream" and frames[0].describe().startswith("stream 1/2 (frame ")
    assert all(not reader.thread.is_alive() for reader in source.readers)  # threads end with the iteration


def test_stream_reader_keeps_only_the_newest_frame(video: Path) -> None:
    reader = StreamReader(str(video))  # a file stands in for a camera: the thread reads far faster than we take
    time.sleep(0.5)
    taken = []
    while (newest := reader.newest_after(taken[-1][0] if taken else 0, timeout=5)) is not None:
        taken.append(newest)
    assert [n for n, _ in taken] == [7] and frame_number(taken[0][1]) == 7  # frames 1..6 were dropped, not queued
    reader.stop()


def test_bad_stream_sources_give_one_line_errors(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(SourceError, match=r"cannot open stream http://127\.0\.0\.1:\d+/live \(unreachable"):
        load_source(f"http://127.0.0.1:{free_port()}/live")
    assert time.monotonic() - start < 5  # refused connections fail at once
    for scheme in ("rtsp", "rtmp"):  # always live streams, whatever their path says
        with pytest.raises(SourceError, match=f"cannot open stream {scheme}://127"):
            load_source(f"{scheme}://127.0.0.1:{free_port()}/live.mp4")
    empty = tmp_path / "empty.streams"
    empty.write_text("# nothing here\n\n")
    with pytest.raises(SourceError, match="lists no streams"):
        read_streams_file(empty)
    bad = tmp_path / "bad.streams"
    bad.write_text("rtsp://camera/1\nfolder/video.mp4\n")
    with pytest.raises(SourceError, match="'folder/video.mp4' is not a stream URL"):
        load_source(bad)
    with pytest.raises(SourceError, match="does not exist"):
        load_source(tmp_path / "missing.streams")


def test_a_stream_that_never_answers_times_out(monkeypatch) -> None:
    import socket

    import utils.data.sources

    monkeypatch.setattr(utils.data.sources, "NETWORK_TIMEOUT_S", 1.0)
    with socket.socket() as server:  # accepts connections (the kernel's backlog) but never sends a byte
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        start = time.monotonic()
        with pytest.raises(SourceError, match="cannot open stream"):
            load_source(f"http://127.0.0.1:{server.getsockname()[1]}/live")
        assert time.monotonic() - start < 8


def test_images_over_the_pixel_limit_are_skipped_unread_and_counted(tmp_path: Path, yolo_log: list[str]) -> None:
    """A 9500x9500 PNG of 11 kB (90 M pixels, where Pillow only warns): skipped from its header, locally and over
    http; an image URL is read only up to the byte cap."""
    from PIL import Image

    from utils.data.sources import fetch_image

    Image.new("1", (9500, 9500)).save(tmp_path / "bomb.png")
    cv2.imwrite(str(tmp_path / "good.png"), numbered_frames(2)[1])
    local = LoadImages(tmp_path, img_size=64)
    assert [frame_number(f.original) for f in local] == [2] and local.skipped == 1
    assert sum("bomb.png: 9500x9500 is more pixels than the decompression-bomb limit" in line for line in yolo_log) == 1
    with serve_folder(tmp_path) as url:
        remote = LoadImages(f"{url}/bomb.png", img_size=64)
        assert list(remote) == [] and remote.skipped == 1
        cv2.imwrite(str(tmp_path / "noise.png"), np.random.default_rng(0).integers(0, 255, (48, 64, 3), np.uint8))
        with pytest.raises(SourceError, match="more than the cap of 1000") as info:
            fetch_image(f"{url}/noise.png", max_bytes=1000)
    assert "\n" not in str(info.value)


def test_videos_and_streams_with_frames_over_the_pixel_limit_are_refused(video: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is Pillow's Image.MAX_IMAGE_PIXELS (users may change it); here lowered below a 64x48 frame."""
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 48 - 1)
    with pytest.raises(SourceError, match="frames of 64x48 is more pixels than the decompression-bomb limit"):
        LoadImages(video, img_size=64)
    (video.parent / "live").write_bytes(video.read_bytes())  # no media suffix: read as a live stream
    with serve_folder(video.parent) as url, pytest.raises(SourceError, match="decompression-bomb limit") as info:
        load_source(f"{url}/live", img_size=64)
    assert "\n" not in str(info.value)


def test_a_txt_list_reads_only_inside_its_folder(tmp_path: Path) -> None:
    """A .txt source list's entries are relative to its folder and stay in it: ``../`` and absolute paths leading
    out (detect.py read them), and links out, are one SourceError line naming the entry; absolute paths inside, and
    URLs, are read. A FIFO in place of the list is one line too."""
    from utils.data.sources import collect_files

    folder, outside = tmp_path / "lists", tmp_path / "private"
    (folder / "sub").mkdir(parents=True)
    outside.mkdir()
    for path in (folder / "a.jpg", folder / "sub" / "b.jpg", outside / "secret.jpg"):
        cv2.imwrite(str(path), np.zeros((8, 8, 3), np.uint8))
    (folder / "link.jpg").symlink_to(outside / "secret.jpg")
    listing = folder / "list.txt"
    listing.write_text(f"a.jpg\nsub/b.jpg\n{folder / 'a.jpg'}\nhttps://example.invalid/c.jpg\n")
    assert collect_files(listing) == [folder / "a.jpg", folder / "sub" / "b.jpg", folder / "a.jpg",
                                      "https://example.invalid/c.jpg"]
    for entry in ("../private/secret.jpg", str(outside / "secret.jpg"), "link.jpg", "sub/../../private/secret.jpg"):
        listing.write_text(f"a.jpg\n{entry}\n")
        with pytest.raises(SourceError) as refused:
            collect_files(listing)
        message = str(refused.value)
        assert "\n" not in message and "leads outside" in message and entry in message, message
    fifo = folder / "fifo.txt"
    os.mkfifo(fifo)
    with pytest.raises(SourceError, match="cannot read the list .*a FIFO"):
        collect_files(fifo)


def test_every_source_fits_its_frames_by_the_fit_it_was_given(video: Path, tmp_path: Path) -> None:
    """The network input of every frame comes from ``fit`` (a task's TaskOutputs.fit_input), as CHW RGB; without one
    it is letterboxed."""
    from utils.data.augment import letterbox

    def top_left(image: np.ndarray, size, stride: int, auto: bool) -> tuple[np.ndarray, tuple]:
        return image[:32, :32], ((1.0, 1.0), (7, 9))  # a fit no task uses, easy to recognise

    still = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), still)
    (frame,) = load_source(tmp_path / "a.png", 64, 32, fit=top_left)
    assert np.array_equal(frame.image, still[:32, :32, ::-1].transpose(2, 0, 1)) and frame.ratio_pad[1] == (7, 9)
    (frame,) = load_source(tmp_path / "a.png", 64, 32, auto=False)
    boxed = letterbox(still, 64, stride=32, auto=False)[0]
    assert np.array_equal(frame.image, boxed[:, :, ::-1].transpose(2, 0, 1))
    frames = list(load_source(video, 64, 32, fit=top_left))
    assert len(frames) == 7 and all(f.image.shape == (3, 32, 32) and f.ratio_pad[1] == (7, 9) for f in frames)
