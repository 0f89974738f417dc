"""train.py on one process: flags, a complete run folder, overfitting one batch, one-line errors."""

from __future__ import annotations

import csv
import importlib.util

import pytest
import torch
import yaml

import train
from models.yolo import Model
from utils.cli import run_main
from utils.data.datasets import DatasetOptions
from utils.hyp import REQUIRED, default_hyp_file
from utils.loggers.results_csv import results_columns
from utils.training.builder import TrainData, build_trainer, prepare_run
from utils.training.config import RunConfig
from utils.weights.checkpoint import load_checkpoint

HYP = {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "warmup_epochs": 0.0,
       "box": 0.05, "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}
YOLOV5_LOSS = ("box", "obj", "cls")  # the YOLOv5 family's loss terms: results.csv's loss columns

pytestmark = pytest.mark.usefixtures("one_thread_and_clean_logger")


def tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, *extra: str) -> list[str]:
    return ["--cfg", str(tiny_cfg_file), "--data", str(tiny_dataset), "--img", "64", "--batch-size", "8",
            "--device", "cpu", "--workers", "0", "--project", str(tmp_path / "runs"), *extra]


def test_parse_opt_flags_and_aliases():
    for flag in ("--img-size", "--imgsz", "--img"):
        assert train.parse_opt([flag, "96"]).img_size == 96
    opt = train.parse_opt(["--local-rank", "1", "--cos-lr", "--multi-scale", "--freeze", "10", "--evolve"])
    assert (opt.local_rank, opt.cos_lr, opt.multi_scale, opt.freeze, opt.evolve) == (1, True, True, [10], 300)
    assert train.parse_opt(["--local_rank", "2"]).local_rank == 2
    defaults = train.parse_opt([])
    assert defaults.data.endswith("synthetic.yaml") and defaults.workers == 8 and defaults.resume is False
    assert defaults.project.endswith("runs/train") and defaults.img_size == 128
    assert train.parse_opt(["--resume"]).resume is True
    assert train.parse_opt(["--hook", "a.b:C", "--hook", "d:E(x=1)"]).hook == ["a.b:C", "d:E(x=1)"]
    with pytest.raises(SystemExit):
        train.parse_opt(["--img", "64", "96"])  # training images are square


def test_the_hyp_files_optimizer_entry_is_used(tiny_cfg_file, tiny_dataset, tmp_path):
    adam = tmp_path / "hyp.adam.yaml"
    adam.write_text(default_hyp_file("x.yaml").read_text() + "optimizer: Adam\n")
    defaults = RunConfig.from_options(train.parse_opt([]))
    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--hyp", str(adam)))
    config, hyp = prepare_run(RunConfig.from_options(opt), defaults)
    assert config.optimizer == "Adam" and hyp["optimizer"] == "Adam"
    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--hyp", "hyp.finetune.yaml"))
    assert prepare_run(RunConfig.from_options(opt), defaults)[1]["lr0"] < 0.01  # a bundled file by its name alone


