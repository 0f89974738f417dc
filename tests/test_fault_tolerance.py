"""Fault tolerance: graceful stop on signals (1 and 2 processes), a writer killed mid-checkpoint, unsafe
pickles refused, and through train.py: elastic restart after SIGKILL, exact resume, world-size changes,
SIGTERM, non-finite loss skipped collectively, flat resident memory.

The elastic restart of the process group itself is proven in tests/test_elastic_restart.py.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from utils.checkpoint import (
    FORMAT,
    CheckpointError,
    load_checkpoint,
    load_model,
    save_run_checkpoints,
    verify_checkpoint,
)
from utils.signals import GracefulStop, StopRequested

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
JOB_TIMEOUT_S = 120  # bound for one launched job on a loaded 2-core machine; a hang fails the test


# ----------------------------------------------------------------------------------------------- helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    """Start ``cmd`` in its own session (so a hang can be killed with all its children)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout_s: float = JOB_TIMEOUT_S) -> tuple[int, str]:
    """(exit code, output); kills the whole session and fails the test when it runs past ``timeout_s``."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(map(str, proc.args[:6]))} ... still running after {timeout_s} s:\n{out[-3000:]}")
    return proc.returncode, out


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, timeout_s: float = JOB_TIMEOUT_S) -> None:
    """Poll ``condition()`` until true; fail (killing ``proc``) if the process ends or time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"condition not reached (exit {proc.returncode}):\n{out[-3000:]}")
        time.sleep(0.05)


def torchrun(nproc: int, *args: str, restarts: int = 0) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--max-restarts",
            str(restarts), "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args]


