"""Evaluation reads every output contract (utils.tasks.contract): the same detections laid out as YOLOv5's rows
(objectness x class), an anchor-free head's (class scores only) or an end-to-end head's final rows give the same
metrics through the one post-processing call; --save-hybrid writes labels in each layout; TTA is refused where
its merge cannot apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import OracleModel, bright_box_predict
from utils.boxes import xywh2xyxy
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader
from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic
from utils.evaluation.evaluate import evaluate, model_contract
from utils.evaluation.outputs import with_label_boxes
from utils.evaluation.tta import AugmentError, DetectLayout, augmented_forward, layout_of
from utils.tasks.contract import ContractError, OutputContract, postprocess

NC = len(SYNTHETIC_NAMES)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def loader(tmp_path_factory):
    root = ensure_synthetic(tmp_path_factory.mktemp("val40") / "synthetic", n_train=2, n_val=40, img_size=(64, 96),
                            seed=5)
    options = DatasetOptions(img_size=96, batch_size=20, rect=True, pad=0.5, nc=NC, names=SYNTHETIC_NAMES)
    return create_dataloader(root / "images" / "val", options, workers=0, shard_eval=True)[0]


class Relaid(nn.Module):
    """The oracle's YOLOv5 rows relaid as another contract: ``xywh_cls`` (class score = objectness x class, so NMS
    sees the same confidences) or ``xyxy_score_cls`` (YOLOv5's post-processed detections padded to ``max_det``
    final rows, as an end-to-end head returns them)."""

    def __init__(self, oracle: OracleModel, layout: str, max_det: int = 300) -> None:
        super().__init__()
        self.oracle, self.contract, self.max_det = oracle, OutputContract(layout, NC), max_det

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.oracle(x)
        if self.contract.layout == "xywh_cls":
            return torch.cat((rows[..., :4], rows[..., 5:] * rows[..., 4:5]), -1)
        final = torch.zeros(rows.shape[0], self.max_det, 6)
        for i, det in enumerate(postprocess(rows, self.oracle.contract, 0.001, 0.6, multi_label=True)):
            final[i, :len(det)] = det[: self.max_det]
        return final


def test_every_contract_gives_the_metrics_of_the_same_detections(loader) -> None:
    reference = evaluate(OracleModel(loader), loader, device="cpu", names=SYNTHETIC_NAMES)
    anchor_free = evaluate(Relaid(OracleModel(loader), "xywh_cls"), loader, device="cpu", names=SYNTHETIC_NAMES)
    end_to_end = evaluate(Relaid(OracleModel(loader), "xyxy_score_cls"), loader, device="cpu", names=SYNTHETIC_NAMES)
    assert 0.05 < reference.map < reference.map50 < 0.99
    for other in (anchor_free, end_to_end):
        assert other.results() == pytest.approx(reference.results(), abs=1e-9)


def test_a_model_without_a_contract_is_refused_in_one_line(loader) -> None:
    with pytest.raises(ContractError, match="Linear states no output contract"):
        model_contract(nn.Linear(2, 2))
    assert model_contract(OracleModel(loader)) == OutputContract("xywh_obj_cls", NC)
    model = nn.Module()
    model.head = Relaid(OracleModel(loader), "xywh_cls")  # a model asks its head
    assert model_contract(model).layout == "xywh_cls"


@pytest.mark.parametrize("layout", ["xywh_obj_cls", "xywh_cls", "xyxy_score_cls"])
def test_save_hybrid_rows_are_the_labels_in_each_layout(layout: str) -> None:
    contract = OutputContract(layout, NC)
    targets = torch.tensor([[0, 2, 0.5, 0.5, 0.5, 0.25], [1, 1, 0.25, 0.75, 0.2, 0.2]])
    preds = torch.zeros(2, 4, contract.columns)  # nothing predicted
    rows = with_label_boxes(preds, targets, (64, 128), contract)
    dets = postprocess(rows, contract, conf_thres=0.5, iou_thres=0.6)
    expected = [torch.tensor([[32.0, 24.0, 96.0, 40.0, 1.0, 2.0]]), torch.tensor([[19.2, 41.6, 44.8, 54.4, 1.0, 1.0]])]
    for det, want in zip(dets, expected):
        torch.testing.assert_close(det, want)


def test_tta_merges_rows_before_nms_and_refuses_final_rows() -> None:
    images = torch.zeros(1, 3, 96, 128)
    images[..., 20:60, 30:90] = 1.0
    layout = DetectLayout((8.0, 16.0, 32.0), 3)
    merged = augmented_forward(bright_box_predict, images, layout, OutputContract("xywh_obj_cls", 3))
    assert merged.shape[-1] == 8 and merged.shape[1] > 0
    with pytest.raises(AugmentError, match="this model's rows are final"):
        augmented_forward(bright_box_predict, images, layout, OutputContract("xyxy_score_cls", 3))


def test_the_tta_layout_comes_from_the_heads_export_metadata(tiny_cfg) -> None:
    from models.yolo import Model

    assert layout_of(Model(tiny_cfg)) == DetectLayout((8.0, 16.0, 32.0), 3)  # anchors per cell

    class AnchorFree(nn.Module):  # a head with no anchors: one row per cell
        def export_metadata(self) -> dict:
            return {"contract": OutputContract("xywh_cls", 3).metadata(), "stride": [8.0, 16.0, 32.0]}

    model = nn.Module()
    model.head = AnchorFree()
    assert layout_of(model) == DetectLayout((8.0, 16.0, 32.0), 1)


def test_hybrid_end_to_end_rows_are_xyxy(tmp_path: Path) -> None:
    contract = OutputContract("xyxy_score_cls", 2)
    rows = with_label_boxes(torch.zeros(1, 0, 6), torch.tensor([[0, 1, 0.5, 0.5, 0.5, 0.5]]), (10, 20), contract)
    torch.testing.assert_close(rows[0, 0], torch.tensor([5.0, 2.5, 15.0, 7.5, 1.0, 1.0]))
    assert torch.equal(xywh2xyxy(torch.tensor([[10.0, 5.0, 10.0, 5.0]])), rows[0, :, :4])