def test_one_process_run_writes_a_complete_run_folder(tiny_cfg_file, tiny_dataset, tmp_path, capsys):
    from utils.hooks import HookBase

    rows = []

    class Rows(HookBase):  # after_epoch's metrics: the epoch's results.csv row by column name
        def after_epoch(self, trainer, epoch, metrics):  # noqa: ANN001
            rows.append([str(epoch), *(f"{v:.6g}" for v in metrics.values())])
            assert list(metrics) == results_columns(YOLOV5_LOSS)[1:]
            assert (trainer.save_dir / "weights" / "last.pt").is_file()

    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "2", "--noautoanchor"))
    assert run_main(lambda o: train.main(o, [Rows()]), opt, "train") == 0
    run_dir = tmp_path / "runs" / "exp"
    out = capsys.readouterr().out
    assert "2 epochs completed in" in out and f"Results saved to {run_dir}" in out
    for name in ("opt.yaml", "hyp.yaml", "results.csv", "weights/last.pt", "weights/best.pt"):
        assert (run_dir / name).is_file(), name
    assert list(run_dir.glob("events.out.tfevents.*"))
    hooked = rows
    with open(run_dir / "results.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == results_columns(YOLOV5_LOSS) and [r[0] for r in rows[1:]] == ["0", "1"]
    assert all(len(r) == len(rows[0]) and all(v != "" for v in r) for r in rows[1:])
    assert rows[1:] == hooked
    last = load_checkpoint(run_dir / "weights" / "last.pt")
    assert last["epoch"] == 1 and last["train_state"]["states"]["updater"]["iteration"] == 6  # 24 images / 8, 2 epochs
    assert "train_state" not in load_checkpoint(run_dir / "weights" / "best.pt")
    if importlib.util.find_spec("utils.plots.figures"):
        assert (run_dir / "train_batch0.jpg").is_file() and (run_dir / "labels.jpg").is_file()


def test_weights_transfer_and_second_run_folder(tiny_cfg_file, tiny_dataset, tmp_path, capsys):
    first = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "1", "--noautoanchor",
                                      "--noval"))
    assert run_main(train.main, first, "train") == 0
    weights = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    second = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "1", "--noautoanchor",
                                       "--weights", str(weights), "--noval", "--multi-scale", "--cos-lr",
                                       "--optimizer", "AdamW", "--freeze", "2", "--label-smoothing", "0.1",
                                       "--save-period", "1"))
    assert run_main(train.main, second, "train") == 0
    out = capsys.readouterr().out
    count = len(Model(str(tiny_cfg_file)).state_dict())
    assert f"Transferred {count - 1}/{count} items from {weights}" in out  # all but the anchors (--cfg given)
    assert (tmp_path / "runs" / "exp2" / "weights" / "epoch0.pt").is_file() and "AdamW(lr=0.01)" in out
    start = load_checkpoint(weights)["model"]  # --weights loads the EMA weights
    end = load_checkpoint(tmp_path / "runs" / "exp2" / "weights" / "last.pt")["train_state"]["states"]["model"]
    params = {name for name, _ in Model(str(tiny_cfg_file)).named_parameters()}
    frozen = [k for k in params if k.startswith(("model.0.", "model.1."))]
    assert frozen and all(torch.equal(start[k], end[k]) for k in frozen)  # --freeze 2: layers 0 and 1 kept
    assert not torch.equal(start["model.2.cv1.bn.bias"], end["model.2.cv1.bn.bias"])  # layer 2 trained (bias lr)


def test_evolve_writes_evolve_csv_and_the_best_hyp(tiny_cfg_file, tiny_dataset, tmp_path):
    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "1", "--noautoanchor",
                                    "--evolve", "2"))
    assert run_main(train.main, opt, "train") == 0
    evolve_dir = tmp_path / "runs" / "exp-evolve"
    rows = (evolve_dir / "evolve.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("fitness,precision,recall,mAP_0.5,mAP_0.5:0.95,lr0")
    best = yaml.safe_load((evolve_dir / "hyp_evolve.yaml").read_text())
    assert set(REQUIRED) <= set(best)
    assert (evolve_dir / "gen1" / "weights" / "last.pt").is_file()


def test_loss_falls_by_half_when_overfitting_one_batch(tiny_cfg_file, tiny_dataset, tmp_path):
    """The builder's trainer on one fixed batch, 10 steps an epoch: the loss halves within 6 epochs."""
    from utils.data.config import load_data_config
    from utils.data.loader import create_dataloader

    loader, _ = create_dataloader(load_data_config(tiny_dataset).train, DatasetOptions(img_size=64, batch_size=8),
                                  workers=0)
    batch = next(iter(loader))
    # a total batch of 64 (the nominal one) steps after every batch; the 8 images stand for it
    config = RunConfig(cfg=str(tiny_cfg_file), epochs=100, batch_size=64, img_size=64, optimizer="Adam", amp="off",
                       save_dir=str(tmp_path), noplots=True)
    trainer = build_trainer(config, {**HYP, "lrf": 1.0, "momentum": 0.9}, torch.device("cpu"),
                            data=TrainData([batch] * 10, None, None, ["a", "b", "c"]))
    losses = [trainer.train_epoch(epoch).sum().item() for epoch in range(6)]
    assert trainer.updater.steps == 60 and trainer.updater.ema.updates == 60
    assert losses[-1] < 0.5 * losses[0], losses
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyp.yaml", "opt.yaml", "weights"]  # no logger wrote


@pytest.mark.parametrize("flags, message", [
    (["--device", "0"], "--device 0 asks for CUDA but CUDA is not available"),
    (["--backend", "nccl"], "--backend nccl needs CUDA"),
    (["--weights", "missing.pt"], "missing.pt not found"),
])
def test_bad_input_gives_a_one_line_error(flags, message, tiny_cfg_file, tiny_dataset, tmp_path, capsys):
    if torch.cuda.is_available() and flags[0] in ("--device", "--backend"):
        pytest.skip("CUDA is available here")
    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "1", *flags))
    assert run_main(train.main, opt, "train") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train: error:") and message in err[0], err


