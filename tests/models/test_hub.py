"""torch.hub entry points: offline model building, release weights through the download path, detections that land
in original image pixels whatever the input form (path, RGB array, PIL image, list)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from models.hub import Detections, Detector, ImageInputError
from tests.helpers import built_on_meta
from utils.data.sources import letterbox_shape

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def detector() -> Detector:
    """The v7.0 release fixture through ``custom(path=...)``, keeping every box (random weights score low)."""
    model = torch.hub.load(str(ROOT), "custom", source="local", path=FIXTURES / "yolov5n-v7.0.pt", device="cpu")
    model.conf = 0.0
    return model


@pytest.fixture(scope="module")
def image_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A non-square (96 x 150) noisy image, saved losslessly so file and array inputs hold the same pixels."""
    rng = np.random.default_rng(0)
    image = cv2.GaussianBlur(rng.integers(0, 256, (96, 150, 3), dtype=np.uint8), (5, 5), 0)
    path = tmp_path_factory.mktemp("images") / "wide.png"
    cv2.imwrite(str(path), image)
    return path


def assert_same_detections(found: torch.Tensor, expected: torch.Tensor) -> None:
    """Same rows up to order (near-equal scores may sort either way): every row of each has a twin in the other."""
    assert found.shape == expected.shape
    distance = torch.cdist(found.double(), expected.double())  # rows are [x1, y1, x2, y2, score, class]
    assert distance.min(1).values.max() < 1e-3 and distance.min(0).values.max() < 1e-3


def test_hub_builds_yolov5n_offline_without_weights() -> None:
    model = torch.hub.load(str(ROOT), "yolov5n", source="local", pretrained=False, device="cpu")
    assert isinstance(model, Detector)
    assert sum(p.numel() for p in model.model.parameters()) == 1_872_157
    assert len(model.names) == 80 and model.stride == 32
    result = model(np.zeros((64, 96, 3), np.uint8), size=64)
    assert isinstance(result, Detections) and len(result) == 1 and result.xyxy[0].shape[1] == 6
    assert result.shapes == [(64, 96)]


def test_hub_pretrained_release_weights_through_the_download_path(release_server: Path,
                                                                  yolo_log: list[str]) -> None:
    model = torch.hub.load(str(ROOT), "yolov5n", source="local", pretrained=True, device="cpu")
    assert (release_server / "yolov5n.pt").is_file()  # downloaded into YOLO_WEIGHTS_DIR
    data = np.load(FIXTURES / "yolov5n-v7.0.npz")
    output = model(torch.from_numpy(data["input"]))  # a tensor batch goes straight to the model
    expected = torch.from_numpy(data["output"])
    torch.testing.assert_close(output, expected, atol=1e-4, rtol=1e-6)  # see test_release_reader.max_error
    # a new class count: the head starts afresh, everything else is the release's
    three = torch.hub.load(str(ROOT), "yolov5n", source="local", pretrained=True, classes=3, device="cpu")
    assert three.model.nc == 3 and three.model.detect.m[0].weight.shape == (24, 64, 1, 1)
    total = len(three.model.state_dict())
    assert any(f"Transferred {total - 6}/{total} items" in line for line in yolo_log), yolo_log
    assert torch.equal(three.model.model[0].conv.weight, model.model.model[0].conv.weight)
    assert not torch.equal(three.model.detect.m[0].bias[:4], model.model.detect.m[0].bias[:4])


def test_path_array_pil_and_list_give_the_same_boxes(detector: Detector, image_file: Path) -> None:
    rgb = cv2.imread(str(image_file))[..., ::-1]  # numpy inputs are RGB, as PIL gives them
    by_path = detector(str(image_file), size=150)
    by_array = detector(rgb.copy(), size=150)
    by_pil = detector(Image.open(image_file), size=150)
    assert by_path.xyxy[0].shape[0] > 10
    assert torch.equal(by_path.xyxy[0], by_array.xyxy[0]) and torch.equal(by_path.xyxy[0], by_pil.xyxy[0])
    # a batch of two computes in other blocks, so near-equal random scores may reorder: compare without NMS
    keep_all = Detector(detector.model, conf=0.0, iou=1.0)
    alone = keep_all(rgb.copy(), size=150).xyxy[0]
    batch = keep_all([image_file, rgb.copy()], size=150)
    assert len(batch) == 2 and batch.sources == [str(image_file), "image1"] and len(alone) == 3 * (240 + 60 + 15)
    for found in batch.xyxy:
        assert_same_detections(found, alone)
    bgr_by_mistake = detector(np.ascontiguousarray(rgb[..., ::-1]), size=150)
    assert not torch.equal(bgr_by_mistake.xyxy[0], by_path.xyxy[0])  # channel order matters: RGB is the contract


def test_boxes_are_in_original_image_pixels(detector: Detector, image_file: Path) -> None:
    small = cv2.imread(str(image_file))[..., ::-1]  # 96 x 150: fed as is, padded to 96 x 160
    large = cv2.resize(small, (300, 192), interpolation=cv2.INTER_NEAREST)  # 2x: letterboxed back to `small`
    found_small = detector(small.copy(), size=150)
    found_large = detector(large, size=150)
    assert found_small.shapes == [(96, 150)] and found_large.shapes == [(192, 300)]
    boxes = found_small.xyxy[0]
    assert boxes.shape[0] > 10
    assert boxes[:, [0, 2]].min() >= 0 and boxes[:, [0, 2]].max() <= 150
    assert boxes[:, [1, 3]].min() >= 0 and boxes[:, [1, 3]].max() <= 96
    assert boxes[:, 2].max() > 140 and boxes[:, 0].min() < 10  # the padding is removed, not left as an offset
    torch.testing.assert_close(found_large.xyxy[0][:, :4], 2 * boxes[:, :4])
    torch.testing.assert_close(found_large.xyxy[0][:, 4:], boxes[:, 4:])
    rows = found_small.tolist()[0]
    assert rows[0]["name"] == detector.names[rows[0]["class"]] and len(rows[0]["box"]) == 4
    assert found_small.labels(0)[0] == rows[0]["name"] and "image 1/1 image0: 150x96" in repr(found_small)


