"""train.py's speed flags --amp, --channels-last and --compile: their parsing, what the builder makes of them and
how a resumed run treats them (the --amp decision itself: tests/utils/training/test_amp.py); --single-cls on a
set of several classes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import train
from utils.training.builder import build_model, compile_model
from utils.training.config import RunConfig
from utils.training.resume import resume_options

CPU = torch.device("cpu")


def test_amp_flag_values_and_resume(tmp_path: Path) -> None:
    assert train.parse_opt([]).amp == "auto"
    assert train.parse_opt(["--amp", "off"]).amp == "off"
    with pytest.raises(SystemExit):
        train.parse_opt(["--amp", "fp16"])
    defaults = RunConfig.from_options(train.parse_opt([]))
    saved = {**defaults.options(), "amp": "on", "epochs": 7}
    given = RunConfig.from_options(train.parse_opt(["--amp", "off"]))
    resumed = resume_options(given, saved, defaults)  # given now: kept
    assert (resumed.amp, resumed.epochs) == ("off", 7)
    assert resume_options(defaults, saved, defaults).amp == "on"  # not given: the checkpoint's


class Compiled(torch.nn.Module):
    """What torch.compile returns, an OptimizedModule holding the model as ``_orig_mod`` (the real one takes
    seconds to import, and compiling takes minutes)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self._orig_mod = model


def test_channels_last_and_compile_flags(tiny_cfg_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from utils.training.optim import unwrap

    monkeypatch.setattr(torch, "compile", Compiled)

    plain = RunConfig.from_options(train.parse_opt(["--cfg", str(tiny_cfg_file)]))
    assert plain.channels_last is False and plain.compile is False
    model, _ = build_model(plain, 3, ["a", "b", "c"], CPU)
    assert compile_model(model, plain) is model
    weight = model.model[0].conv.weight  # the CPU trains channels_last with or without the flag
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    other = torch.device("meta")  # any device but the CPU: NCHW unless --channels-last (no CUDA needed)
    assert build_model(plain, 3, ["a", "b", "c"], other)[0].model[0].conv.weight.is_contiguous()
    fast = RunConfig.from_options(train.parse_opt(["--cfg", str(tiny_cfg_file), "--channels-last", "--compile"]))
    model, _ = build_model(fast, 3, ["a", "b", "c"], other)
    weight = model.model[0].conv.weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    compiled = compile_model(model, fast)
    assert isinstance(compiled, Compiled) and unwrap(compiled) is model
    assert unwrap(torch.nn.DataParallel(compiled)) is model  # any order of wrappers



def test_single_cls_trains_on_every_image_of_a_multi_class_set(tmp_path: Path, tiny_dataset: Path,
                                                               tiny_cfg_file: Path) -> None:
    """--single-cls on a 3-class set: the labels are checked against the data's 3 classes, then become class 0 (no
    image refused as 'class label 2 >= nc 1': every validation image was, and the run stopped), and the model has
    one class, named 'item'."""
    from tests.helpers import one_thread_and_logger_kept, train_args
    from utils.weights.checkpoint import load_checkpoint

    with one_thread_and_logger_kept():
        result = train.main(train.parse_opt(train_args(tiny_dataset, tiny_cfg_file, tmp_path, "--single-cls",
                                                       epochs=1)[1:]))
    assert set(result.metrics) >= {"mAP_0.5", "mAP_0.5:0.95"}
    ckpt = load_checkpoint(result.save_dir / "weights" / "last.pt")
    assert (ckpt["nc"], ckpt["names"]) == (1, ["item"])


def test_the_thread_count_is_measured_again_between_epochs(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Without OMP_NUM_THREADS the thread count is measured at start-up and again after every epoch but the last,
    changed after two agreeing probes: a core busy at start-up does not hold the run to one thread."""
    from tests.helpers import one_thread_and_logger_kept, train_args
    from utils.distributed import comm

    verdicts, asked = iter([1, 1, 2, 2]), []

    def probe(most: int, apply: bool = True) -> int:  # busy at start-up (two probes), free after each epoch
        asked.append((most, apply))
        chosen = min(next(verdicts), most)
        if apply:
            torch.set_num_threads(chosen)
        return chosen

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(comm, "measured_threads", probe)
    monkeypatch.setattr(comm, "available_cores", lambda: 2)
    with one_thread_and_logger_kept():
        train.main(train.parse_opt(train_args(tiny_dataset, tiny_cfg_file, tmp_path, epochs=3)[1:]))
    assert asked == [(2, True), (2, True), (2, False), (2, False)]  # start-up, after epochs 0 and 1; not the last
    changes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU threads")]
    assert changes == ["CPU threads 1 -> 2: two probes in a row between epochs found 2 faster "
                       "(utils.device.measured_threads)"]


def test_colour_on_flag_values_and_where_it_sends_the_change() -> None:
    from utils.training.builder import TrainError, colour_in_step

    assert train.parse_opt([]).colour_on == "auto"
    with pytest.raises(SystemExit):
        train.parse_opt(["--colour-on", "gpu"])
    cuda = torch.device("cuda")  # only compared: no CUDA needed

    def decide(*flags: str, device: torch.device = CPU) -> bool:
        return colour_in_step(RunConfig.from_options(train.parse_opt(list(flags))), device)

    assert not decide() and decide(device=cuda)  # auto: in the step on CUDA only
    assert not decide("--quad", device=cuda)  # --quad tiles 4 images (each its own change) into one
    assert not decide("--colour-on", "loader", device=cuda) and decide("--colour-on", "device")
    with pytest.raises(TrainError, match="--colour-on device cannot be used with --quad"):
        decide("--colour-on", "device", "--quad")
    defaults = RunConfig.from_options(train.parse_opt([]))
    saved = {**defaults.options(), "colour_on": "device"}
    assert resume_options(defaults, saved, defaults).colour_on == "device"  # not given: the checkpoint's
    given = RunConfig.from_options(train.parse_opt(["--colour-on", "loader"]))
    assert resume_options(given, saved, defaults).colour_on == "loader"  # another machine may choose again


def test_training_with_the_colour_change_in_the_step(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--colour-on device on the CPU: every training batch reaches the step with its images' gains, which the step
    applies before the float cast; validation batches carry none."""
    from tests.helpers import one_thread_and_logger_kept, train_args
    from utils.data import colour
    from utils.training import engine

    applied = []

    def recolour(images: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        applied.append((images.shape, gains.shape, images.device))
        return colour.recolour(images, gains)

    monkeypatch.setattr(engine, "recolour", recolour)
    with one_thread_and_logger_kept():
        result = train.main(train.parse_opt(train_args(tiny_dataset, tiny_cfg_file, tmp_path, "--colour-on", "device",
                                                       epochs=1)[1:]))
    assert set(result.metrics) >= {"mAP_0.5", "mAP_0.5:0.95"}
    assert len(applied) == 3  # the tiny set's 24 training images in batches of 8 (train_args): every batch
    assert all(gains == (shape[0], 3) and device == CPU for shape, gains, device in applied)
    assert "colour changes (HSV) run in the training step, not in the loader" in capsys.readouterr().out
