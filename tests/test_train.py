"""train.py on one process: flags, a complete run folder, overfitting one batch, one-line errors."""

from __future__ import annotations

import csv
import importlib.util

import pytest
import torch
import yaml

import train
from models.yolo import Model
from utils.callbacks import results_columns
from utils.checkpoint import load_checkpoint
from utils.cli import run_main
from utils.engine import train_one_epoch
from utils.loss import ComputeLoss
from utils.optim import LRSchedule, ModelEMA, Stepper, build_optimizer

HYP = {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "warmup_epochs": 0.0,
       "box": 0.05, "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}


@pytest.fixture(autouse=True)
def one_thread_and_clean_logger():
    """One torch thread (the 2-core CI machine is shared by parallel jobs; 2 threads then thrash), and the
    logger's handlers restored after train.main() replaced them."""
    from utils.logging import LOGGER

    threads, handlers, level = torch.get_num_threads(), list(LOGGER.handlers), LOGGER.level
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    LOGGER.handlers[:], LOGGER.level = handlers, level


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
    assert train.parse_opt(["--resume"]).resume is True


def test_default_hyp_file_and_optimizer(tmp_path, monkeypatch):
    assert train.default_hyp_file(str(tmp_path / "coco128.yaml")) == train.DEFAULT_HYP
    synthetic = tmp_path / "hyp.synthetic.yaml"
    synthetic.write_text(train.DEFAULT_HYP.read_text() + "optimizer: Adam\n")
    monkeypatch.setattr(train, "SYNTHETIC_HYP", synthetic)
    assert train.default_hyp_file("data/synthetic.yaml") == synthetic
    assert train.load_hyp(synthetic)["optimizer"] == "Adam"
    with pytest.raises(train.TrainError, match="lacks lr0"):
        train.load_hyp({"lrf": 0.1})


def test_one_process_run_writes_a_complete_run_folder(tiny_cfg_file, tiny_dataset, tmp_path, capsys):
    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "2", "--noautoanchor"))
    assert run_main(train.main, opt, "train") == 0
    run_dir = tmp_path / "runs" / "exp"
    out = capsys.readouterr().out
    assert "2 epochs completed in" in out and f"Results saved to {run_dir}" in out
    for name in ("opt.yaml", "hyp.yaml", "results.csv", "weights/last.pt", "weights/best.pt"):
        assert (run_dir / name).is_file(), name
    assert list(run_dir.glob("events.out.tfevents.*"))
    with open(run_dir / "results.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == results_columns() and [r[0] for r in rows[1:]] == ["0", "1"]
    assert all(len(r) == len(rows[0]) and all(v != "" for v in r) for r in rows[1:])
    last = load_checkpoint(run_dir / "weights" / "last.pt")
    assert last["epoch"] == 1 and last["train_state"]["states"]["stepper"]["iteration"] == 6  # 24 images / 8 x 2 epochs
    assert "train_state" not in load_checkpoint(run_dir / "weights" / "best.pt")
    if importlib.util.find_spec("utils.plots"):
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
    assert (tmp_path / "runs" / "exp2" / "weights" / "epoch0.pt").is_file() and "Froze " in out
    assert "AdamW(lr=0.01)" in out


def test_evolve_writes_evolve_csv_and_the_best_hyp(tiny_cfg_file, tiny_dataset, tmp_path):
    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "1", "--noautoanchor",
                                    "--evolve", "2"))
    assert run_main(train.main, opt, "train") == 0
    evolve_dir = tmp_path / "runs" / "exp-evolve"
    rows = (evolve_dir / "evolve.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("fitness,precision,recall,mAP_0.5,mAP_0.5:0.95,lr0")
    best = yaml.safe_load((evolve_dir / "hyp_evolve.yaml").read_text())
    assert set(train.REQUIRED_HYP) <= set(best)
    assert (evolve_dir / "gen1" / "weights" / "last.pt").is_file()


def test_mutate_stays_within_bounds_and_changes_something():
    import numpy as np

    base = train.load_hyp(train.DEFAULT_HYP)
    rng = np.random.default_rng(0)
    history = [(0.1, base)]
    for _ in range(20):
        child = train.mutate(base, history, rng)
        assert child != base
        for key, (_, low, high) in train.EVOLVE_BOUNDS.items():
            assert low <= child[key] <= high
        history.append((float(rng.random()), child))


def test_loss_falls_by_half_when_overfitting_one_batch(tiny_cfg, tiny_dataset):
    from utils.datasets import load_data_config
    from utils.loader import create_dataloader

    torch.manual_seed(0)
    model = Model(tiny_cfg)
    loader, _ = create_dataloader(load_data_config(tiny_dataset).train, 64, 8, 32, workers=0)
    batch = next(iter(loader))
    optimizer = build_optimizer(model, "Adam", lr=0.01, momentum=0.9)
    stepper = Stepper(model, optimizer, LRSchedule({**HYP, "lrf": 1.0}, 100, 10), ema=ModelEMA(model))
    compute_loss = ComputeLoss(model, HYP, img_size=64)
    losses = [train_one_epoch(model, [batch] * 10, stepper, compute_loss, device=torch.device("cpu"), epoch=e,
                              epochs=100, img_size=64, show_progress=False).sum().item() for e in range(6)]
    assert stepper.steps == 60 and stepper.ema.updates == 60
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("flags, message", [
    (["--device", "0"], "--device 0 asks for CUDA but CUDA is not available"),
    (["--backend", "nccl"], "--backend nccl needs CUDA"),
    (["--weights", "missing.pt"], "missing.pt not found"),
    (["--img", "70"], "--img-size 70 must be a multiple"),
])
def test_bad_input_gives_a_one_line_error(flags, message, tiny_cfg_file, tiny_dataset, tmp_path, capsys):
    if torch.cuda.is_available() and flags[0] in ("--device", "--backend"):
        pytest.skip("CUDA is available here")
    opt = train.parse_opt(tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "1", *flags))
    assert run_main(train.main, opt, "train") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train: error:") and message in err[0], err


@pytest.mark.parametrize("omp, local_world, expected", [
    ("3", 1, 3),  # the user's value
    ("3", 2, 3),  # the user's value under torchrun too
    ("1", 2, "share"),  # torchrun's default for several local ranks -> this rank's share of the cores
    (None, 2, "share"),
    (None, 1, "default"),  # one process, nothing set: torch's default stands
])
def test_configure_threads_rule(omp, local_world, expected, monkeypatch):
    import utils.dist as dist

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(dist, "get_local_world_size", lambda: local_world)
    before = torch.get_num_threads()
    want = {"share": max(dist.cpu_share_of(local_world), 1), "default": before}.get(expected, expected)
    assert dist.configure_threads() == want and torch.get_num_threads() == want
