"""evaluate(): metrics agree with pycocotools' COCOeval on the --save-json output, outputs, loss, single-class.

An "oracle" model stands in for a trained detector: for each batch it returns jittered copies of the
labels (some with the wrong class) plus spurious boxes, as decoded outputs, so the whole path runs
(NMS, rescaling to original pixels, matching, JSON) with metrics well away from 0 and 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from tests.helpers import OracleModel
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader
from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic
from utils.evaluation.evaluate import TABLE_HEADER, evaluate, model_input
from utils.evaluation.outputs import COCO80_TO_91
from utils.log import LOGGER

NC = len(SYNTHETIC_NAMES)


def coco_ground_truth(root: Path, split: str = "val") -> dict:
    """The COCO-format ground truth of a YOLO-format split (image ids from numeric file stems)."""
    gt = {"images": [], "annotations": [], "categories": [{"id": c, "name": n} for c, n in enumerate(SYNTHETIC_NAMES)]}
    for image in sorted((root / "images" / split).glob("*.jpg")):
        h, w = cv2.imread(str(image)).shape[:2]
        gt["images"].append({"id": int(image.stem), "width": w, "height": h, "file_name": image.name})
        rows = np.loadtxt(root / "labels" / split / f"{image.stem}.txt", ndmin=2)
        for c, cx, cy, bw, bh in rows:
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": int(image.stem),
                                      "category_id": int(c), "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w,
                                                                      bh * h],
                                      "area": bw * w * bh * h, "iscrowd": 0})
    return gt


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def val_set(tmp_path_factory) -> Path:
    """A 100-image val split of 64-96 px synthetic images."""
    return ensure_synthetic(tmp_path_factory.mktemp("val100") / "synthetic", n_train=2, n_val=100,
                            img_size=(64, 96), seed=3)


def _loader(root: Path, batch_size: int = 16):
    options = DatasetOptions(img_size=96, batch_size=batch_size, rect=True, pad=0.5, nc=NC, names=SYNTHETIC_NAMES)
    return create_dataloader(root / "images" / "val", options, workers=0, shard_eval=True)


def test_map_agrees_with_cocoeval_on_saved_json(val_set, tmp_path, caplog):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    loader, dataset = _loader(val_set)
    assert len(dataset) >= 100
    LOGGER.addHandler(caplog.handler)  # the 'yolo' logger does not propagate once setup_logging() has run
    try:
        with caplog.at_level("INFO", logger="yolo"):
            result = evaluate(OracleModel(loader), loader, device="cpu", names=SYNTHETIC_NAMES, save_dir=tmp_path,
                              save_json=True, verbose=True)
    finally:
        LOGGER.removeHandler(caplog.handler)
    assert result.seen == 100 and result.json_path == tmp_path / "predictions.json"
    assert 0.1 < result.map < result.map50 < 0.99  # a detector that detects something, imperfectly
    gt_path = tmp_path / "gt.json"
    gt_path.write_text(json.dumps(coco_ground_truth(val_set)))
    coco_gt = COCO(str(gt_path))
    evaluator = COCOeval(coco_gt, coco_gt.loadRes(str(result.json_path)), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    assert abs(result.map - evaluator.stats[0]) < 0.005
    assert abs(result.map50 - evaluator.stats[1]) < 0.005
    assert result.n_labels == len(coco_gt.dataset["annotations"])
    assert TABLE_HEADER in caplog.text and "Speed: " in caplog.text
    assert sum(f" {n} " in caplog.text for n in SYNTHETIC_NAMES) == NC  # --verbose: one row per class


def test_pycocotools_runs_when_annotations_exist(val_set, tmp_path):
    loader, _ = _loader(val_set, batch_size=32)
    gt_path = tmp_path / "instances.json"
    gt_path.write_text(json.dumps(coco_ground_truth(val_set)))
    result = evaluate(OracleModel(loader), loader, device="cpu", names=SYNTHETIC_NAMES, save_dir=tmp_path,
                      save_json=True, anno_json=gt_path, plots=True)
    assert result.coco_map is not None and abs(result.coco_map - result.map) < 0.005
    for name in ("PR_curve.png", "F1_curve.png", "confusion_matrix.png", "val_batch0_labels.jpg",
                 "val_batch0_pred.jpg", "val_batch2_pred.jpg"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert result.confusion is not None and result.confusion.matrix.sum() > 0


def test_save_txt_and_json_fields(val_set, tmp_path):
    loader, _ = _loader(val_set, batch_size=50)
    result = evaluate(OracleModel(loader), loader, device="cpu", names=SYNTHETIC_NAMES, save_dir=tmp_path,
                      save_txt=True, save_conf=True, save_json=True, is_coco=True)
    rows = json.loads(result.json_path.read_text())
    assert {type(r["image_id"]) for r in rows} == {int}
    assert {r["category_id"] for r in rows} <= {COCO80_TO_91[c] for c in range(NC)} == {1, 2, 3}
    first = min(rows, key=lambda r: (r["image_id"], -r["score"]))
    w, h = cv2.imread(str(val_set / "images" / "val" / "00000.jpg")).shape[1::-1]
    x, y, bw, bh = first["bbox"]
    assert 0 <= x and 0 <= y and x + bw <= w + 1e-3 and y + bh <= h + 1e-3  # original pixels, clipped
    lines = (tmp_path / "labels" / "00000.txt").read_text().splitlines()
    assert len(lines) == sum(r["image_id"] == 0 for r in rows)
    values = np.array([[float(v) for v in line.split()] for line in lines])
    assert values.shape[1] == 6 and np.all((values[:, 1:5] >= 0) & (values[:, 1:5] <= 1))
    assert np.isclose(values[:, 5].max(), first["score"], atol=1e-4)


def test_single_cls_merges_classes(val_set, tmp_path):
    loader, _ = _loader(val_set, batch_size=50)
    multi = evaluate(OracleModel(loader), loader, device="cpu", names=SYNTHETIC_NAMES)
    single = evaluate(OracleModel(loader), loader, device="cpu", names=SYNTHETIC_NAMES, single_cls=True)
    assert single.maps.shape == (1,) and multi.maps.shape == (NC,)
    assert single.map50 > multi.map50  # wrong-class detections count once classes are ignored


def test_compute_loss_keeps_batchnorm_frozen(tiny_cfg, val_set):
    from models.yolo import Model

    loader, _ = _loader(val_set, batch_size=50)
    model = Model(tiny_cfg).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []

    class FakeLoss:  # a family's loss: named terms, here one per level
        names = ("p3", "p4", "p5")

        def __call__(self, maps, targets):  # noqa: ANN001, ANN204
            calls.append([tuple(m.shape) for m in maps])
            items = torch.stack([m[..., 4].sigmoid().mean() for m in maps])
            return items.sum() * len(targets), items

    result = evaluate(model, loader, device="cpu", names=SYNTHETIC_NAMES, compute_loss=FakeLoss(), conf_thres=0.01)
    assert len(calls) == 2 and len(calls[0]) == 3 and calls[0][0][-1] == 5 + NC  # raw (b, na, ny, nx, no) maps
    assert result.loss is not None and list(result.loss) == ["p3", "p4", "p5"]  # named by the loss's terms
    assert all(0 < v < 1 for v in result.loss.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BN statistics untouched
    assert not model.training and not model.head.training


def test_model_input_casts_to_the_layout_asked_with_the_plain_values() -> None:
    """uint8 batches (NCHW or channels_last memory, as the loader makes them) -> float / 255 in the model's layout:
    the values of the plain cast, whatever the layouts."""
    nchw = torch.randint(0, 256, (2, 3, 8, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for imgs in (nchw, nchw.contiguous(memory_format=torch.channels_last)):
        for channels_last in (True, False):
            x = model_input(imgs, torch.device("cpu"), channels_last)
            assert torch.equal(x, nchw.float() / 255) and x.dtype == torch.float32
            assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


# ------------------------------------------------------------------------------------------ segmenters
class MaskOracle(torch.nn.Module):
    """A stand-in segmenter (end-to-end rows with ``nm`` coefficients, and prototypes at 1/4): per batch, in the
    loader's order, each label found 0-2 times with a jittered box, a random score and its mask (prototype j is
    object j's mask from the batch's index image, moved by up to one prototype pixel), plus false positives."""

    def __init__(self, loader, nc: int, nm: int = 25, seed: int = 0) -> None:
        from utils.tasks.contract import OutputContract

        super().__init__()
        self.contract = OutputContract("xyxy_score_cls", nc, nm, "segment")
        rng = np.random.default_rng(seed)
        self.outputs = [self._batch(imgs, targets, extras["masks"], nm, rng)
                        for imgs, targets, _, _, extras in loader]
        self.calls = 0

    @staticmethod
    def _batch(imgs, targets, index_masks, nm, rng):
        b, _, h, w = imgs.shape
        protos = torch.full((b, nm, h // 4, w // 4), -8.0)
        rows = torch.zeros(b, 3 * nm, 6 + nm)
        for i in range(b):
            mine = targets[targets[:, 0] == i]
            found = 0
            for j, (_, cls, cx, cy, bw, bh) in enumerate(mine.tolist()):
                shifted = torch.roll(index_masks[i] == j + 1, tuple(int(v) for v in rng.integers(-1, 2, 2)), (0, 1))
                protos[i, j][shifted] = 8.0
                for _ in range(int(rng.choice([0, 1, 1, 2]))):
                    box = np.array([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]) * (w, h, w, h)
                    box += rng.normal(0, 1.5, 4)
                    rows[i, found, :6] = torch.tensor([*box, rng.uniform(0.05, 1), cls])
                    rows[i, found, 6 + j] = 1.0
                    found += 1
            for _ in range(int(rng.integers(0, 3))):  # false positives: a random box and a random object's mask
                x, y = rng.uniform(0, w - 20), rng.uniform(0, h - 20)
                rows[i, found, :6] = torch.tensor([x, y, x + 20, y + 20, rng.uniform(0.05, 0.6), rng.integers(0, 3)])
                rows[i, found, 6 + int(rng.integers(0, nm))] = 1.0
                found += 1
        return rows, protos

    def forward(self, x: torch.Tensor):
        out = self.outputs[self.calls]
        self.calls += 1
        return out


def test_mask_map_of_a_segmenter_agrees_with_cocoeval_segm(tmp_path):
    """evaluate() on a segmenter reports box and mask metrics apart, writes RLE masks in the predictions JSON, and
    its mask mAP equals pycocotools' COCOeval ``segm`` on that file against ground truth the test writes (the
    labels' outlines filled at each image's original size)."""
    import yaml

    from utils.data.config import load_data_config
    from utils.evaluation.outputs import coco_evaluate
    from utils.tasks.segment.masks import polygons_to_masks, rle_encode

    (tmp_path / "seg.yaml").write_text(yaml.safe_dump({
        "synthetic": {"task": "segment", "n_train": 2, "n_val": 16, "img_size": [64, 96], "seed": 5},
        "path": str(tmp_path / "set"), "train": "images/train", "val": "images/val", "nc": NC,
        "names": SYNTHETIC_NAMES}))
    data = load_data_config(tmp_path / "seg.yaml")
    options = DatasetOptions(img_size=96, batch_size=8, rect=True, pad=0.5, nc=NC, names=SYNTHETIC_NAMES,
                             task="segment")
    loader, dataset = create_dataloader(data.val, options, workers=0, shard_eval=True)
    result = evaluate(MaskOracle(loader, NC), loader, device="cpu", names=SYNTHETIC_NAMES, save_dir=tmp_path,
                      save_json=True, plots=True)  # rows of 31 columns: the plots take the first 6
    assert (tmp_path / "val_batch0_pred.jpg").is_file() and (tmp_path / "val_batch1_pred.jpg").is_file()
    gt = {"images": [], "annotations": [], "categories": [{"id": c, "name": n} for c, n in enumerate(SYNTHETIC_NAMES)]}
    for path, labels, outlines, (w, h) in zip(dataset.im_files, dataset.labels, dataset.extras, dataset.shapes):
        image_id, (w, h) = int(Path(path).stem), (int(w), int(h))
        gt["images"].append({"id": image_id, "width": w, "height": h, "file_name": Path(path).name})
        masks = polygons_to_masks([o * (w, h) for o in outlines], (h, w))
        for (c, cx, cy, bw, bh), mask in zip(labels.tolist(), masks):
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": image_id, "category_id": int(c),
                                      "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], "iscrowd": 0,
                                      "area": int(mask.sum()), "segmentation": rle_encode(mask[None])[0]})
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    rows = json.loads(result.json_path.read_text())
    assert rows and all(set(r["segmentation"]) == {"size", "counts"} for r in rows)
    segm = coco_evaluate(tmp_path / "gt.json", result.json_path, iou_type="segm")
    bbox = coco_evaluate(tmp_path / "gt.json", result.json_path, iou_type="bbox")
    mask = result.mask.mean_results()
    assert 0.1 < segm[0] < 0.9 and abs(mask[3] - segm[0]) < 0.005 and abs(mask[2] - segm[1]) < 0.005
    assert abs(result.map - bbox[0]) < 0.005 and abs(result.map50 - bbox[1]) < 0.005
    assert abs(result.map - mask[3]) > 0.005  # boxes and masks scored apart
    assert list(result.named_results())[4:] == ["mask_precision", "mask_recall", "mask_mAP_0.5", "mask_mAP_0.5:0.95"]
