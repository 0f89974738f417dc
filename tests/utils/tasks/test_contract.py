"""The output contract and the one post-processing call: every layout gives the same detections for the same boxes;
a task's extra columns ride along with their rows."""

from __future__ import annotations

import pytest
import torch

from utils.boxes import non_max_suppression
from utils.tasks.contract import ContractError, OutputContract, postprocess


def _scene(b: int = 2, n: int = 200, nc: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xywh = torch.cat((torch.rand(b, n, 2, generator=g) * 160, 8 + torch.rand(b, n, 2, generator=g) * 40), -1)
    scores = torch.rand(b, n, nc, generator=g) ** 3
    return xywh, scores


def test_anchor_free_rows_give_what_objectness_one_gives() -> None:
    xywh, scores = _scene()
    anchor_free = torch.cat((xywh, scores), -1)
    with_obj = torch.cat((xywh, torch.ones_like(scores[..., :1]), scores), -1)
    for multi in (False, True):
        got = postprocess(anchor_free, OutputContract("xywh_cls", 3), 0.2, 0.5, multi_label=multi)
        want = postprocess(with_obj, OutputContract("xywh_obj_cls", 3), 0.2, 0.5, multi_label=multi)
        assert [g.shape for g in got] == [w.shape for w in want] and all(g.shape[0] > 3 for g in got)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_mask_coefficients_follow_their_boxes() -> None:
    xywh, scores = _scene(nc=2)
    coef = torch.arange(2 * 200 * 4, dtype=torch.float32).view(2, 200, 4)  # row-identifying values
    pred = torch.cat((xywh, torch.ones_like(scores[..., :1]), scores, coef), -1)
    kept = postprocess(pred, OutputContract("xywh_obj_cls", 2, 4, "segment"), 0.1, 0.5)
    plain = non_max_suppression(pred[..., :7], 0.1, 0.5)
    for image, (det, ref) in enumerate(zip(kept, plain)):
        assert det.shape[1] == 10 and torch.equal(det[:, :6], ref)
        rows = (det[:, 6] / 4).long() - image * 200  # the first coefficient names the row it came from
        assert torch.allclose(pred[image, rows, 2:4], det[:, 2:4] - det[:, :2])  # widths, heights of those rows
        assert torch.equal(pred[image, rows, 7:], det[:, 6:])
        assert torch.allclose(scores[image, rows].amax(1), det[:, 4])


def test_end_to_end_rows_are_only_filtered() -> None:
    rows = torch.tensor([[[0, 0, 10, 10, 0.9, 1, 7.0], [0, 0, 10, 10, 0.1, 0, 8.0], [5, 5, 9, 9, 0.95, 2, 9.0],
                          [5, 5, 9, 9, 0.5, 1, 6.0]]])
    contract = OutputContract("xyxy_score_cls", 3, 1, "segment")
    (det,) = postprocess(rows, contract, conf_thres=0.2)
    assert det[:, 4].tolist() == pytest.approx([0.95, 0.9, 0.5]) and det[:, 6].tolist() == [9.0, 7.0, 6.0]
    (det,) = postprocess(rows, contract, conf_thres=0.2, classes=[1], max_det=1)
    assert det.tolist() == [[0, 0, 10, 10, pytest.approx(0.9), 1, 7.0]]  # overlapping boxes both stay without NMS


def test_contracts_round_trip_and_refuse_bad_values() -> None:
    contract = OutputContract("xywh_cls", 80, 32, "segment")
    assert OutputContract.from_metadata(contract.metadata()) == contract and contract.columns == 116
    assert contract.outputs == ("rows", "prototypes") and OutputContract("xywh_cls", 80).outputs == ("rows",)
    legacy = {"layout": "xywh_cls", "nc": 80, "nm": 32}  # a file from before tasks were recorded: its task's key
    assert OutputContract.from_metadata(legacy) == contract
    assert OutputContract.from_metadata({"layout": "xywh_cls", "nc": 80, "nm": 0}) == OutputContract("xywh_cls", 80)
    assert OutputContract.from_metadata(None, nc=5) == OutputContract("xywh_obj_cls", 5, 0)
    assert OutputContract("xywh_obj_cls", 80).columns == 85 and OutputContract("xyxy_score_cls", 80).columns == 6
    bad = [{"layout": "xywh"}, {"layout": "xywh_cls", "nc": 0}, {"layout": "xywh_cls", "nc": 1e9},
           {"layout": "xywh_cls", "nc": 2, "nm": -1}, {"layout": "xywh_cls", "nc": True}, [1, 2],
           {"layout": "xywh_cls", "nc": 2, "code": "x"}, {"layout": "xywh_cls", "nc": 2, "task": "keypoints"},
           {"layout": "xywh_cls", "nc": 2, "extra": 3}]  # the base task has no extra columns
    for meta in bad:
        with pytest.raises(ContractError) as info:
            OutputContract.from_metadata(meta)
        assert "\n" not in str(info.value)
    with pytest.raises(ContractError, match=r"needs \(batch, boxes, 85\)"):
        postprocess(torch.zeros(1, 10, 84), OutputContract("xywh_obj_cls", 80))
    with pytest.raises(ContractError, match="shape"):
        postprocess(torch.zeros(10, 85), OutputContract("xywh_obj_cls", 80))


def test_a_classifier_contract_has_no_rows_and_its_task_post_processes(monkeypatch) -> None:
    """``probs``: one (b, nc) tensor; the base post-processing refuses it in one line, a task's own takes it."""
    from utils.tasks import registry

    contract = OutputContract("probs", 5)
    assert contract.columns == 5 and contract.rank == 2 and not contract.end_to_end
    contract.check(torch.zeros(2, 5))
    with pytest.raises(ContractError, match=r"needs \(batch, 5\)"):
        contract.check(torch.zeros(2, 3, 5))
    with pytest.raises(ContractError, match="need its own post-processing"):
        postprocess(torch.zeros(2, 5), contract)
    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))
    registry.register_task(registry.Task("toy", "toy", postprocess=f"{__name__}:top_class"))
    assert postprocess(torch.eye(5)[[3, 1]], OutputContract("probs", 5, 0, "toy")) == [3, 1]


def top_class(pred: torch.Tensor, contract: OutputContract, *args: object) -> list[int]:
    """A toy task's post-processing: each image's best class."""
    return pred.argmax(1).tolist()


def test_which_contracts_hold_boxes_and_which_boxes_alone() -> None:
    """detect.py, the hub model and export's verification ask the contract, not its layout or rank."""
    detector, end_to_end = OutputContract("xywh_cls", 3), OutputContract("xyxy_score_cls", 3)
    segmenter, pose = OutputContract("xywh_cls", 3, 32, "segment"), OutputContract("xywh_cls", 1, 51, "pose")
    classifier = OutputContract("probs", 3, task="classify")
    assert [c.has_boxes for c in (detector, end_to_end, segmenter, pose, classifier)] == [True] * 4 + [False]
    assert [c.boxes_alone for c in (detector, end_to_end, segmenter, pose, classifier)] == [True, True] + [False] * 3
    assert [c.rank for c in (detector, classifier)] == [3, 2]
