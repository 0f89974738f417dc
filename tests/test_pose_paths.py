"""A pose model through detect.py, test.py, export.py and torch.hub, on a set labelled with its own predictions.

A yolo11n-pose with seed-0 weights (1 class, COCO's 17 keypoints, the synthetic pose set's flip_idx) labels 8 of
the synthetic pose set's images through detect.py --save-txt (its best detections, at most 3 each): a set on which
its box and keypoint mAP are well above 0 without training, so the comparisons below mean something.

- detect.py writes YOLO pose rows (class, box, 17 x (x, y, visibility)) that the pose label reader accepts, and
  draws each shown keypoint on the saved image;
- test.py on the same images as a COCO JSON split (with each object's own ``area``): the keypoint mAP@.5:.95 it
  prints equals pycocotools' COCOeval ``keypoints`` on its --save-json predictions within 0.005, the box mAP
  COCOeval ``bbox``'s;
- the TorchScript, ONNX and OpenVINO exports (dynamic) validate in test.py within 0.005 of the .pt's box and
  keypoint figures;
- test.py prints the box row, then the keypoint row;
- the hub model (custom) returns each detection's keypoints, and --augment merges mirrored keypoints back;
- SavedModel, TFLite and NCNN carry the keypoints (YOLO26's NCNN and every --int8 TensorFlow graph are refused in
  one line), and the Core ML package records them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml

import detect
import export
import test as test_script
from tests.helpers import ROOT
from utils.data.label_cache import read_label_rows
from utils.deploy import formats

pytestmark = pytest.mark.usefixtures("one_thread_and_clean_logger")

FLIP = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]
MAX_DIFF = 0.005  # the bound: an export against the .pt, our keypoint mAP against COCOeval's
MIN_POSE_MAP50 = 0.2  # the .pt's keypoint mAP@.5 on its own labels: the comparisons mean something
AREA_SHARE = 0.6  # the COCO split's areas: a share of each box other than YOLO labels' 0.53


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(weights, YOLO data YAML, COCO data YAML) of the self-labelled set (see the module docstring)."""
    from models.yolo import Model
    from utils.tasks.pose.synthetic import ensure_synthetic_pose
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    folder = tmp_path_factory.mktemp("pose-paths")
    source = ensure_synthetic_pose(folder / "source", n_train=1, n_val=8, img_size=(64, 80), seed=3)
    torch.manual_seed(0)
    model = Model({**yaml.safe_load((ROOT / "models" / "yolo11-pose.yaml").read_text()), "scale": "n",
                   "flip_idx": FLIP}, nc=1)
    model.names = ["figure"]
    weights = save_checkpoint(new_checkpoint(model), folder / "weights" / "pose.pt")
    images = folder / "set" / "images" / "val"
    shutil.copytree(source / "images" / "val", images)
    found = detect.run(weights=str(weights), source=str(images), img_size=64, conf_thres=0.001, max_det=3,
                       save_txt=True, project=str(folder / "detect"), name="labels")
    shutil.copytree(found.save_dir / "labels", folder / "set" / "labels" / "val")
    keys = {"nc": 1, "names": ["figure"], "kpt_shape": [17, 3], "flip_idx": FLIP}
    yolo = folder / "pose.yaml"
    yolo.write_text(yaml.safe_dump({"path": str(folder / "set"), "train": "images/val", "val": "images/val", **keys}))
    coco_json(folder / "set", folder / "set" / "val.json")
    coco = folder / "pose-coco.yaml"
    coco.write_text(yaml.safe_dump({"path": str(folder / "set"), "train": "images/val",
                                    "val": {"coco": "val.json", "images": "images/val"}, **keys}))
    return weights, yolo, coco


def coco_json(root: Path, path: Path) -> None:
    """The YOLO pose labels of ``root``'s val images as a COCO keypoints file (areas AREA_SHARE of the boxes)."""
    images, annotations = [], []
    for image_id, image in enumerate(sorted((root / "images" / "val").iterdir()), 1):
        h, w = cv2.imread(str(image)).shape[:2]
        images.append({"id": image_id, "file_name": image.name, "width": w, "height": h})
        rows, _ = read_label_rows(root / "labels" / "val" / f"{image.stem}.txt")
        for values in (np.array(row, np.float64) for row in rows):
            cx, cy, bw, bh = values[1:5] * (w, h, w, h)
            points = values[5:].reshape(17, 3) * (w, h, 1)
            points[:, 2] = np.where(points[:, 2] > 0, 2, 0)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1, "iscrowd": 0,
                                "bbox": [cx - bw / 2, cy - bh / 2, bw, bh], "area": AREA_SHARE * bw * bh,
                                "keypoints": points.ravel().tolist(), "num_keypoints": int((points[:, 2] > 0).sum())})
    categories = [{"id": 1, "name": "figure", "keypoints": [str(k) for k in range(17)], "skeleton": []}]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))


