"""detect.py on images, folders, videos and exported weights; outputs checked against recomputed predictions."""

from __future__ import annotations

import os
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torchvision.ops import box_iou

import detect
import export
from tests.helpers import box_masks_segmenter
from utils import paths
from utils.boxes import non_max_suppression, scale_boxes, xywhn2xyxy
from utils.cli import run_main
from utils.data.augment import letterbox
from utils.errors import UserError
from utils.plots.annotate import class_color
from utils.weights.checkpoint import load_model

NAMES = ["circle", "square", "triangle"]
LOW_CONF = ["--conf-thres", "0.001", "--max-det", "5"]  # an untrained model's scores are low


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def weights(tiny_weights: Path) -> Path:
    return tiny_weights


def scene(seed: int, shape: tuple[int, int] = (48, 64)) -> np.ndarray:
    """A BGR image with a few filled shapes (so the outputs are not of a flat image)."""
    rng = np.random.default_rng(seed)
    image = np.full((*shape, 3), rng.integers(60, 200), np.uint8)
    for _ in range(3):
        centre = (int(rng.integers(8, shape[1] - 8)), int(rng.integers(8, shape[0] - 8)))
        cv2.circle(image, centre, int(rng.integers(4, 12)), tuple(int(c) for c in rng.integers(0, 255, 3)), -1)
    return image


def write_images(folder: Path, count: int, suffix: str = ".png") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"img{i}{suffix}" for i in range(count)]
    for i, path in enumerate(files):
        cv2.imwrite(str(path), scene(i))
    return files


def run_detect(*args: str) -> detect.DetectResult:
    return detect.main(detect.parse_opt([str(a) for a in args]))


def recompute(weights: Path, image_file: Path, img_size: int = 64) -> np.ndarray:
    """Detections (k, 6) in original pixels, computed here without detect.py's code path."""
    model, _ = load_model(weights)
    original = cv2.imread(str(image_file))
    boxed, ratio, pad = letterbox(original, img_size, stride=32, auto=True)
    x = torch.from_numpy(np.ascontiguousarray(boxed[:, :, ::-1].transpose(2, 0, 1))).float()[None] / 255
    with torch.no_grad():
        det = non_max_suppression(model(x), 0.001, 0.45, max_det=5)[0]
    det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], original.shape[:2], ((ratio[1], ratio[0]), pad))
    return det.numpy()


def test_image_outputs_match_recomputed_predictions(weights: Path, tmp_path: Path, capsys) -> None:
    image_file = write_images(tmp_path / "src", 1)[0]
    result = run_detect("--weights", weights, "--source", image_file, "--img-size", 64, *LOW_CONF, "--save-txt",
                        "--save-conf", "--save-crop", "--project", tmp_path / "runs")
    out = capsys.readouterr().out
    assert result.save_dir == tmp_path / "runs" / "exp"
    assert re.search(r"image 1/1 \S+img0\.png: 64x64 (\d+ (circle|square|triangle)s?(, )?)+, Done\. \(\d+\.\d{3}s\)",
                     out)
    assert re.search(r"Speed: [\d.]+/[\d.]+/[\d.]+ ms pre-process/inference/NMS per image at shape \(1, 3, 64, 64\)",
                     out)
    assert f"Results saved to {result.save_dir}, 1 labels saved to {result.save_dir / 'labels'}" in out
    expected = recompute(weights, image_file)
    assert len(expected) == 5
    np.testing.assert_allclose(result.detections[0][1], expected, atol=1e-4)
    rows = np.loadtxt(result.save_dir / "labels" / "img0.txt", ndmin=2)  # cls cx cy w h conf
    assert rows.shape == (5, 6)
    np.testing.assert_array_equal(rows[:, 0], expected[:, 5])
    np.testing.assert_allclose(rows[:, 5], expected[:, 4], rtol=1e-4)
    np.testing.assert_allclose(xywhn2xyxy(rows[:, 1:5], w=64, h=48), expected[:, :4], atol=1e-3)
    annotated = cv2.imread(str(result.save_dir / "img0.png"))
    assert annotated.shape == (48, 64, 3)
    crops = sorted((result.save_dir / "crops").rglob("*.jpg"))
    corners = np.round(expected[:, :4]).astype(int)
    assert len(crops) == int(((corners[:, 2] > corners[:, 0]) & (corners[:, 3] > corners[:, 1])).sum()) > 0