def events_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ------------------------------------------------------------------------------------------------ signals
def test_signal_sets_flag_then_handlers_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with GracefulStop() as stop:
        assert not stop.requested and not stop.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.should_stop()
        os.kill(os.getpid(), signal.SIGINT)  # a second, different signal (Ctrl-C, then torchrun's SIGTERM)
        assert stop.signum == signal.SIGTERM
        with pytest.raises(StopRequested) as info:
            stop.raise_stop()
        assert info.value.exit_code == 143 and isinstance(info.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before


def test_same_signal_twice_aborts_at_once() -> None:
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_single_process_saves_last_and_exits_nonzero(tmp_path: Path) -> None:
    events, weights = tmp_path / "events.txt", tmp_path / "weights"
    code, out = finish(start([sys.executable, str(SCRIPTS / "signal_worker.py"), str(events), str(weights),
                              "self-int"], tmp_path))
    assert code == 130, out
    assert "rank=0 stopped step=3 local_signal=True" in events_of(events)
    assert "rank=0 finished" not in events_of(events)
    assert "rank=0 exit handler_restored=True" in events_of(events)
    assert load_checkpoint(weights / "last.pt")["epoch"] == 3


@pytest.mark.ddp
def test_one_signalled_rank_stops_both_at_the_same_step(tmp_path: Path) -> None:
    events, weights = tmp_path / "events.txt", tmp_path / "weights"
    cmd = torchrun(2, str(SCRIPTS / "signal_worker.py"), str(events), str(weights), "self-term-rank1")
    code, out = finish(start(cmd, tmp_path))
    lines = events_of(events)
    assert code != 0, out
    assert "rank=1 stopped step=3 local_signal=True" in lines, lines
    assert "rank=0 stopped step=3 local_signal=False" in lines, lines  # decided collectively
    assert not any("finished" in line for line in lines)
    assert load_checkpoint(weights / "last.pt")["epoch"] == 3


@pytest.mark.ddp
def test_torchrun_sigterm_saves_on_rank0_and_tears_down(tmp_path: Path) -> None:
    events, weights = tmp_path / "events.txt", tmp_path / "weights"
    proc = start(torchrun(2, str(SCRIPTS / "signal_worker.py"), str(events), str(weights), "wait"), tmp_path)
    wait_for(lambda: {"rank=0 step=5", "rank=1 step=5"} <= set(events_of(events)), proc)
    os.kill(proc.pid, signal.SIGTERM)  # what a scheduler does to the agent on pre-emption
    code, out = finish(proc)
    lines = events_of(events)
    stops = {m.group(1): int(m.group(2)) for line in lines if (m := re.match(r"rank=(\d) stopped step=(\d+)", line))}
    assert code != 0 and set(stops) == {"0", "1"} and stops["0"] == stops["1"], (lines, out[-2000:])
    assert load_checkpoint(weights / "last.pt")["epoch"] == stops["0"]
    assert {"rank=0 exit handler_restored=True", "rank=1 exit handler_restored=True"} <= set(lines)


# ----------------------------------------------------------------------------------- checkpoint safety
def test_killed_while_writing_keeps_previous_last(tmp_path: Path) -> None:
    weights, ready = tmp_path / "weights", tmp_path / "ready"
    proc = start([sys.executable, str(SCRIPTS / "slow_checkpoint_writer.py"), str(weights), str(ready)], tmp_path)
    wait_for(ready.exists, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-write
    finish(proc)
    partial = weights / f".last.pt.tmp{ready.read_text()}"
    assert partial.exists()
    with pytest.raises(CheckpointError, match="damaged"):
        verify_checkpoint(partial)
    for name in ("last.pt", "best.pt"):
        loaded = load_checkpoint(weights / name)
        assert loaded["epoch"] == 1 and torch.equal(loaded["model"]["w"], torch.ones(64, 1024)), name
    save_run_checkpoints({"format": FORMAT, "model": {}, "model_yaml": {}, "epoch": 3}, weights)
    assert not partial.exists() and load_checkpoint(weights / "last.pt")["epoch"] == 3


class CodeRunner:
    """Unpickling this runs os.mkdir: exactly what a weights-only load must refuse."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple:
        return os.mkdir, (str(self.target),)


def test_pickled_object_refused_without_running_it(tmp_path: Path) -> None:
    marker, path = tmp_path / "code-ran", tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "model": {}, "model_yaml": {}, "nc": 1, "hook": CodeRunner(marker)}, path)
    with pytest.raises(CheckpointError) as info:
        load_model(path)
    message = str(info.value)
    assert str(path) in message and "refused" in message and "may run code" in message
    assert "mkdir" in message and "--trust-weights" in message
    assert not marker.exists()
    load_checkpoint(path, trusted=True)  # the explicit opt-in does unpickle (and so runs the code)
    assert marker.is_dir()


# ------------------------------------------------------------------------------ end to end through train.py
# Faults are injected with train.py's test hooks, active on the first attempt only (TORCHELASTIC_RESTART_COUNT 0),
# so each fault lands at a known batch: YOLO_TEST_FAIL_AT=RANK:EPOCH:BATCH[:ACTION], ACTION one of raise
# (default), kill (SIGKILL itself), term (SIGTERM itself); YOLO_TEST_NAN_AT=RANK:EPOCH:BATCH[:COUNT] (NaN loss).
# Single-process runs call train.main in this process (no interpreter start-up); DDP runs use torchrun.
def train_cmd(data: Path, cfg: Path, project: Path, *extra: str, epochs: int = 3) -> list[str]:
    return [str(ROOT / "train.py"), "--data", str(data), "--cfg", str(cfg), "--weights", "", "--img-size", "64",
            "--batch-size", "8", "--epochs", str(epochs), "--workers", "0", "--device", "cpu", "--seed", "0",
            "--project", str(project), "--noautoanchor", *extra]


def launch(nproc: int, args: list[str], fault: str | None = None, restarts: int = 0,
           nan: str | None = None) -> subprocess.Popen:
    """Start train.py with ``nproc`` processes under torchrun, injecting ``fault`` / ``nan`` if given."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    for name, value in (("YOLO_TEST_FAIL_AT", fault), ("YOLO_TEST_NAN_AT", nan)):
        env.pop(name, None)
        if value:
            env[name] = value
    return subprocess.Popen(torchrun(nproc, *args, restarts=restarts), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., int]]:
    """``run(args, fault=None)``: train.py's main in this process (one torch thread, the logger restored)."""
    import train
    from utils.cli import run_main
    from utils.logging import LOGGER

    threads, handlers, level = torch.get_num_threads(), list(LOGGER.handlers), LOGGER.level
    torch.set_num_threads(1)

    def run(args: list[str], fault: str | None = None) -> int:
        monkeypatch.delenv("YOLO_TEST_NAN_AT", raising=False)
        if fault:
            monkeypatch.setenv("YOLO_TEST_FAIL_AT", fault)
        else:
            monkeypatch.delenv("YOLO_TEST_FAIL_AT", raising=False)
        return run_main(train.main, train.parse_opt(args[1:]), "train")

    yield run
    torch.set_num_threads(threads)
    LOGGER.handlers[:], LOGGER.level = handlers, level


def csv_epochs(run_dir: Path) -> list[str]:
    return [line.split(",")[0] for line in (run_dir / "results.csv").read_text().strip().splitlines()[1:]]


@pytest.mark.slow
@pytest.mark.ddp
def test_train_restart_after_sigkill_finishes_all_epochs(tmp_path: Path, tiny_dataset: Path,
                                                          tiny_cfg_file: Path) -> None:
    project = tmp_path / "runs"
    args = train_cmd(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval")
    code, out = finish(launch(2, args, fault="1:1:1:kill", restarts=1))  # rank 1 dies in epoch 2 of 3
    assert code == 0, out[-3000:]
    assert csv_epochs(project / "exp") == ["0", "1", "2"]
    assert re.search(r"Resum\w* .*elastic restart 1.*last\.pt", out), out[-3000:]
    assert "Resuming from epoch 1 of 3, batch 0" in out
    assert sorted(p.name for p in project.iterdir()) == ["exp"]


@pytest.mark.slow
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                                      in_process: Callable[..., int]) -> None:
    project = tmp_path / "runs"
    args = lambda name: train_cmd(tiny_dataset, tiny_cfg_file, project, "--name", name,  # noqa: E731
                                  "--save-interval-steps", "1", epochs=2)
    assert in_process(args("whole")) == 0
    with pytest.raises(RuntimeError, match="test fault injected at epoch 1 batch 1"):
        in_process(args("cut"), fault="0:1:1")  # crashes mid-epoch 2; last.pt is from the batch before
    cut_last = project / "cut" / "weights" / "last.pt"
    assert load_checkpoint(cut_last)["train_state"]["position"]["samples_seen"] == 8
    assert in_process([str(ROOT / "train.py"), "--resume", str(cut_last)]) == 0
    whole, resumed = load_checkpoint(project / "whole" / "weights" / "last.pt"), load_checkpoint(cut_last)
    assert csv_epochs(project / "cut") == ["0", "1"]
    raw_whole, raw_resumed = whole["train_state"]["states"]["model"], resumed["train_state"]["states"]["model"]
    pairs = [(whole["model"], resumed["model"]), (raw_whole, raw_resumed)]
    diff = max((a[k].float() - b[k].float()).abs().max().item() for a, b in pairs for k in a)
    assert diff <= 1e-6, diff
    assert resumed["train_state"]["states"]["stepper"]["iteration"] == 6


@pytest.mark.slow
@pytest.mark.ddp
def test_resume_across_world_sizes_1_to_2_to_1(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                                in_process: Callable[..., int], capsys: pytest.CaptureFixture) \
        -> None:
    project, run_dir = tmp_path / "runs", tmp_path / "runs" / "exp"
    args = train_cmd(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval")
    assert in_process(args, fault="0:0:1:term") == 130  # 1 process, stopped in epoch 1 of 3
    resume = [str(ROOT / "train.py"), "--resume", str(run_dir)]
    code, out = finish(launch(2, resume, fault="0:1:1:term"))  # 1 -> 2 processes, stopped again in epoch 2
    assert code != 0 and "processes 1 -> 2, batch per process 8 -> 4" in out, out[-3000:]
    assert "kept total batch 8" in out and "Resuming from epoch 0 of 3, batch 2" in out
    assert load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]["position"]["epoch"] == 1
    capsys.readouterr()
    assert in_process(resume) == 0  # 2 -> 1 process, to the end
    out = capsys.readouterr().out
    assert "processes 2 -> 1, batch per process 4 -> 8" in out and "Resuming from epoch 1 of 3, batch 2" in out, out
    assert csv_epochs(run_dir) == ["0", "1", "2"]
    assert load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]["states"]["stepper"]["iteration"] == 9


