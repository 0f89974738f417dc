"""Fault tolerance through train.py: elastic restart after SIGKILL, exact resume, world-size changes, a signal on
one process or one rank, non-finite loss skipped collectively, unsafe weights refused, flat resident memory.

Faults are injected with the hooks in tests/plugins/faults.py (``--hook`` under torchrun, ``hooks=`` in this
process), active on a torchrun job's first attempt only, so each lands at a known batch. Single-process runs call
train.main in this process (no interpreter start-up); DDP runs use torchrun. The restart of the process group
itself is proven in tests/test_elastic_restart.py; pre-emption by signals from outside in test_preemption.py.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, csv_epochs, finish, our_tracebacks, start, torchrun_cmd, train_args
from tests.plugins.faults import FailAt, ResidentMemory
from utils.weights.checkpoint import FORMAT, load_checkpoint

pytestmark = pytest.mark.slow


def fault(kind: str, **kwargs: object) -> list[str]:
    """``--hook`` flags for a tests.plugins.faults hook, e.g. fault('FailAt', rank=1, action='kill')."""
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return ["--hook", f"tests.plugins.faults:{kind}({args})"]


def launch(nproc: int, args: list[str], *extra: str, restarts: int = 0):
    """train.py (``args`` from train_args) with ``nproc`` processes under torchrun."""
    return start(torchrun_cmd(nproc, *args, *extra, restarts=restarts))


@pytest.mark.ddp
def test_train_restart_after_sigkill_finishes_all_epochs(tmp_path: Path, tiny_dataset: Path,
                                                          tiny_cfg_file: Path) -> None:
    project = tmp_path / "runs"
    args = train_args(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval")
    code, out = finish(launch(2, args, *fault("FailAt", rank=1, epoch=1, batch=1, action="kill"), restarts=1))
    assert code == 0, out[-3000:]
    assert csv_epochs(project / "exp") == ["0", "1", "2"]
    assert re.search(r"Resum\w* .*elastic restart 1.*last\.pt", out), out[-3000:]
    assert "Resuming from epoch 1 of 3, batch 0" in out
    assert sorted(p.name for p in project.iterdir()) == ["exp"]


def test_interrupted_and_resumed_equals_uninterrupted(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                                      in_process: Callable[..., int]) -> None:
    project = tmp_path / "runs"
    args = lambda name: train_args(tiny_dataset, tiny_cfg_file, project, "--name", name,  # noqa: E731
                                   "--save-interval-steps", "1", epochs=2)
    assert in_process(args("whole")) == 0
    with pytest.raises(RuntimeError, match="test fault injected at epoch 1 batch 1"):
        in_process(args("cut"), FailAt(rank=0, epoch=1, batch=1))  # crashes mid-epoch 2; last.pt: the batch before
    cut_last = project / "cut" / "weights" / "last.pt"
    assert load_checkpoint(cut_last)["train_state"]["position"]["samples_seen"] == 8
    assert in_process([str(ROOT / "train.py"), "--resume", str(cut_last)]) == 0
    whole, resumed = load_checkpoint(project / "whole" / "weights" / "last.pt"), load_checkpoint(cut_last)
    assert csv_epochs(project / "cut") == ["0", "1"]
    raw_whole, raw_resumed = whole["train_state"]["states"]["model"], resumed["train_state"]["states"]["model"]
    pairs = [(whole["model"], resumed["model"]), (raw_whole, raw_resumed)]
    diff = max((a[k].float() - b[k].float()).abs().max().item() for a, b in pairs for k in a)
    assert diff == 0.0, diff
    assert resumed["train_state"]["states"]["updater"]["iteration"] == 6


@pytest.mark.ddp
def test_resume_across_world_sizes_1_to_2_to_1(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                                in_process: Callable[..., int], capsys: pytest.CaptureFixture) \
        -> None:
    project, run_dir = tmp_path / "runs", tmp_path / "runs" / "exp"
    args = train_args(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval")
    assert in_process(args, FailAt(rank=0, epoch=0, batch=1, action="term")) == 143  # 1 process, stopped in epoch 1
    resume = [str(ROOT / "train.py"), "--resume", str(run_dir)]
    # 1 -> 2 processes, stopped again in epoch 2: under DDP a checkpoint waits for the optimizer step (each rank's
    # accumulating gradients are its own until then); here that is the end of the epoch
    code, out = finish(launch(2, resume, *fault("FailAt", rank=0, epoch=1, batch=1, action="term")))
    assert code != 0 and "processes 1 -> 2, batch per process 8 -> 4" in out, out[-3000:]
    assert "kept total batch 8" in out and "Resuming from epoch 0 of 3, batch 2" in out
    assert "train: stopped by SIGTERM at epoch 2, batch 0; last.pt saved" in out
    position = load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]["position"]
    assert (position["epoch"], position["samples_seen"]) == (2, 0)
    capsys.readouterr()
    assert in_process(resume) == 0  # 2 -> 1 process, to the end
    out = capsys.readouterr().out
    assert "processes 2 -> 1, batch per process 4 -> 8" in out and "Resuming from epoch 2 of 3, batch 0" in out, out
    assert csv_epochs(run_dir) == ["0", "1", "2"]
    assert load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]["states"]["updater"]["iteration"] == 9


@pytest.mark.parametrize("action, signum, code", [("term", signal.SIGTERM, 143), ("int", signal.SIGINT, 130)])
def test_signal_single_process_saves_the_step_and_exits_with_one_line(
        action: str, signum: int, code: int, tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
        in_process: Callable[..., int], capsys: pytest.CaptureFixture) -> None:
    project = tmp_path / "runs"
    before = signal.getsignal(signum)
    args = train_args(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval")
    assert in_process(args, FailAt(rank=0, epoch=0, batch=1, action=action)) == code
    err = capsys.readouterr().err
    name = signal.Signals(signum).name
    stops = [line for line in err.splitlines() if "stopped" in line]  # (the label scan's bar is on stderr too)
    assert stops == [f"train: stopped by {name} at epoch 0, batch 1; last.pt saved; continue with --resume"], err
    assert "Traceback" not in err
    state = load_checkpoint(project / "exp" / "weights" / "last.pt")["train_state"]
    assert state["position"] == {**state["position"], "epoch": 0, "samples_seen": 16}
    assert signal.getsignal(signum) is before


@pytest.mark.ddp
def test_one_signalled_rank_stops_both_at_the_same_step(tmp_path: Path, tiny_dataset: Path,
                                                        tiny_cfg_file: Path) -> None:
    project = tmp_path / "runs"
    args = train_args(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval")
    # batch 0 ends with an optimizer step, so the ranks can stop right after it (between steps, under DDP)
    code, out = finish(launch(2, args, *fault("FailAt", rank=1, epoch=0, batch=0, action="term")))
    assert code != 0 and not our_tracebacks(out), out[-3000:]  # torchrun reports the exit code 143 of rank 1
    assert out.count("train: stopped by SIGTERM at epoch 0, batch 0; last.pt saved") == 1, out[-3000:]
    state = load_checkpoint(project / "exp" / "weights" / "last.pt")["train_state"]
    assert (state["position"]["epoch"], state["position"]["samples_seen"]) == (0, 8)  # rank 0 saved that step


def test_train_refuses_pickled_weights(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                       in_process: Callable[..., int], capsys: pytest.CaptureFixture) -> None:
    import os

    class CodeRunner:
        def __reduce__(self) -> tuple:
            return os.mkdir, (str(tmp_path / "ran"),)

    evil = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "model": {}, "model_yaml": {}, "hook": CodeRunner()}, evil)
    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", epochs=1)
    args[args.index("--weights") + 1] = str(evil)
    assert in_process(args) == 2
    err = capsys.readouterr().err
    assert "train: error:" in err and "refused" in err and not (tmp_path / "ran").exists()


@pytest.mark.ddp
def test_nonfinite_loss_skipped_on_both_ranks_then_reloaded(tmp_path: Path, tiny_dataset: Path,
                                                             tiny_cfg_file: Path) -> None:
    project = tmp_path / "runs"
    args = train_args(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval")
    # rank 1 only: a NaN loss in all 3 batches of epoch 1
    code, out = finish(launch(2, args, *fault("NanLoss", rank=1, epoch=1, batch=0, count=3)))
    assert code == 0, out[-3000:]
    assert "Epoch 1: skipped 3 steps with a non-finite loss (3 in all)" in out, out
    assert re.search(r"non-finite loss in 3 steps in a row: reloaded \S+last\.pt; learning rate halved", out), out
    last = load_checkpoint(project / "exp" / "weights" / "last.pt")
    updater = last["train_state"]["states"]["updater"]
    assert updater["iteration"] == 6  # epochs 0 and 2 stepped; epoch 1 skipped on both ranks
    assert updater["optimizer"]["param_groups"][0]["initial_lr"] == pytest.approx(0.5 * last["hyp"]["lr0"])
    assert all(torch.isfinite(v).all() for v in last["model"].values() if v.is_floating_point())
    assert csv_epochs(project / "exp") == ["0", "1", "2"]


def test_resident_memory_flat_over_epochs(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                          in_process: Callable[..., int]) -> None:
    log = tmp_path / "rss.txt"
    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--noval", epochs=6)
    assert in_process(args, ResidentMemory(str(log))) == 0
    rss = [float(line.split()[1]) for line in log.read_text().splitlines()]
    assert len(rss) == 6 and rss[5] <= 1.10 * rss[2], rss


def test_signal_during_the_final_validation_stops_at_once_and_keeps_last_pt(
        tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path, in_process: Callable[..., int],
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from utils.training import loop

    real_validate = loop.Trainer.validate

    def signalled_in_final_validation(trainer, final):  # noqa: ANN001, ANN202
        if final:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while validating (and plotting) the last epoch
        return real_validate(trainer, final)

    monkeypatch.setattr(loop.Trainer, "validate", signalled_in_final_validation)
    run_dir = tmp_path / "runs" / "exp"
    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--name", "exp", epochs=2, plots=True)
    assert in_process(args) == 143
    err = capsys.readouterr().err
    stops = [line for line in err.splitlines() if "stopped" in line]
    assert stops == ["train: stopped by SIGTERM while validating epoch 1; last.pt holds the start of epoch 1; "
                     "continue with --resume"], err
    assert "Traceback" not in err
    position = load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]["position"]  # whole, loads
    assert (position["epoch"], position["samples_seen"]) == (1, 0)
    assert not list((run_dir / "weights").glob(".*tmp*")) and not (run_dir / "PR_curve.png").exists()
    monkeypatch.setattr(loop.Trainer, "validate", real_validate)
    assert in_process([str(ROOT / "train.py"), "--resume", str(run_dir)]) == 0  # redoes epoch 1, to the end
    assert csv_epochs(run_dir) == ["0", "1"] and (run_dir / "PR_curve.png").is_file()


def test_a_damaged_last_pt_resumes_from_the_previous_generation_and_a_failed_resume_writes_nothing(
        tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path, in_process: Callable[..., int],
        capsys: pytest.CaptureFixture) -> None:
    from utils.weights.checkpoint import save_checkpoint

    run_dir = tmp_path / "runs" / "exp"
    weights = run_dir / "weights"
    assert in_process(train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--name", "exp", "--noval",
                                 epochs=2)) == 0
    assert load_checkpoint(weights / "last.prev.pt")["train_state"]["position"]["epoch"] == 1  # the one before
    previous = load_checkpoint(weights / "last.prev.pt")
    last = weights / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # damaged: truncated
    resume = [str(ROOT / "train.py"), "--resume", str(run_dir)]
    capsys.readouterr()
    assert in_process(resume) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in (out + err).splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "resuming from the previous generation" in warnings[0], warnings
    assert "Resuming from epoch 1 of 2, batch 0" in out and csv_epochs(run_dir) == ["0", "1"]
    assert load_checkpoint(last)["train_state"]["position"]["epoch"] == 2  # finished, whole again
    # a checkpoint that loads but cannot be restored (its early-stopping state is missing): nothing is rewritten
    del previous["train_state"]["states"]["stopper"]
    save_checkpoint(previous, last)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.iterdir() if p.is_file()}
    assert in_process(resume) == 2
    assert "no 'stopper' state" in capsys.readouterr().err
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.iterdir() if p.is_file()} == before