def test_drawn_box_is_where_the_label_row_says(weights: Path, tmp_path: Path) -> None:
    image_file = write_images(tmp_path / "src", 1)[0]
    big = tmp_path / "src" / "big.png"
    cv2.imwrite(str(big), cv2.resize(cv2.imread(str(image_file)), (256, 192), interpolation=cv2.INTER_NEAREST))
    result = run_detect("--weights", weights, "--source", big, "--img-size", 64, "--conf-thres", "0.001",
                        "--max-det", "1", "--save-txt", "--hide-labels", "--line-thickness", 3,
                        "--project", tmp_path / "runs")
    cls, cx, cy, w, h = np.loadtxt(result.save_dir / "labels" / "big.txt")
    x1, y1, x2, y2 = xywhn2xyxy(np.array([cx, cy, w, h]), w=256, h=192)
    annotated = cv2.imread(str(result.save_dir / "big.png"))
    x1, x2 = np.clip([x1, x2], 0, 255)
    y1, y2 = np.clip([y1, y2], 0, 191)
    for x, y in (((x1 + x2) / 2, y1), ((x1 + x2) / 2, y2), (x1, (y1 + y2) / 2), (x2, (y1 + y2) / 2)):
        assert tuple(annotated[int(round(y)), int(round(x))]) == class_color(int(cls))


def test_folder_with_a_corrupt_image(weights: Path, tmp_path: Path, capsys) -> None:
    write_images(tmp_path / "src", 3, ".jpg")
    (tmp_path / "src" / "broken.jpg").write_bytes(b"not an image")
    (tmp_path / "src" / "notes.md").write_text("ignored")
    result = run_detect("--weights", weights, "--source", tmp_path / "src", "--img-size", 64, *LOW_CONF,
                        "--save-txt", "--project", tmp_path / "runs")
    out = capsys.readouterr().out
    assert "WARNING: skipping unreadable image" in out and "broken.jpg" in out
    assert result.skipped == 1 and len(result.detections) == 3
    assert sorted(p.name for p in result.save_dir.glob("*.jpg")) == ["img0.jpg", "img1.jpg", "img2.jpg"]
    assert len(list((result.save_dir / "labels").glob("*.txt"))) == 3
    assert "image 4/4" in out  # numbering counts the skipped file


def test_glob_and_txt_list_sources(weights: Path, tmp_path: Path) -> None:
    files = write_images(tmp_path / "src", 3)
    listing = tmp_path / "list.txt"
    listing.write_text(f"src/{files[0].name}\n{files[2]}\n\n")
    result = run_detect("--weights", weights, "--source", listing, "--img-size", 64, "--nosave",
                        "--project", tmp_path / "runs")
    assert [d.split()[2] for d, _ in result.detections] == [f"{files[0]}:", f"{files[2]}:"]
    result = run_detect("--weights", weights, "--source", tmp_path / "src" / "img[12].png", "--img-size", 64,
                        "--nosave", "--project", tmp_path / "runs")
    assert len(result.detections) == 2 and not list(result.save_dir.glob("*.png"))
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())  # --nosave: no empty run folder


def test_video_source(weights: Path, tmp_path: Path, capsys) -> None:
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    for i in range(6):
        writer.write(scene(i))
    writer.release()
    result = run_detect("--weights", weights, "--source", video, "--img-size", 64, *LOW_CONF, "--save-txt",
                        "--project", tmp_path / "runs")
    out = capsys.readouterr().out
    assert "video 1/1 (frame 6/6)" in out and len(result.detections) == 6
    capture = cv2.VideoCapture(str(result.save_dir / "clip.mp4"))
    frames = 0
    while capture.read()[0]:
        frames += 1
    assert frames == 6 and int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)) == 64
    capture.release()
    assert sorted(p.name for p in (result.save_dir / "labels").glob("*.txt"))[:2] == ["clip_1.txt", "clip_2.txt"]