@pytest.mark.slow
def test_sigterm_single_process_saves_last_and_exits_nonzero(tmp_path: Path, tiny_dataset: Path,
                                                             tiny_cfg_file: Path, in_process: Callable[..., int],
                                                             capsys: pytest.CaptureFixture) -> None:
    project = tmp_path / "runs"
    before = signal.getsignal(signal.SIGTERM)
    code = in_process(train_cmd(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval"), fault="0:0:1:term")
    assert code == 130 and "train: interrupted" in capsys.readouterr().err
    state = load_checkpoint(project / "exp" / "weights" / "last.pt")["train_state"]
    assert state["position"] == {**state["position"], "epoch": 0, "samples_seen": 16}
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_train_refuses_pickled_weights(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                       in_process: Callable[..., int], capsys: pytest.CaptureFixture) -> None:
    evil = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "model": {}, "model_yaml": {}, "hook": CodeRunner(tmp_path / "ran")}, evil)
    args = train_cmd(tiny_dataset, tiny_cfg_file, tmp_path / "runs", epochs=1)
    args[args.index("--weights") + 1] = str(evil)
    assert in_process(args) == 2
    err = capsys.readouterr().err
    assert "train: error:" in err and "refused" in err and not (tmp_path / "ran").exists()


@pytest.mark.slow
@pytest.mark.ddp
def test_nonfinite_loss_skipped_on_both_ranks_then_reloaded(tmp_path: Path, tiny_dataset: Path,
                                                             tiny_cfg_file: Path) -> None:
    project = tmp_path / "runs"
    args = train_cmd(tiny_dataset, tiny_cfg_file, project, "--name", "exp", "--noval")
    code, out = finish(launch(2, args, nan="1:1:0:3"))  # rank 1 only: NaN loss in all 3 batches of epoch 1
    assert code == 0, out[-3000:]
    assert "Epoch 1: resident memory" in out and "skipped 3 steps with a non-finite loss (3 in all)" in out, out
    assert re.search(r"non-finite loss in 3 steps in a row: reloaded \S+last\.pt; learning rate halved", out), out
    last = load_checkpoint(project / "exp" / "weights" / "last.pt")
    stepper = last["train_state"]["states"]["stepper"]
    assert stepper["iteration"] == 6  # epochs 0 and 2 stepped; epoch 1 skipped on both ranks
    assert stepper["optimizer"]["param_groups"][0]["initial_lr"] == pytest.approx(0.5 * last["hyp"]["lr0"])
    assert all(torch.isfinite(v).all() for v in last["model"].values() if v.is_floating_point())
    assert csv_epochs(project / "exp") == ["0", "1", "2"]


@pytest.mark.slow
def test_resident_memory_flat_over_epochs(tmp_path: Path, tiny_dataset: Path, tiny_cfg_file: Path,
                                          in_process: Callable[..., int], capsys: pytest.CaptureFixture) -> None:
    args = train_cmd(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--noval", epochs=6)
    assert in_process(args) == 0
    rss = [float(m) for m in re.findall(r"Epoch \d+: resident memory (\d+) MB", capsys.readouterr().out)]
    assert len(rss) == 6 and rss[5] <= 1.10 * rss[2], rss


def test_results_csv_drops_rows_after_the_resumed_checkpoint(tmp_path: Path) -> None:
    from utils.callbacks import ResultsCSV

    results = ResultsCSV(tmp_path / "results.csv")
    for epoch in range(3):
        results.write([epoch, *[0.5] * 10])
    assert results.drop_from(1) == 2 and csv_epochs(tmp_path) == ["0"]
    assert results.drop_from(1) == 0 and ResultsCSV(tmp_path / "other.csv").drop_from(0) == 0