def test_reference_flags_noplots_quad_image_weights_and_img_rounding(tiny_cfg_file, tiny_dataset, tmp_path, capsys):
    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "2", "--noautoanchor",
                                    "--img", "50", "--noplots", "--quad", "--image-weights"))
    assert run_main(train.main, opt, "train") == 0
    out, run_dir = capsys.readouterr().out, tmp_path / "runs" / "exp"
    assert "--img-size 50 must be a multiple of the model's largest stride 32, using 64" in out
    assert yaml.safe_load((run_dir / "opt.yaml").read_text())["img_size"] == 64
    assert not list(run_dir.glob("*.jpg")) and not list(run_dir.glob("*.png"))  # --noplots
    assert (run_dir / "weights" / "last.pt").is_file()
    state = load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]
    assert len(state["maps"]) == 3  # the per-class mAPs the next epoch's image weights come from


def test_fine_tune_from_release_weights_transfers_the_backbone_and_freezes_it(tiny_dataset, tmp_path, capsys):
    """A YOLOv5 release file (80 classes) fine-tuned on 3 classes: every tensor but the head's is transferred, and
    the model holds the file's tensors when training starts; --freeze 10 keeps the backbone at them."""
    from tests.helpers import ROOT
    from utils.hooks import HookBase
    from utils.weights.release_reader import load_release_checkpoint

    fixture = ROOT / "tests" / "fixtures" / "yolov5n-v7.0.pt"
    release = load_release_checkpoint(fixture)["model"]
    seen = {}

    class AtStart(HookBase):
        def before_train(self, trainer):  # noqa: ANN001
            seen.update({k: v.clone() for k, v in trainer.model_without_ddp.state_dict().items()})

    opt = train.parse_opt(["--weights", str(fixture), "--data", str(tiny_dataset), "--img", "64", "--batch-size", "8",
                           "--epochs", "1", "--device", "cpu", "--workers", "0", "--noautoanchor", "--noval",
                           "--freeze", "10", "--project", str(tmp_path / "runs")])
    assert run_main(lambda o: train.main(o, [AtStart()]), opt, "train") == 0
    out = capsys.readouterr().out
    total = len(seen)
    assert f"Transferred {total - 6}/{total} items from {fixture}" in out  # all but the head's 3 convs (w, b)
    backbone = [k for k in release if k.startswith(tuple(f"model.{i}." for i in range(10)))]
    assert backbone and all(torch.equal(seen[k], release[k]) for k in backbone)
    assert seen["model.24.m.0.weight"].shape[0] == 3 * 8 and not torch.equal(seen["model.24.anchors"], torch.zeros(1))
    end = load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt")["train_state"]["states"]["model"]
    frozen = [k for k in backbone if k.endswith((".weight", ".bias")) and "bn" in k or "conv.weight" in k]
    assert frozen and all(torch.equal(end[k], release[k]) for k in frozen)