def test_exported_files_give_the_same_boxes(weights: Path, tmp_path: Path) -> None:
    local = tmp_path / "model.pt"
    local.write_bytes(weights.read_bytes())
    export.main(export.parse_opt(["--weights", str(local), "--img-size", "64"]))
    image_file = tmp_path / "wide.png"
    cv2.imwrite(str(image_file), scene(3, (40, 64)))
    outputs = {}
    for suffix in (".pt", ".torchscript", ".onnx"):
        result = run_detect("--weights", local.with_suffix(suffix), "--source", image_file, "--img-size", 64,
                            *LOW_CONF, "--project", tmp_path / "runs", "--trust-weights")  # TorchScript holds code
        outputs[suffix] = result.detections[0][1]
    assert len(outputs[".pt"]) == 5
    for suffix in (".torchscript", ".onnx"):
        assert outputs[suffix].shape == outputs[".pt"].shape
        assert np.abs(outputs[suffix] - outputs[".pt"]).max() < 1e-3, suffix


def test_no_arguments_uses_newest_trained_model(weights: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    with pytest.raises(UserError, match=r"python train\.py"):
        detect.main(detect.parse_opt([]))
    older, newer = (tmp_path / "runs" / "train" / name / "weights" / "best.pt" for name in ("exp", "exp2"))
    for path, mtime in ((newer, 1_000_000), (older, 2_000_000)):  # "exp" is the newer file despite its name
        path.parent.mkdir(parents=True)
        path.write_bytes(weights.read_bytes())
        os.utime(path, (mtime, mtime))
    write_images(tmp_path / "data" / "images", 2, ".jpg")
    result = detect.main(detect.parse_opt(["--img-size", "64"]))
    assert result.weights == older
    assert result.save_dir == tmp_path / "runs" / "detect" / "exp" and len(result.detections) == 2
    assert len(list(result.save_dir.glob("*.jpg"))) == 2


@pytest.mark.parametrize("case", ["missing", "empty", "bad_video", "half", "bad_weights"])
def test_bad_input_gives_one_line_errors(case: str, weights: Path, tmp_path: Path, capsys) -> None:
    source, extra, expected = tmp_path / "nothing.jpg", [], "does not exist"
    if case == "empty":
        source = tmp_path / "empty"
        source.mkdir()
        expected = "no images or videos found"
    elif case == "bad_video":
        source = tmp_path / "broken.mp4"
        source.write_bytes(b"\x00" * 100)
        expected = "cannot open video"
    elif case == "half":
        source, extra, expected = write_images(tmp_path / "src", 1)[0], ["--half", "--device", "cpu"], "--half"
    elif case == "bad_weights":
        (tmp_path / "w.bin").write_bytes(b"x")
        source, extra, expected = write_images(tmp_path / "src", 1)[0], ["--weights", tmp_path / "w.bin"], "format"
    args = ["--weights", weights, "--source", source, "--img-size", 64, "--project", tmp_path / "runs", *extra]
    code = run_main(detect.main, detect.parse_opt([str(a) for a in args]), "detect")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("detect: error: ") and expected in err and err.count("\n") == 1


def test_classes_filter_keeps_only_those_classes(weights: Path, tmp_path: Path) -> None:
    image_file = write_images(tmp_path / "src", 1)[0]
    everything = run_detect("--weights", weights, "--source", image_file, "--img-size", 64, "--conf-thres", "0.001",
                            "--nosave", "--project", tmp_path / "runs").detections[0][1]
    only = run_detect("--weights", weights, "--source", image_file, "--img-size", 64, "--conf-thres", "0.001",
                      "--classes", "1", "--nosave", "--project", tmp_path / "runs").detections[0][1]
    assert len(everything) > len(only) > 0 and set(everything[:, 5]) > {1.0} and set(only[:, 5]) == {1.0}


def test_stream_reader_yields_frames(tmp_path: Path) -> None:
    from utils.data.sources import LoadWebcam

    video = tmp_path / "cam.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 5, (64, 48))
    for i in range(3):
        writer.write(scene(i))
    writer.release()
    frames = list(LoadWebcam(str(video), img_size=64, stride=32))  # a capture URL/path stands in for a camera
    assert [f.frame for f in frames] == [1, 2, 3] and frames[0].image.shape == (3, 64, 64)
    assert frames[2].describe() == f"webcam {video} (frame 3):" and frames[0].fps == 5


# ------------------------------------------------------------------------------------ YOLOv5 v7.0 flags
def white_box_image(path: Path, shape: tuple[int, int] = (200, 300), box: tuple[int, int, int, int] = (160, 40, 250,
                    130)) -> tuple[int, int, int, int]:
    """A black image with one white rectangle (x1, y1, x2, y2), off-centre, written to ``path``."""
    image = np.zeros((*shape, 3), np.uint8)
    x1, y1, x2, y2 = box
    image[y1:y2, x1:x2] = 255
    cv2.imwrite(str(path), image)
    return box


def test_augment_boxes_land_on_the_object_in_the_original_image(weights: Path, tmp_path: Path, monkeypatch) -> None:
    from models.yolo import Model
    from tests.helpers import bright_box_predict

    built = Model.forward  # the builder's train-mode stride probe still runs the real layers
    monkeypatch.setattr(Model, "forward",  # a detector that finds the box
                        lambda self, x: built(self, x) if self.training else bright_box_predict(x))
    image = tmp_path / "box.png"
    truth = torch.tensor([white_box_image(image)], dtype=torch.float32)
    args = ["--weights", weights, "--source", image, "--img-size", 256, "--nosave", "--project", tmp_path / "runs"]
    plain = run_detect(*args).detections[0][1]
    augmented = run_detect(*args, "--augment").detections[0][1]
    assert len(plain) == len(augmented) == 1
    iou = box_iou(torch.from_numpy(augmented[:, :4]), torch.from_numpy(plain[:, :4])).item()
    assert iou > 0.9 and box_iou(torch.from_numpy(augmented[:, :4]), truth).item() > 0.9  # the original's frame
    assert not np.array_equal(augmented, plain)  # its best box came from a scaled pass


def test_view_img_without_a_display_warns_once_and_saves(weights: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(cv2, "imshow", lambda *a: pytest.fail("no window may be opened without a display"))
    write_images(tmp_path / "src", 2)
    result = run_detect("--weights", weights, "--source", tmp_path / "src", "--img-size", 64, "--view-img",
                        "--project", tmp_path / "runs")
    warnings = [line for line in capsys.readouterr().out.splitlines() if "--view-img" in line and "WARNING" in line]
    assert warnings == ["WARNING: --view-img: no display (DISPLAY is not set); results are saved but not shown"]
    assert len(list(result.save_dir.glob("*.png"))) == 2


def test_view_img_shows_every_annotated_frame(weights: Path, tmp_path: Path, monkeypatch) -> None:
    import utils.plots.viewer

    shown = []
    monkeypatch.setattr(utils.plots.viewer, "display_problem", lambda: None)
    for name in ("namedWindow", "resizeWindow", "destroyAllWindows"):
        monkeypatch.setattr(cv2, name, lambda *a: None)
    monkeypatch.setattr(cv2, "waitKey", lambda delay: -1)
    monkeypatch.setattr(cv2, "imshow", lambda name, image: shown.append((name, image.copy())))
    files = write_images(tmp_path / "src", 2)
    result = run_detect("--weights", weights, "--source", tmp_path / "src", "--img-size", 64, *LOW_CONF,
                        "--view-img", "--nosave", "--project", tmp_path / "runs")
    assert [name for name, _ in shown] == [str(f) for f in files]
    assert all(image.shape == (48, 64, 3) for _, image in shown)
    assert not np.array_equal(shown[0][1], cv2.imread(str(files[0])))  # boxes drawn on it
    assert not list(result.save_dir.glob("*.png"))  # --nosave still holds


def test_vid_stride_detects_every_nth_frame(weights: Path, tmp_path: Path) -> None:
    from tests.helpers import write_video

    video = write_video(tmp_path / "clip.mp4", [scene(i) for i in range(7)])
    result = run_detect("--weights", weights, "--source", video, "--img-size", 64, *LOW_CONF, "--save-txt",
                        "--vid-stride", 3, "--project", tmp_path / "runs")
    assert [d.split(")")[0] for d, _ in result.detections] == ["video 1/1 (frame 3/7", "video 1/1 (frame 6/7"]
    assert sorted(p.name for p in (result.save_dir / "labels").glob("*.txt")) == ["clip_3.txt", "clip_6.txt"]
    capture = cv2.VideoCapture(str(result.save_dir / "clip.mp4"))
    assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 2
    assert capture.get(cv2.CAP_PROP_FPS) == pytest.approx(10 / 3, rel=0.01)  # plays as long as the source
    capture.release()


def test_visualize_saves_each_stage_feature_maps(weights: Path, tmp_path: Path) -> None:
    image_file = write_images(tmp_path / "src", 1)[0]
    result = run_detect("--weights", weights, "--source", image_file, "--img-size", 64, "--visualize", "--nosave",
                        "--project", tmp_path / "runs")
    folder = result.save_dir / "img0"
    model, _ = load_model(weights)
    expected = [f"stage{i}_{layer.type.rsplit('.', 1)[-1]}_features.png" for i, layer in enumerate(model.model)
                if i < len(model.model) - 1]  # every stage but Detect (no map is 1 x 1 at 64 px)
    assert sorted(p.name for p in folder.glob("*.png")) == sorted(expected)
    first = cv2.imread(str(folder / "stage0_Conv_features.png"))
    channels = np.load(folder / "stage0_Conv_features.npy").shape[0]  # 8 channels at the tiny width
    assert channels == 8 and first.shape[0] < first.shape[1] / 6  # 8 tiles in one row


def test_http_video_source_gives_the_local_file_result(weights: Path, tmp_path: Path) -> None:
    from tests.helpers import serve_folder, write_video

    video = write_video(tmp_path / "v.mp4", [scene(i) for i in range(4)])
    local = run_detect("--weights", weights, "--source", video, "--img-size", 64, *LOW_CONF, "--nosave",
                       "--project", tmp_path / "runs")
    with serve_folder(tmp_path) as url:
        remote = run_detect("--weights", weights, "--source", f"{url}/v.mp4", "--img-size", 64, *LOW_CONF,
                            "--project", tmp_path / "runs")
    assert [d.split(")")[0] for d, _ in remote.detections][-1] == "video 1/1 (frame 4/4"
    for (_, a), (_, b) in zip(local.detections, remote.detections, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (remote.save_dir / "v.mp4").is_file()


def test_streams_file_detects_on_every_stream(weights: Path, tmp_path: Path, capsys) -> None:
    from tests.helpers import serve_folder, write_video

    write_video(tmp_path / "v.mp4", [scene(i) for i in range(5)])
    listing = tmp_path / "cams.streams"
    with serve_folder(tmp_path) as url:
        listing.write_text(f"{url}/v.mp4\n{url}/v.mp4\n")
        result = run_detect("--weights", weights, "--source", listing, "--img-size", 64, "--save-txt", *LOW_CONF,
                            "--project", tmp_path / "runs")
    out = capsys.readouterr().out
    assert "2 stream(s) opened" in out and re.search(r"stream 2/2 \(frame \d\) http://127\.0\.0\.1:\d+/v\.mp4: ", out)
    described = [d for d, _ in result.detections]
    assert any(d.startswith("stream 1/2") for d in described) and any(d.startswith("stream 2/2") for d in described)
    assert (result.save_dir / "stream1.mp4").is_file() and (result.save_dir / "stream2.mp4").is_file()
    assert (result.save_dir / "labels" / "stream1_5.txt").is_file()  # the last frame is always delivered


def test_release_name_is_downloaded_and_names_come_from_the_file(release_server: Path, tmp_path: Path) -> None:
    image_file = write_images(tmp_path / "src", 1)[0]
    result = run_detect("--weights", "yolov5s.pt", "--source", image_file, "--img-size", 64, "--conf-thres", 0.0,
                        "--max-det", 3, "--nosave", "--project", tmp_path / "runs")
    assert result.weights == release_server / "yolov5s.pt" and result.weights.is_file()
    from utils.deploy.runtime import InferenceModel

    assert InferenceModel(result.weights).names == [f"class{i}" for i in range(80)]  # the fixture's own names
    assert len(result.detections[0][1]) == 3


def test_openvino_weights_give_the_pt_boxes(tiny_exports: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    image_file = tmp_path / "wide.png"
    cv2.imwrite(str(image_file), scene(3, (40, 64)))
    outputs = [run_detect("--weights", tiny_exports[kind], "--source", image_file, "--img-size", 64, *LOW_CONF,
                          "--nosave", "--project", tmp_path / "runs").detections[0][1] for kind in ("pt", "openvino")]
    assert outputs[0].shape == outputs[1].shape == (5, 6)
    assert np.abs(outputs[0] - outputs[1]).max() < 1e-3


@pytest.mark.parametrize("case, expected", [
    ("unreachable", "cannot open stream http://127.0.0.1:"), ("empty_streams", "lists no streams"),
    ("vid_stride", "--vid-stride 0 must be at least 1"), ("dnn", "--dnn: OpenCV DNN is not used here"),
    ("update", "--update: not needed"), ("data", "--data: class names come from the weights"),
    ("ensemble", "model ensembles are not supported"), ("visualize_export", "--visualize draws the stages"),
    ("augment_static", "--augment runs 3 image sizes; static.onnx is a static export"),
])
def test_new_flags_refused_with_one_line(case: str, expected: str, weights: Path, tiny_exports: dict[str, Path],
                                         tmp_path: Path, capsys) -> None:
    from tests.helpers import free_port

    source = write_images(tmp_path / "src", 1)[0]
    extra: list = {"vid_stride": ["--vid-stride", 0], "dnn": ["--dnn"], "update": ["--update"],
                   "data": ["--data", "coco128.yaml"], "ensemble": ["--weights", weights, weights],
                   "visualize_export": ["--weights", tiny_exports["onnx"], "--visualize"],
                   "augment_static": ["--weights", tiny_exports["static_onnx"], "--augment"]}.get(case, [])
    if case == "unreachable":
        source = f"http://127.0.0.1:{free_port()}/live"
    elif case == "empty_streams":
        source = tmp_path / "none.streams"
        source.write_text("\n")
    args = ["--weights", weights, "--source", source, "--img-size", 64, "--project", tmp_path / "runs", *extra]
    code = run_main(detect.main, detect.parse_opt([str(a) for a in args]), "detect")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("detect: error: ") and expected in err and err.count("\n") == 1, err


V7_DETECT_FLAGS = ["--weights", "a.pt", "--source", "0", "--data", "d.yaml", "--imgsz", "640", "--conf-thres", "0.3",
                   "--iou-thres", "0.5", "--max-det", "9", "--device", "cpu", "--view-img", "--save-txt",
                   "--save-conf", "--save-crop", "--nosave", "--classes", "0", "--agnostic-nms", "--augment",
                   "--visualize", "--update", "--project", "p", "--name", "n", "--exist-ok", "--line-thickness", "2",
                   "--hide-labels", "--hide-conf", "--half", "--dnn", "--vid-stride", "2"]


def test_every_yolov5_v7_flag_parses() -> None:
    opt = detect.parse_opt(V7_DETECT_FLAGS)  # no argparse error for any of them; main() judges each
    assert (opt.view_img, opt.augment, opt.visualize, opt.vid_stride, opt.img_size) == (True, True, True, 2, [640])


def test_crop_folders_from_class_names_stay_inside_the_run(tmp_path: Path) -> None:
    """Class names come from the weights file: a path-like name never places a crop outside crops/."""
    names = ["../../escaped", "/tmp/absolute", "..", "traffic light", "n" * 300, "a/b\\c", ".hidden"]
    det = np.array([[2, 2, 10, 10, 0.9, cls] for cls in range(len(names))], np.float32)
    crop_dir = tmp_path / "run" / "crops"
    detect.save_crops(np.zeros((16, 16, 3), np.uint8), det, names, crop_dir, "img")
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jpg"))
    assert written == sorted(f"run/crops/{folder}/img.jpg" for folder in
                             ["_.._escaped", "_tmp_absolute", "2", "traffic light", "n" * 64, "a_b_c", "hidden"])


def test_a_memory_bomb_weights_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A 1 kB release-shaped file whose tensor is a stride-0 view of 2.5e8 elements: refused before any run."""
    from tests.utils.weights.pickles import build, dct, glob, newobj, program, tensor, torch_zip

    bomb = torch_zip(tmp_path / "yolov5s.pt", program(dct(model=build(newobj(glob("models.yolo", "Model")), dct()),
                                                          epoch=tensor("0", 1, (250_000_000,), (0,)))),
                     {"0": np.float32([1.0]).tobytes()})
    args = ["--weights", bomb, "--source", write_images(tmp_path / "src", 1)[0], "--project", tmp_path / "runs"]
    code = run_main(detect.main, detect.parse_opt([str(a) for a in args]), "detect")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("detect: error: ") and "overlapping view" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_augment_is_refused_for_an_end_to_end_models_final_rows() -> None:
    from types import SimpleNamespace

    from utils.tasks.contract import OutputContract

    opt = detect.parse_opt(["--augment"])
    final = SimpleNamespace(contract=OutputContract("xyxy_score_cls", 80), weights=Path("yolo26n.onnx"),
                            module=None, dynamic=True)
    with pytest.raises(detect.DetectError, match=r"^--augment merges three passes before NMS; yolo26n.onnx returns "
                                                 r"final rows \(xyxy_score_cls, no NMS\): drop --augment$"):
        detect.check_model_options(opt, final)
    detect.check_model_options(opt, SimpleNamespace(**{**vars(final), "contract": OutputContract("xywh_cls", 80)}))


# ------------------------------------------------------------------------------------------ segmenters
def outline_extent(outline: np.ndarray) -> np.ndarray:
    return np.concatenate((outline.min(0), outline.max(0)))


def test_segmenter_masks_outlines_label_rows_and_retina_masks(tiny_seg_weights: Path, tmp_path: Path) -> None:
    """Each mask of the box-mask segmenter is its box: the outlines (and the polygon rows of --save-txt) run along
    the boxes, within a pixel with --retina-masks (cropped at the original resolution) and within the prototypes'
    4 px otherwise; masks are blended into the saved image; crops are saved."""
    weights = box_masks_segmenter(tiny_seg_weights, tmp_path / "weights")
    image_file = write_images(tmp_path / "src", 1)[0]
    original = cv2.imread(str(image_file))
    results = {}
    for retina in (False, True):
        flags = ["--retina-masks"] if retina else []
        results[retina] = run_detect("--weights", weights, "--source", image_file, "--img-size", 64, *LOW_CONF,
                                     "--save-txt", "--save-conf", "--save-crop", *flags, "--name", f"r{int(retina)}",
                                     "--project", tmp_path / "runs")
    for retina, limit in ((True, 1.0), (False, 4.5)):
        result = results[retina]
        det, outlines = result.detections[0][1], result.outlines[0]
        assert len(det) == 5 and len(outlines) == 5 and det.shape[1] == 6
        for row, outline in zip(det, outlines):
            assert np.abs(outline_extent(outline) - row[:4]).max() <= limit, (retina, row, outline_extent(outline))
        lines = (result.save_dir / "labels" / "img0.txt").read_text().splitlines()
        assert len(lines) == 5
        for line, row, outline in zip(lines, det, outlines):
            values = [float(v) for v in line.split()]
            assert values[0] == row[5] and abs(values[-1] - row[4]) < 1e-4  # class first, --save-conf last
            points = np.array(values[1:-1]).reshape(-1, 2) * [64, 48]
            np.testing.assert_allclose(points, outline, atol=1e-3)
        annotated = cv2.imread(str(result.save_dir / "img0.png"))
        x1, y1, x2, y2 = det[0, :4].round().astype(int) + [3, 3, -3, -3]  # inside the best box, off its lines
        assert (annotated[y1:y2, x1:x2] != original[y1:y2, x1:x2]).any(-1).mean() > 0.5
        assert len(list((result.save_dir / "crops").rglob("*.jpg"))) == 5
    np.testing.assert_allclose(results[True].detections[0][1], results[False].detections[0][1])


def test_segmenter_refuses_augment(tiny_seg_weights: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--augment .* segmenter"):
        run_detect("--weights", tiny_seg_weights, "--source", write_images(tmp_path / "src", 1)[0], "--img-size",
                   64, "--augment", "--project", tmp_path / "runs")
