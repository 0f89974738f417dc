"""utils/tasks/registry.py: the task records, their lazy references, one fitness weight per column; and a task added
as its module and one registry line (tests/plugins/point_task.py) flowing through the shared data pipeline,
evaluation and fitness without a change outside its module."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import write_jpg
from utils.tasks import registry
from utils.tasks.registry import PARTS, Task, TaskError, get_task, register_task, task_names


def test_every_reference_of_every_task_resolves() -> None:
    for task in registry.all_tasks():
        for part in PARTS:
            assert (getattr(task, part) is None) == (task.load(part) is None), (task.name, part)
        for module in task.heads:
            importlib.import_module(module)
        for family, reference in task.losses.items():
            assert callable(registry.load_reference(reference, f"{task.name} loss")), family


def test_unknown_tasks_and_pieces_are_one_line_errors() -> None:
    with pytest.raises(TaskError, match=r"task 'keypoints' is not registered \(known: detect, segment"):
        get_task("keypoints")
    with pytest.raises(TaskError, match="the x task's metric .no.such.module:M. is not available") as info:
        Task("x", "x", metric="no.such.module:M").load("metric")
    assert "\n" not in str(info.value)
    assert get_task().base and get_task(None).name == "detect" and not get_task("segment").base


def test_fitness_weighs_the_columns_of_the_task_they_are(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))
    with pytest.raises(ValueError, match="not among its metrics"):
        register_task(Task("other", "other", fitness={"top1": 1.0}))
    segment = get_task("segment").metrics
    assert registry.fitness_weights(segment)["mask_mAP_0.5:0.95"] == 0.9
    assert dict(registry.fitness_weights(segment[:4])) == {"mAP_0.5": 0.1, "mAP_0.5:0.95": 0.9}
    assert dict(registry.fitness_weights(["x"])) == {"mAP_0.5": 0.1, "mAP_0.5:0.95": 0.9}  # unknown: the base's


@pytest.fixture
def point_task(monkeypatch):
    """The toy task registered for one test (the registry is restored after it)."""
    from tests.plugins import point_task

    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))
    return point_task.register()


def _point_set(folder: Path) -> Path:
    """Four 64 x 48 images, each with two boxes and their points (the boxes' top-left quarter points)."""
    (folder / "images").mkdir(parents=True)
    (folder / "labels").mkdir()
    for i in range(4):
        write_jpg(folder / "images" / f"{i}.jpg", 48, 64)
        (folder / "labels" / f"{i}.txt").write_text("0 0.3 0.4 0.2 0.2 0.25 0.35\n1 0.7 0.6 0.3 0.2 0.625 0.55\n")
    return folder / "images"


def test_a_task_added_by_its_module_and_one_line(point_task: Task, tmp_path: Path) -> None:
    """The point task's samples carry their points through the shared pipeline (flipped with the boxes), its
    batches hand them to a loss by name, its metric's view becomes results columns and weighs in the fitness."""
    from utils.data.datasets import YoloDataset
    from utils.evaluation.evaluate import EvalResult, metric_names
    from utils.tasks.contract import OutputContract
    from utils.training.fitness import fitness

    assert "point" in task_names()
    images = _point_set(tmp_path)
    hyp = {"fliplr": 1.0, "mosaic": 0.0}
    ds = YoloDataset(images, img_size=64, augment=True, hyp=hyp, task="point", nc=2)
    assert (tmp_path / "labels.points.cache").is_file()
    img, targets, _, _, points = ds[0]
    for (_, _, cx, cy, w, h), (px, py) in zip(targets.tolist(), points.tolist()):  # mirrored with their boxes
        assert px == pytest.approx(cx + w / 4, abs=0.02) and py == pytest.approx(cy - h / 4, abs=0.02)
    assert targets[:, 2].tolist() == pytest.approx([0.7, 0.3], abs=0.02)  # the first box went right
    batch = ds.collate_fn([ds[i] for i in range(4)])
    assert len(batch) == 5 and batch[4]["spots"].shape == (8, 2)
    with pytest.raises(Exception, match="--quad is for detection data; a point data set"):
        ds.collate_quad([ds[i] for i in range(4)])
    import yaml

    from utils.data.config import load_data_config

    (tmp_path / "point.yaml").write_text(yaml.safe_dump({"path": str(tmp_path), "train": "images", "val": "images",
                                                         "names": ["a", "b"], "spot_size": 3, "other": 1}))
    assert load_data_config(tmp_path / "point.yaml").task_options == {"spot_size": 3}  # its data_keys only
    contract = OutputContract("xywh_cls", 2, 0, "point")
    assert metric_names(contract)[4:] == ("spot_precision", "spot_recall", "spot_mAP_0.5", "spot_mAP_0.5:0.95")
    result = EvalResult(map50=0.5, map=0.25)
    assert fitness(result) == pytest.approx(0.1 * 0.5 + 0.9 * 0.25)
    row = {f"metrics/{name}": 0.0 for name in point_task.metrics}  # a point model's results.csv row
    row.update({"train/box_loss": 1.0, "metrics/mAP_0.5": 0.5, "metrics/mAP_0.5:0.95": 0.25,
                "metrics/spot_mAP_0.5:0.95": 0.5})
    assert fitness(row) == pytest.approx(0.1 * 0.5 + 0.9 * 0.25 + 0.5)  # the point task's weights
    assert fitness({k: v for k, v in row.items() if "spot" not in k}) == pytest.approx(0.1 * 0.5 + 0.9 * 0.25)


def test_the_added_task_is_judged_by_its_view(point_task: Task, tmp_path: Path) -> None:
    """evaluate() gives the point task's view (``result.spot``) beside the boxes, equal to them here."""
    from utils.data.datasets import YoloDataset
    from utils.evaluation.evaluate import evaluate
    from utils.tasks.contract import OutputContract

    images = _point_set(tmp_path)
    ds = YoloDataset(images, img_size=64, rect=True, batch_size=4, stride=32, pad=0.5, task="point", nc=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=ds.collate_fn)

    class Oracle(torch.nn.Module):
        """Predicts each image's labels (from the batch being evaluated)."""

        contract = OutputContract("xywh_cls", 2, 0, "point")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            _, targets, *_ = next(iter(loader))
            h, w = x.shape[2:]
            rows = torch.zeros(len(x), 2, 6)
            for i in range(len(x)):
                t = targets[targets[:, 0] == i]
                rows[i, :, :4] = t[:, 2:6] * torch.tensor([w, h, w, h])
                rows[i, torch.arange(2), 4 + t[:, 1].long()] = 0.9
            return rows

    result = evaluate(Oracle(), loader, "cpu", ["a", "b"])
    assert result.map == pytest.approx(1.0, abs=1e-6) and result.spot.mean_results()[3] == pytest.approx(1.0)
    assert list(result.named_results())[4:] == ["spot_precision", "spot_recall", "spot_mAP_0.5", "spot_mAP_0.5:0.95"]
    assert np.isclose(result.named_results()["spot_mAP_0.5:0.95"], 1.0)
