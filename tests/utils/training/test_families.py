"""The family registry: each family's loss (named terms), hyp file and required keys; the anchor-free families'
loss imported by name only when a run needs it; --optimizer auto's rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.yolo import Model
from utils.hyp import HypError, load_hyp
from utils.training.families import (
    ANCHOR_FREE_HYP,
    Family,
    FamilyError,
    family_names,
    get_family,
    lazy_loss,
    register_family,
)
from utils.training.loss import ComputeLoss
from utils.training.optim import AUTO_LONG_RUN, choose_optimizer


def test_the_families_of_issue_32_are_registered_with_their_hyp_files_and_keys() -> None:
    assert {"yolov5", "yolov8", "yolo11", "yolo26"} <= set(family_names())
    v5 = get_family("yolov5")
    assert v5.hyp_file.name == "hyp.scratch.yaml" and {"obj", "anchor_t"} <= set(v5.required_hyp)
    assert v5.default_hyp_file("data/synthetic.yaml").name == "hyp.synthetic.yaml"
    assert v5.default_hyp_file("coco128.yaml").name == "hyp.scratch.yaml"
    for name in ("yolov8", "yolo11", "yolo26"):
        family = get_family(name)
        assert family.hyp_file == ANCHOR_FREE_HYP and family.default_hyp_file("data/synthetic.yaml") == ANCHOR_FREE_HYP
        assert {"box", "cls", "dfl"} <= set(family.required_hyp) and not {"obj", "anchor_t"} & set(family.required_hyp)
        assert family.evolve_bounds["box"][1:] == (1.0, 20.0)  # the anchor-free gain 7.5 is within its range
    with pytest.raises(FamilyError, match="'yolov99' is not registered"):
        get_family("yolov99")


def test_the_anchor_free_hyp_file_holds_ultralytics_values_and_no_anchor_keys() -> None:
    hyp = load_hyp(ANCHOR_FREE_HYP, get_family("yolo11").required_hyp, "yolo11")
    assert (hyp["box"], hyp["cls"], hyp["dfl"], hyp["close_mosaic"]) == (7.5, 0.5, 1.5, 10.0)
    assert (hyp["lr0"], hyp["lrf"], hyp["momentum"], hyp["weight_decay"]) == (0.01, 0.01, 0.937, 0.0005)
    assert (hyp["mosaic"], hyp["mixup"], hyp["translate"], hyp["scale"], hyp["fliplr"]) == (1.0, 0.0, 0.1, 0.5, 0.5)
    assert "obj" not in hyp and "anchor_t" not in hyp
    with pytest.raises(HypError, match=r"lacks obj, anchor_t \(the yolov5 family needs"):
        load_hyp(ANCHOR_FREE_HYP, get_family("yolov5").required_hyp, "yolov5")


def test_yolov5s_loss_is_todays_loss_with_named_terms(tiny_cfg: dict) -> None:
    model = Model(tiny_cfg).train()
    hyp = {**load_hyp("hyp.scratch.yaml"), "img_size": 64, "label_smoothing": 0.1}
    loss = get_family("yolov5").loss(model, hyp)
    reference = ComputeLoss(model, hyp, img_size=64, label_smoothing=0.1)
    assert isinstance(loss, ComputeLoss) and loss.names == ("box", "obj", "cls")
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4]])
    preds = model(torch.rand(1, 3, 64, 64))
    total, items = loss(preds, targets)
    expected_total, expected_items = reference(preds, targets)
    assert torch.equal(total, expected_total) and torch.equal(items, expected_items) and items.shape == (3,)


def test_a_loss_imported_by_name_fails_in_one_line_until_its_file_exists() -> None:
    factory = lazy_loss("utils.training.no_such_loss", "Loss", "yolov9")
    with pytest.raises(FamilyError, match=r"^the yolov9 family's loss \(utils.training.no_such_loss.Loss\) is not "
                                          r"available in this installation \(No module named"):
        factory(torch.nn.Identity(), {})
    missing_name = lazy_loss("utils.training.loss", "NoSuchLoss", "yolov9")
    with pytest.raises(FamilyError, match="has no attribute 'NoSuchLoss'"):
        missing_name(torch.nn.Identity(), {})
    built = lazy_loss("utils.training.loss", "LossGains", "x")  # found by name, called with (model, hyp)
    with pytest.raises(TypeError):  # LossGains takes other arguments: the factory really called it
        built(torch.nn.Identity(), {})


def test_the_anchor_free_families_name_their_loss_file() -> None:
    for name, attribute in (("yolov8", "AnchorFreeLoss"), ("yolo11", "AnchorFreeLoss"), ("yolo26", "EndToEndLoss")):
        factory = get_family(name).loss
        cells = {c.cell_contents for c in factory.__closure__ or () if isinstance(c.cell_contents, str)}
        assert {"utils.training.loss_anchor_free", attribute, name} <= cells


def test_a_family_is_one_registration_line(tmp_path) -> None:
    hyp = tmp_path / "hyp.toy.yaml"
    hyp.write_text("lr0: 0.01\nlrf: 0.01\nmomentum: 0.9\nweight_decay: 0.0\n")
    try:
        family = register_family(Family("toy", lambda model, hyp: None, hyp, ("lr0",)))
        assert get_family("toy") is family and "toy" in family_names()
        assert family.default_hyp_file("data/synthetic.yaml") == hyp  # no tuned file: its own
    finally:
        from utils.training import families

        families._FAMILIES.pop("toy", None)


@pytest.mark.parametrize("classes, lr", [(3, 0.001429), (80, 0.000119), (1, 0.002)])
def test_optimizer_auto_picks_adamw_with_the_class_count_rule_for_short_runs(classes: int, lr: float) -> None:
    hyp = {"lr0": 0.01, "momentum": 0.937, "warmup_bias_lr": 0.1, "box": 7.5}
    choice = choose_optimizer("auto", hyp, classes, images=1000, batch_size=32, epochs=15)
    assert choice.name == "AdamW" and choice.hyp["lr0"] == lr == round(0.002 * 5 / (4 + classes), 6)
    assert (choice.hyp["momentum"], choice.hyp["warmup_bias_lr"], choice.hyp["box"]) == (0.9, 0.0, 7.5)
    assert hyp["lr0"] == 0.01  # the file's values are not changed
    assert "240 steps of 64 images (<= 10000) and" in choice.reason  # ceil(1000 / 64) * 15


def test_optimizer_auto_picks_sgd_for_long_runs_and_defers_to_a_named_one() -> None:
    hyp = {"lr0": 0.02, "momentum": 0.937, "warmup_bias_lr": 0.1}
    at_limit = choose_optimizer("auto", hyp, 80, images=64 * AUTO_LONG_RUN, batch_size=16, epochs=1)
    assert at_limit.name == "AdamW"  # exactly 10000 steps: still short
    long = choose_optimizer("auto", hyp, 80, images=64 * AUTO_LONG_RUN + 1, batch_size=16, epochs=1)
    assert long.name == "SGD"
    assert (long.hyp["lr0"], long.hyp["momentum"], long.hyp["warmup_bias_lr"]) == (0.01, 0.9, 0.1)
    big_batches = choose_optimizer("auto", hyp, 80, images=128 * 5001, batch_size=128, epochs=2)
    assert big_batches.name == "SGD"  # ceil(images / max(batch, 64)) * epochs = 10002
    assert choose_optimizer("SGD", hyp, 80, 100, 16, 1).hyp is hyp  # a named optimizer keeps the file as it is
    named = choose_optimizer("auto", {**hyp, "optimizer": "Adam"}, 80, 100, 16, 1)
    assert named.name == "Adam" and named.hyp["lr0"] == 0.02  # the hyp file's own entry wins over the rule


def test_a_new_familys_named_losses_reach_the_step_the_csv_the_bar_and_the_checkpoint(
        tiny_cfg_file, tiny_dataset, tmp_path, monkeypatch, yolo_log) -> None:
    """A family whose loss has two terms ("box", "rest"): the step averages two values, results.csv and the
    progress bar get their columns, the hooks their names, last.pt records the family; nothing else changes."""
    import csv

    from models.head import Detect
    from utils.hooks import HookBase
    from utils.training import families
    from utils.training.builder import build_trainer
    from utils.training.config import RunConfig
    from utils.weights.checkpoint import load_checkpoint

    class TwoTerms:
        names = ("box", "rest")

        def __init__(self, model, hyp) -> None:  # noqa: ANN001
            self.inner = ComputeLoss(model, hyp, int(hyp["img_size"]))

        def __call__(self, preds, targets):  # noqa: ANN001, ANN204
            total, items = self.inner(preds, targets)
            return total, torch.stack((items[0], items[1] + items[2]))

    seen = []

    class Names(HookBase):
        def after_epoch(self, trainer, epoch, metrics):  # noqa: ANN001
            seen.append((trainer.family, trainer.loss_names, list(metrics)[:2]))

    monkeypatch.setattr(Detect, "family", "toy")  # the head names its family; the trainer asks it
    monkeypatch.setitem(families._FAMILIES, "toy", Family("toy", TwoTerms, get_family("yolov5").hyp_file,
                                                          get_family("yolov5").required_hyp))
    config = RunConfig(cfg=str(tiny_cfg_file), data=str(tiny_dataset), epochs=1, batch_size=8, img_size=64,
                       workers=0, noautoanchor=True, noplots=True, save_dir=str(tmp_path), loggers=("csv",))
    trainer = build_trainer(config, load_hyp("hyp.scratch.yaml"), torch.device("cpu"), [Names()])
    try:
        trainer.fit()
    finally:
        trainer.hooks.close(trainer.view, cancelled=False)
    with open(tmp_path / "results.csv") as f:
        header, row = list(csv.reader(f))
    assert header[:4] == ["epoch", "train/box_loss", "train/rest_loss", "metrics/precision"]
    assert len(row) == len(header) and float(row[1]) > 0 and float(row[2]) > 0
    assert seen == [("toy", ("box", "rest"), ["train/box_loss", "train/rest_loss"])]
    assert any(message.split()[:5] == ["Epoch", "gpu_mem", "box", "rest", "total"] for message in yolo_log)
    assert load_checkpoint(tmp_path / "weights" / "last.pt")["family"] == "toy"


@pytest.mark.parametrize("family, terms", [("yolov8", ("box", "cls", "dfl")), ("yolo26", ("box", "cls", "l1"))])
def test_the_new_families_train_through_the_seam(family: str, terms: tuple[str, ...], tiny_dataset, tmp_path,
                                                 monkeypatch) -> None:
    """A tiny YOLOv8 / YOLO26 (the families' YAMLs at 1/16 width): the head names the family, which brings its
    hyp file and loss; the loss's terms are results.csv's columns; YOLO26's loss is told every epoch; last.pt
    records the family and loads back through the builder."""
    import csv

    import yaml

    from utils.training.builder import build_trainer, prepare_run
    from utils.training.config import RunConfig
    from utils.weights.checkpoint import load_checkpoint, model_from_checkpoint

    cfg = yaml.safe_load((Path(__file__).resolve().parents[3] / "models" / f"{family}.yaml").read_text())
    cfg.update(nc=3, scale="n", scales={"n": [0.33, 0.0625, 1024]})
    cfg_file = tmp_path / f"{family}-tiny.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    config = RunConfig(cfg=str(cfg_file), data=str(tiny_dataset), epochs=2, batch_size=8, img_size=64, workers=0,
                       noplots=True, loggers=("csv",), project=str(tmp_path / "runs"))
    config, hyp = prepare_run(config, RunConfig())
    assert Path(config.hyp).name == "hyp.anchor-free.yaml" and hyp["dfl"] == 1.5 and "anchor_t" not in hyp
    epochs_told = []
    trainer = build_trainer(config, hyp, torch.device("cpu"))
    told = getattr(trainer.loss, "set_epoch", None)
    if told is not None:
        monkeypatch.setattr(trainer.loss, "set_epoch", lambda epoch, epochs: epochs_told.append((epoch, epochs)) or
                            told(epoch, epochs))
    try:
        trainer.fit()
    finally:
        trainer.hooks.close(trainer.view, cancelled=False)
    with open(Path(config.save_dir) / "results.csv") as f:
        header = next(csv.reader(f))
    assert header[1:4] == [f"train/{t}_loss" for t in terms] and trainer.loss_names == terms
    assert epochs_told == ([(0, 2), (1, 2)] if family == "yolo26" else [])
    ckpt = load_checkpoint(Path(config.save_dir) / "weights" / "last.pt")
    assert (ckpt["family"], ckpt["task"]) == (family, "detect")
    assert model_from_checkpoint(ckpt).head.family == family
