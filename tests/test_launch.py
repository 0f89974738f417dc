"""Several processes without ceremony, and the line users need last: ``python train.py --device cpu
--nproc-per-node 2`` (the CPU twin of ``--device 0,1``) starts its processes through torch's elastic launcher;
``train.run(nproc_per_node=2)`` works from stdin, the workers never running the caller's ``__main__``; a user
error under torchrun or our launcher ends with our one line."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, job_env, load_script, one_thread_and_logger_kept, run_job, torchrun_cmd
from utils.evaluation.evaluate import ROW_FORMAT

pytestmark = [pytest.mark.ddp, pytest.mark.slow]
BATCH_LINE = "train: error: --batch-size 3 must be a positive multiple of the world size 2 (it is the total over all " \
             "ranks)"


def tiny_args(data: Path, cfg: Path, project: Path, *extra: str) -> list[str]:
    return ["--data", str(data), "--cfg", str(cfg), "--img", "64", "--epochs", "1", "--batch", "8", "--workers", "0",
            "--project", str(project), "--noplots", "--noautoanchor", *extra]


def test_nproc_per_node_on_the_cpu_trains_in_two_processes_and_exits_cleanly(tiny_dataset: Path, tiny_cfg_file: Path,
                                                                             tmp_path: Path) -> None:
    """One command, two ranks; the equivalent torchrun command printed once; no grad-strides warning (the
    parameters take their gradients' strides, utils.training.engine.align_to_gradients), no traceback."""
    args = tiny_args(tiny_dataset, tiny_cfg_file, tmp_path, "--device", "cpu", "--nproc-per-node", "2")
    code, out = run_job([sys.executable, str(ROOT / "train.py"), *args])
    assert code == 0, out[-3000:]
    assert out.count("torchrun --standalone --nproc_per_node 2 train.py --data") == 1
    assert "--nproc-per-node" not in out.split("torchrun --standalone", 1)[1].splitlines()[0]
    assert "batch 4 per rank, 2 ranks" in out and out.count("1 epochs completed in") == 1
    assert "Grad strides do not match" not in out and "Traceback" not in out and "UserWarning" not in out, out
    assert (tmp_path / "exp" / "weights" / "last.pt").is_file() and not (tmp_path / "exp2").exists()
    progress = [line for line in out.splitlines() if line.strip().startswith("0/0")]  # the epoch's one line
    assert len(progress) == 1 and "3/3 batches in" in progress[0], progress  # 24 images: 12 a rank, 4 a batch
    assert "\r" not in out and "it/s]" not in out and "img/s]" not in out  # no bar redraws in a log


def test_a_user_error_under_our_launcher_is_the_last_line(tiny_dataset: Path, tiny_cfg_file: Path,
                                                         tmp_path: Path) -> None:
    args = tiny_args(tiny_dataset, tiny_cfg_file, tmp_path, "--device", "cpu", "--nproc-per-node", "2", "--batch",
                     "3")
    code, out = run_job([sys.executable, str(ROOT / "train.py"), *args])
    assert code == 2 and out.strip().splitlines()[-1] == BATCH_LINE, out[-3000:]
    assert out.count(BATCH_LINE) == 1 and "Traceback" not in out and "FAILED" not in out
    assert not list(tmp_path.glob("exp*"))  # a failed start leaves no empty run folder


def test_a_user_error_under_torchrun_is_its_root_cause_and_last_line(tiny_dataset: Path, tiny_cfg_file: Path,
                                                                   tmp_path: Path) -> None:
    """torchrun prints its failure table after the processes end; our line is the table's root cause, the last
    line before its closing border (torch elastic's error file: utils.distributed.launcher.record_error_line), on
    whichever rank torchrun saw fail first (whole seconds decide: under load rank 1 may)."""
    code, out = run_job(torchrun_cmd(2, str(ROOT / "train.py"), *tiny_args(tiny_dataset, tiny_cfg_file, tmp_path,
                                                                            "--device", "cpu", "--batch", "3")))
    assert code != 0
    lines = [line for line in out.strip().splitlines() if line.strip() and set(line.strip()) != {"="}]
    assert lines[-1] == f"  traceback : {BATCH_LINE}", out[-3000:]
    root_cause = out.split("Root Cause (first observed failure):", 1)[1]
    assert re.search(r"rank      : [01] \(local_rank: [01]\)", root_cause) and "To enable traceback" not in out


def test_a_user_error_in_srun_tasks_is_the_last_line_they_print(tiny_dataset: Path, tiny_cfg_file: Path,
                                                               tmp_path: Path) -> None:
    """Two tasks as srun starts them (Slurm's variables, no torchrun): rank 0 says the line and it is the last
    thing the job's processes print; rank 1 leaves quietly with the same exit code (srun itself then adds its
    summary of the tasks' exit codes)."""
    from tests.helpers import finish, start
    from tests.test_cluster import slurm_env, slurm_port_job_id

    job_id = slurm_port_job_id()
    args = [str(ROOT / "train.py"), *tiny_args(tiny_dataset, tiny_cfg_file, tmp_path, "--device", "cpu", "--batch",
                                               "3")]
    procs = [start([sys.executable, *args], env=slurm_env(rank, job_id)) for rank in range(2)]
    (code0, out0), (code1, out1) = (finish(p) for p in procs)
    assert (code0, code1) == (2, 2), out0[-3000:] + out1[-3000:]
    assert out0.strip().splitlines()[-1] == BATCH_LINE and out1.strip() == "", out0[-3000:] + out1[-3000:]
    assert "Traceback" not in out0 + out1 and not list(tmp_path.glob("exp*"))


def test_train_run_with_two_processes_from_stdin(tiny_dataset: Path, tiny_cfg_file: Path, tmp_path: Path) -> None:
    """``python - <<EOF`` with train.run(nproc_per_node=2) at its top level: no __main__ guard, no file to import;
    the processes never run the caller's code, and rank 0's result comes back."""
    script = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport train\n"
              f"result = train.run(nproc_per_node=2, data={str(tiny_dataset)!r}, cfg={str(tiny_cfg_file)!r}, img=64, "
              f"epochs=1, batch_size=8, workers=0, device='cpu', project={str(tmp_path)!r}, noplots=True, "
              "noautoanchor=True)\nprint('mAP', sorted(result.metrics), result.save_dir.name)\n")
    stdin = tmp_path / "stdin.py"
    stdin.write_text(script)
    with open(stdin) as source:
        import subprocess

        proc = subprocess.run([sys.executable, "-"], stdin=source, capture_output=True, text=True, timeout=300,
                              env=job_env(), cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "mAP ['mAP_0.5', 'mAP_0.5:0.95', 'precision', 'recall'] exp" in out
    assert "Traceback" not in out and "Grad strides" not in out and out.count("1 epochs completed in") == 1


def test_hooks_defined_in_an_unguarded_script_or_python_c_get_one_line_saying_what_to_change(
        tiny_dataset: Path, tiny_cfg_file: Path, tmp_path: Path) -> None:
    """A hook class written in the calling script reaches the processes only by importing that script: from
    ``python -c`` it cannot (said before any process starts); from a file without ``if __name__ == "__main__":``
    each process meets train.run again and stops, and the caller's error says where to put the call."""
    import subprocess

    script = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport train\nfrom utils.hooks import HookBase\n"
              "class Seen(HookBase):\n    pass\n"
              f"train.run(nproc_per_node=2, hooks=[Seen()], data={str(tiny_dataset)!r}, cfg={str(tiny_cfg_file)!r}, "
              f"img=64, epochs=1, batch_size=8, workers=0, device='cpu', project={str(tmp_path / 'runs')!r})\n")
    (tmp_path / "unguarded.py").write_text(script)
    outputs = {}
    for how, argv in (("-c", ["-c", script]), ("file", [str(tmp_path / "unguarded.py")])):
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, env=job_env(),
                              cwd=tmp_path)
        outputs[how] = proc.stdout + proc.stderr
        assert proc.returncode == 1, outputs[how][-3000:]
    last = [text.strip().splitlines()[-1] for text in outputs.values()]
    assert last[0] == ("utils.api.OptionError: Seen is defined in __main__ of an interactive session, python -c or "
                       "stdin, which new processes cannot import: define it in a module of its own and import it")
    assert last[1].startswith("utils.api.OptionError: a new process imported ") and last[1].endswith(
        "unguarded.py for the hooks defined there, and it called train.run() again: put the call under `if __name__ "
        "== \"__main__\":`"), outputs["file"][-3000:]
    assert "Traceback" not in outputs["file"].split("Traceback", 1)[1]  # the caller's one, none from the processes
    assert not (tmp_path / "runs").exists()  # nothing trained, no run folder


