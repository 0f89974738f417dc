"""GracefulStop: a signal only records its number; the vote makes it every rank's; a second one aborts; in an
immediate section it stops at once; exit codes; DataLoader workers ignore the stop signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from utils.distributed import signals
from utils.distributed.signals import GracefulStop, StopRequested


def test_signal_is_recorded_then_agreed_and_handlers_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with GracefulStop() as stop:
        assert not stop.requested and not stop.agreed
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM and not stop.agreed  # only recorded
        os.kill(os.getpid(), signal.SIGINT)  # a second, different signal (Ctrl-C, then torchrun's SIGTERM)
        assert stop.signum == signal.SIGTERM
        stop.agree(0)
        assert not stop.agreed
        stop.agree(int(signal.SIGTERM))  # the step vote carried it
        assert stop.agreed
        with pytest.raises(StopRequested) as info:
            stop.raise_stop(epoch=2, batch=5)
        assert info.value.exit_code == 143 and isinstance(info.value, KeyboardInterrupt)
        assert str(info.value) == "stopped by SIGTERM at epoch 2, batch 5; last.pt saved; continue with --resume"
    assert signal.getsignal(signal.SIGTERM) is before


def test_another_ranks_signal_is_agreed_here() -> None:
    with GracefulStop() as stop:
        stop.agree(int(signal.SIGUSR1))  # this rank got nothing; the vote says a rank got SIGUSR1
        assert stop.agreed and stop.requested
        with pytest.raises(StopRequested) as info:
            stop.raise_stop(epoch=0, batch=1)
    assert info.value.exit_code == 0 and "SIGUSR1" in str(info.value) and "requeued" in str(info.value)


def test_same_signal_twice_aborts_at_once_unless_it_is_a_duplicate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(signals.time, "monotonic", lambda: clock[0])
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs in a background job
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        clock[0] += 1.0  # delivered again at once (Slurm to every process, torchrun forwarding): one request
        os.kill(os.getpid(), signal.SIGINT)
        clock[0] += signals.REPEAT_WINDOW_S  # again, later: the user insists
        with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
    assert signal.getsignal(signal.SIGINT) is before


def test_immediate_section_stops_at_once() -> None:
    with GracefulStop() as stop:
        with pytest.raises(StopRequested, match="stopped by SIGTERM while validating epoch 3") as info:
            with stop.immediate("while validating epoch 3"):
                os.kill(os.getpid(), signal.SIGTERM)
                pytest.fail("the signal should have stopped the section")
        assert info.value.exit_code == 143 and stop.agreed
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # arrived just before the section: acted on when it starts
        with pytest.raises(StopRequested, match="SIGINT while saving"), stop.immediate("while saving"):
            pytest.fail("the section should not run")
    with GracefulStop() as stop, stop.immediate("quiet"):
        pass  # no signal: nothing happens
    assert not stop.requested


def test_a_stop_request_ends_a_stuck_wait_within_the_grace_period() -> None:
    """After a stop request no step ends (a data reader blocked for good): the main thread gets the signal again
    after ``stuck_s`` and stops at once, out of a wait that never returns by itself; a step ending re-arms it."""
    import threading
    import time

    with GracefulStop(stuck_s=0.5) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        stop.agree(0)  # a step ended: the watch starts again
        start = time.monotonic()
        with pytest.raises(StopRequested, match="no step ended within 0.5 s of it") as info:
            threading.Event().wait()  # blocked for good, as a read from a server that never answers
        assert 0.4 < time.monotonic() - start < 10 and info.value.exit_code == 143 and stop.agreed
    with GracefulStop(stuck_s=0.2) as stop:  # stopped in time: the watch ends with the stop
        os.kill(os.getpid(), signal.SIGTERM)
        stop.agree(int(signal.SIGTERM))
        with pytest.raises(StopRequested, match="last.pt saved"):
            stop.raise_stop(epoch=0, batch=0)
        time.sleep(0.5)  # no late signal arrives
    assert stop._timer is None


def test_protected_worker_ignores_stop_signals_from_others_but_not_from_its_rank() -> None:
    """A process (the 'rank') forks a protected child (the 'worker'): SIGTERM, SIGINT and SIGUSR1 from another
    process leave the worker running; SIGTERM from the rank (multiprocessing's terminate at exit) ends it."""
    code = """
import multiprocessing, os, signal, subprocess, sys, time
from utils.distributed.signals import protect_worker

def work():
    protect_worker()
    time.sleep(60)

if __name__ == "__main__":
    child = multiprocessing.get_context("fork").Process(target=work, daemon=True)
    child.start()
    time.sleep(0.5)
    for sig in ("-TERM", "-INT", "-USR1"):
        subprocess.run(["kill", sig, str(child.pid)], check=True)  # another process signals the worker
    time.sleep(0.5)
    print("alive after others' signals:", child.is_alive(), flush=True)
    child.terminate()  # the owner's SIGTERM
    child.join(timeout=10)
    print("exit code after the owner's SIGTERM:", child.exitcode, flush=True)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["alive after others' signals: True", "exit code after the owner's SIGTERM: 0"]


WITHOUT_SIGUSR1 = """
import importlib.util, runpy, signal, sys
del signal.SIGUSR1  # as on Windows: the signal module has no SIGUSR1 (nor per-thread signal masks)
del signal.pthread_sigmask, signal.sigwaitinfo
root, argv = sys.argv[1], sys.argv[2:]
sys.path.insert(0, root)
for name in ("train", "test", "val", "detect", "export", "hubconf"):
    module_name = "yolo_test_script" if name == "test" else name  # as tests.helpers.load_script names it
    spec = importlib.util.spec_from_file_location(module_name, f"{root}/{name}.py")
    sys.modules[module_name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[module_name])
from utils.distributed.signals import STOP_SIGNALS, protect_worker
protect_worker()  # a DataLoader worker there: SIGINT ignored, SIGTERM left as it is
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
print("stop signals:", sorted(signal.Signals(s).name for s in STOP_SIGNALS), flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.argv = argv
runpy.run_path(argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_every_script_imports_and_trains_where_the_platform_has_no_sigusr1(tmp_path, tiny_dataset,
                                                                            tiny_cfg_file) -> None:
    from tests.helpers import ROOT, job_env, run_job, train_args

    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--noval", epochs=1)
    code, out = run_job([sys.executable, "-c", WITHOUT_SIGUSR1, str(ROOT), *args], cwd=tmp_path, env=job_env())
    assert code == 0, out[-3000:]
    assert "stop signals: ['SIGINT', 'SIGTERM']" in out and "1 epochs completed" in out, out[-3000:]
    assert (tmp_path / "runs" / "exp" / "weights" / "last.pt").is_file()