def figures(weights: Path, data: Path, project: Path, name: str, **options: object) -> tuple[dict, object]:
    result = test_script.run(weights=str(weights), data=str(data), img_size=64, batch_size=8, workers=0,
                             device="cpu", project=str(project), name=name, trust_weights=True, **options)
    assert result.seen == 8 and result.pose is not None
    pose = result.pose.mean_results()
    return {"box mAP@.5": result.map50, "box mAP@.5:.95": result.map, "pose mAP@.5": float(pose[2]),
            "pose mAP@.5:.95": float(pose[3])}, result


def test_detect_writes_pose_rows_and_draws_the_keypoints(labelled: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from utils.tasks.pose.labels import parse_pose_rows

    weights, data, _ = labelled
    labels = data.parent / "set" / "labels" / "val"
    parsed = [parse_pose_rows(read_label_rows(p)[0], (17, 3), 1) for p in sorted(labels.iterdir())]
    assert len(parsed) == 8 and all(1 <= len(p.labels) <= 3 and p.keypoints.shape[1:] == (17, 3) for p in parsed)
    image = data.parent / "set" / "images" / "val" / "00000.jpg"
    result = detect.run(weights=str(weights), source=str(image), img_size=64, conf_thres=0.001, max_det=3,
                        project=str(tmp_path), name="drawn")
    drawn = cv2.imread(str(result.save_dir / image.name)).astype(int)
    original = cv2.imread(str(image)).astype(int)
    rows = np.array(read_label_rows(labels / "00000.txt")[0], np.float64)
    points = rows[:, 5:].reshape(-1, 17, 3)
    h, w = original.shape[:2]
    shown = points[points[..., 2] >= 0.5][:, :2] * (w, h)
    assert len(shown) > 0
    changed = [np.abs(drawn[int(y), int(x)] - original[int(y), int(x)]).max() > 30 for x, y in shown
               if x < w - 1 and y < h - 1]
    assert np.mean(changed) > 0.8  # a keypoint's dot covers its pixel


@pytest.mark.slow
def test_pose_map_equals_cocoeval_keypoints_on_the_same_file(labelled: tuple[Path, Path, Path],
                                                             tmp_path: Path) -> None:
    from utils.evaluation.outputs import coco_evaluate
    from utils.tasks.pose.labels import COCO_SIGMAS

    weights, _, coco = labelled
    ours, result = figures(weights, coco, tmp_path, "coco", save_json=True)
    assert ours["pose mAP@.5"] > MIN_POSE_MAP50, ours
    keypoints = coco_evaluate(coco.parent / "set" / "val.json", result.json_path, iou_type="keypoints",
                              params={"kpt_oks_sigmas": COCO_SIGMAS})
    boxes = coco_evaluate(coco.parent / "set" / "val.json", result.json_path, iou_type="bbox")
    assert abs(keypoints[0] - ours["pose mAP@.5:.95"]) < MAX_DIFF and abs(keypoints[1] - ours["pose mAP@.5"]) < MAX_DIFF
    assert abs(boxes[0] - ours["box mAP@.5:.95"]) < MAX_DIFF, (boxes, ours)


@pytest.mark.slow
def test_every_export_of_a_pose_model_validates_within_0005_of_the_pt(labelled: tuple[Path, Path, Path],
                                                                      tmp_path: Path) -> None:
    weights, data, _ = labelled
    reference, _ = figures(weights, data, tmp_path, "pt")
    assert reference["pose mAP@.5"] > MIN_POSE_MAP50, reference
    formats = ["torchscript", "onnx", "openvino"]
    results = export.main(export.parse_opt(["--weights", str(weights), "--img-size", "64", "--dynamic",
                                            "--include", *formats]))
    assert [r.format for r in results] == formats and all(r.error is None for r in results), results
    for exported in results:
        found, _ = figures(exported.file, data, tmp_path, exported.format)
        far = {k: (found[k], reference[k]) for k in reference if abs(found[k] - reference[k]) > MAX_DIFF}
        assert not far, f"{exported.format}: (export, .pt) differ by more than {MAX_DIFF}: {far}"


def test_the_hub_model_returns_keypoints_and_augment_merges_mirrored_ones(
        labelled: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    weights, data, _ = labelled
    model = torch.hub.load(str(ROOT), "custom", source="local", path=str(weights), device="cpu")
    model.conf = 0.001
    image = data.parent / "set" / "images" / "val" / "00001.jpg"
    found = model(str(image), size=64)
    h, w = cv2.imread(str(image)).shape[:2]
    keypoints = found.keypoints[0]
    assert keypoints.shape == (len(found.xyxy[0]), 17, 3) and len(keypoints) > 0
    assert (keypoints[..., 0] <= w).all() and (keypoints[..., 1] <= h).all()
    capsys.readouterr()
    plain, _ = figures(weights, data, tmp_path, "plain")
    out = capsys.readouterr().out  # test.py's table: the box row, then the keypoint row
    table = [line.split() for line in out.splitlines() if line.lstrip().startswith("all")]
    assert [row[:-6] for row in table] == [["all"], ["all", "(keypoints)"]]
    assert [float(v) for v in table[0][-2:]] == pytest.approx([plain["box mAP@.5"], plain["box mAP@.5:.95"]],
                                                               abs=1e-3)
    assert [float(v) for v in table[1][-2:]] == pytest.approx([plain["pose mAP@.5"], plain["pose mAP@.5:.95"]],
                                                               abs=1e-3)
    augmented, _ = figures(weights, data, tmp_path, "tta", augment=True)
    assert augmented["pose mAP@.5"] > 0  # keypoints of the mirrored pass swapped back: still match the labels


@pytest.mark.slow
@pytest.mark.skipif(formats.missing_packages((("tensorflow", "x"), ("ai_edge_litert", "x"), ("pnnx", "x"),
                                              ("ncnn", "x"))) != [], reason="pip install -r requirements-export.txt")
def test_the_other_formats_carry_the_keypoints_or_say_why_not(labelled: tuple[Path, Path, Path],
                                                              tmp_path: Path) -> None:
    """yolo11n-pose: SavedModel, TFLite and NCNN verify at export (each output column, keypoints too, against the
    .pt); yolo26n-pose: TFLite verifies, NCNN (raw maps decoded on the host) is refused in one line."""
    from models.yolo import Model
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    weights, _, _ = labelled
    static = tmp_path / "v11" / "pose.pt"
    static.parent.mkdir()
    shutil.copyfile(weights, static)
    results = export.main(export.parse_opt(["--weights", str(static), "--img-size", "64", "--include",
                                            "saved_model", "tflite", "ncnn"]))
    assert all(r.error is None and "keypoints" in r.verification.describe() for r in results), results
    torch.manual_seed(0)
    model = Model("yolo26n-pose.yaml", nc=1)
    model.names = ["person"]
    end_to_end = save_checkpoint(new_checkpoint(model), tmp_path / "v26" / "pose26.pt")
    tflite = export.main(export.parse_opt(["--weights", str(end_to_end), "--img-size", "64", "--include", "tflite"]))
    assert tflite[0].error is None and "keypoints" in tflite[0].verification.describe()
    with pytest.raises(export.ExportError, match="51 extra columns \\(pose\\) are not decoded here") as info:
        export.main(export.parse_opt(["--weights", str(end_to_end), "--img-size", "64", "--include", "ncnn"]))
    assert "\n" not in str(info.value)
    import tensorflow as tf

    from utils.deploy.formats import FormatError
    from utils.deploy.tf_graph import translate_model

    for pose in (model, Model("yolo11n-pose.yaml", nc=1)):  # --int8's raw maps would drop the keypoints: refused
        with pytest.raises(FormatError, match="a pose model has no raw-map \\(INT8\\) form; export it in float"):
            translate_model(tf, pose.fuse().eval(), raw_maps=True)


@pytest.mark.slow
@pytest.mark.skipif(formats.missing_packages(formats.get_format("coreml").export_packages) != [],
                    reason="coremltools is not installed")
def test_the_core_ml_package_carries_the_keypoints_in_its_contract(labelled: tuple[Path, Path, Path],
                                                                   tmp_path: Path) -> None:
    """Core ML has no runtime on Linux: the package is written and read back, its one output the rows whose contract
    carries the 51 keypoint columns, and kpt_shape in its metadata."""
    weights, _, _ = labelled
    local = tmp_path / "pose.pt"
    shutil.copyfile(weights, local)
    (result,) = export.main(export.parse_opt(["--weights", str(local), "--img-size", "64", "--include", "coreml"]))
    assert result.error is None and result.file == tmp_path / "pose.mlpackage"
    found = formats.get_format("coreml").read_back(result.file)
    head = found["meta"]["head"]
    assert found["inputs"] == {"images": [1, 3, 64, 64]} and found["outputs"] == ["output0"]
    assert head["task"] == "pose" and head["contract"]["extra"] == 51 and head["kpt_shape"] == [17, 3]
    assert head["flip_idx"] == FLIP