def test_test_py_validates_in_two_shards_with_the_metrics_of_one_process(tiny_weights: Path, tiny_dataset: Path,
                                                                         tmp_path: Path) -> None:
    """``test.py --device cpu --nproc-per-node 2``: each process a shard of the images, the statistics gathered,
    the table printed once and equal to a one-process run's."""
    args = [str(ROOT / "test.py"), "--weights", str(tiny_weights), "--data", str(tiny_dataset), "--img", "64",
            "--batch", "4", "--workers", "0", "--device", "cpu", "--conf-thres", "0.001"]
    code, out = run_job([sys.executable, *args, "--nproc-per-node", "2", "--project", str(tmp_path / "two")])
    assert code == 0, out[-3000:]
    assert out.count("torchrun --standalone --nproc_per_node 2 test.py --weights") == 1
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["all"]]
    with one_thread_and_logger_kept():  # the same validation in this one process
        alone = load_script("test").run(weights=tiny_weights, data=tiny_dataset, img=64, batch=4, workers=0,
                                        device="cpu", conf_thres=0.001, project=tmp_path / "one")
    expected = ROW_FORMAT % ("all", alone.seen, alone.n_labels, alone.mp, alone.mr, alone.map50, alone.map)
    assert len(rows) == 1 and rows[0] == expected.split() and rows[0][1] == "12"  # 12 images, as one process sees


def test_ctrl_c_under_our_launcher_ends_with_the_ranks_line(tiny_dataset: Path, tiny_cfg_file: Path,
                                                           tmp_path: Path) -> None:
    """Ctrl-C reaches the launching process (its processes run in sessions of their own); the launcher passes
    SIGINT on, the ranks stop together, and rank 0's line saying where and what was saved is the last one: exit
    code 130, no traceback and nothing of the launcher's after it."""
    import signal

    from tests.helpers import OutputPump, start, wait_for

    args = tiny_args(tiny_dataset, tiny_cfg_file, tmp_path, "--device", "cpu", "--nproc-per-node", "2")
    args[args.index("--epochs") + 1] = "5"
    proc = start([sys.executable, str(ROOT / "train.py"), *args])
    pump = OutputPump(proc)
    wait_for(lambda: any(text.strip().startswith("0/4") for _, text in pump.lines), proc)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=180)
    pump.thread.join(10)
    lines = [text for _, text in pump.lines if text.strip()]
    assert code == 130 and lines[-1].startswith("train: stopped by SIGINT"), "\n".join(lines[-20:])
    assert lines[-1].count("train: stopped by SIGINT") == 1 and " epoch " in lines[-1]  # where, and what is saved
    assert not any("Traceback" in t or "torch/distributed" in t or "FAILED" in t for t in lines)