def test_batch_shape_fits_every_image() -> None:
    assert letterbox_shape([(96, 150)], 150, 32) == (96, 160)
    assert letterbox_shape([(480, 640), (640, 480)], 320, 32) == (320, 320)
    assert letterbox_shape([(100, 400)], 640, 32) == (160, 640)


def test_unreadable_inputs_give_one_line(detector: Detector, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not an image")
    cases = [(tmp_path / "missing.jpg", "file not found"), (tmp_path / "notes.txt", "not an image"),
             (np.zeros((4, 4, 2), np.uint8), "expected an HWC array"), (42, "a int is not a path")]
    for image, reason in cases:
        with pytest.raises(ImageInputError) as info:
            detector(image)
        assert reason in str(info.value) and "\n" not in str(info.value)


def test_a_segmenter_returns_masks_as_detect_py_makes_them(tiny_seg_weights: Path, tmp_path: Path) -> None:
    """custom(path=segmenter): per image (k, h, w) masks at the image's size, made by the same post-processing as
    detect.py's (the same outlines); each mask of the box-mask segmenter lies in its box (within the prototypes'
    4 px)."""
    import detect
    from tests.helpers import box_masks_segmenter
    from utils.tasks.segment.masks import masks_to_polygons

    weights = box_masks_segmenter(tiny_seg_weights, tmp_path)
    image = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "scene.png"), image)
    model = torch.hub.load(str(ROOT), "custom", source="local", path=weights, device="cpu")
    model.conf, model.max_det = 0.001, 5
    found = model(tmp_path / "scene.png", size=64)
    assert found.masks is not None and found.masks[0].shape == (5, 48, 64) and found.masks[0].dtype == torch.bool
    result = detect.run(weights=weights, source=tmp_path / "scene.png", img_size=64, conf_thres=0.001, max_det=5,
                        nosave=True, project=tmp_path / "runs")
    assert_same_detections(found.xyxy[0], torch.from_numpy(result.detections[0][1]))
    for mask, outline, box in zip(found.masks[0], result.outlines[0], found.xyxy[0][:, :4]):
        np.testing.assert_allclose(masks_to_polygons(mask[None])[0], outline)
        ys, xs = np.nonzero(mask.numpy())
        assert xs.min() >= box[0] - 4 and xs.max() <= box[2] + 3 and ys.min() >= box[1] - 4 and ys.max() <= box[3] + 3
    detector = torch.hub.load(str(ROOT), "custom", source="local", path=FIXTURES / "yolov5n-v7.0.pt", device="cpu")
    assert detector(tmp_path / "scene.png").masks is None


def test_segmenter_entry_points_build_offline_with_their_sizes(tmp_path: Path) -> None:
    """yolov5n_seg ... yolo11x_seg: each calls _create with its YAML name; the docstring's size is the built
    model's (checked on the meta device), and yolov5n_seg builds offline and returns masks."""
    import hubconf

    for family in ("yolov5", "yolov8", "yolo11", "yolo26"):
        for scale in "nsmlx":
            entry = getattr(hubconf, f"{family}{scale}_seg")
            layers = built_on_meta(f"{family}{scale}-seg")
            assert f"{sum(p.numel() for p in layers.parameters()):,} parameters" in entry.__doc__
    model = torch.hub.load(str(ROOT), "yolov5n_seg", source="local", pretrained=False, classes=3, device="cpu")
    assert model.model.head.task == "segment" and model.model.head.nc == 3 and model.model.head.nm == 32
    model.conf = 0.0
    found = model(np.zeros((48, 64, 3), np.uint8), size=64)
    assert found.masks is not None and found.masks[0].shape[1:] == (48, 64)


def test_pose_entry_points_build_offline_with_their_sizes_and_return_keypoints() -> None:
    """yolov8n_pose ... yolo26x_pose: one class (person) by default, as their release files; the docstring's size is
    the built model's (on the meta device); yolo11n_pose builds offline and its Detections carry each detection's
    17 keypoints (x, y, visibility) inside the image."""
    import inspect

    import hubconf

    for family in ("yolov8", "yolo11", "yolo26"):
        for scale in "nsmlx":
            entry = getattr(hubconf, f"{family}{scale}_pose")
            assert inspect.signature(entry).parameters["classes"].default == 1
            layers = built_on_meta(f"{family}{scale}-pose", nc=1)
            assert f"{sum(p.numel() for p in layers.parameters()):,} parameters (nc 1)" in entry.__doc__
    model = torch.hub.load(str(ROOT), "yolo11n_pose", source="local", pretrained=False, device="cpu")
    assert model.model.head.task == "pose" and model.model.head.nc == 1
    model.conf = 0.0
    found = model(np.zeros((48, 64, 3), np.uint8), size=64)
    keypoints = found.keypoints[0]
    assert keypoints.shape == (len(found.xyxy[0]), 17, 3) and len(found.xyxy[0]) > 0
    assert (keypoints[..., 0] >= 0).all() and (keypoints[..., 0] <= 64).all() and (keypoints[..., 1] <= 48).all()
