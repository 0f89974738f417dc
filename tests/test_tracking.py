"""The trackers for real, without network: a real ``mlflow server`` on 127.0.0.1 (SQLite backend, local artifact
folder), W&B in offline mode, ClearML in offline mode, Comet's offline experiment. Tiny runs at 64 px; what each
tool wrote is read back and compared with results.csv."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, OutputPump, free_port, job_env, run_job, start, torchrun_cmd, train_args
from utils.hooks import HookBase
from utils.loggers.tracker_queue import CANCELLED_FLUSH_S
from utils.loggers.tracking import TrackerHook

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread_and_clean_logger")]
TRACKER_MODULES = ("mlflow", "wandb", "clearml", "comet_ml")


# ------------------------------------------------------------------------------------------------ the MLflow server
class MlflowServer:
    """``mlflow server`` on a free loopback port, SQLite backend and a local artifact folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.start()

    def start(self) -> None:
        folder = self.folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(folder / "server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers",
             "1", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination",
             str(folder / "artifacts")], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env=job_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))  # no job runner: it halves the start-up

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {self.proc.returncode}: {self.log_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.kill()
        pytest.fail(f"mlflow server not ready after {timeout_s} s: {self.log_text()[-2000:]}")

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()
        server.log.close()


@pytest.fixture
def tracker_env(mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Each tool's own variables: MLflow at the loopback server (an experiment per test), the others offline."""
    if mlflow_server.proc.poll() is not None:  # a test killed it
        mlflow_server.log.close()
        mlflow_server.start()
        mlflow_server.wait_ready()
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": f"exp-{tmp_path.name}",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "COMET_START_ONLINE": "false",
           "CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": str(tmp_path / "clearml-cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def tiny_args(tiny_cfg_file: Path, tiny_dataset: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["--cfg", str(tiny_cfg_file), "--data", str(tiny_dataset), "--img", "64", "--batch-size", "8",
            "--device", "cpu", "--workers", "0", "--noautoanchor", "--project", str(tmp_path / "runs"), *extra]


def train_in_process(args: list[str], hooks: tuple[HookBase, ...] = ()) -> int:
    from tests.helpers import load_script
    from utils.cli import run_main

    train = load_script("train")
    return run_main(lambda o: train.main(o, hooks), train.parse_opt(args), "train")


def results_rows(save_dir: Path) -> list[dict[str, float]]:
    with open(save_dir / "results.csv", newline="") as f:
        return [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def tracker_warnings(output: str) -> list[str]:
    """The trackers' warning lines in a run's output (``WARNING: <tracker>: ...``)."""
    return re.findall(r"WARNING: (?:mlflow|wandb|clearml|comet): [^\n]*", output)  # also mid-line, after a progress bar


# ------------------------------------------------------------------------------------------------ readers
def mlflow_runs(env: dict[str, str]) -> list[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name(env["MLFLOW_EXPERIMENT_NAME"])
    return client.search_runs([experiment.experiment_id]) if experiment else []


def mlflow_artifacts(client: Any, run_id: str, path: str | None = None) -> list[str]:
    files = []
    for item in client.list_artifacts(run_id, path):
        files += mlflow_artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return files


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file (LevelDB log format: 7-byte header, 32 KiB blocks of crc/len/type chunks)."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, chunks, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if kind == 0:
            break
        chunks += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def wandb_history(records: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


def assert_metrics_match(logged: dict[int, dict[str, float]], rows: list[dict[str, float]], tool: str) -> None:
    """Every epoch of results.csv, every column, as the tracker holds it (results.csv keeps 6 digits)."""
    assert sorted(logged) == [int(r["epoch"]) for r in rows], tool
    for row in rows:
        for column, value in row.items():
            if column != "epoch":
                assert logged[int(row["epoch"])][column] == pytest.approx(value, rel=1e-5, abs=1e-9), (tool, column)


# ------------------------------------------------------------------------------------------------ the tests
class StopWhenTrackersCaughtUp(HookBase):
    """``--hook tests.test_tracking:StopWhenTrackersCaughtUp``: before epoch 1 waits until every tracker sent what
    was queued, then sends this process SIGTERM; prints a line with the time when the hooks start closing."""

    priority = 10  # closes before the loggers

    def before_step(self, trainer: Any, epoch: int, batch: int) -> None:
        if (epoch, batch) != (1, 0):
            return
        for hook in trainer.hooks:  # the run's hooks, as the TrainerView lists them
            if isinstance(hook, TrackerHook):
                caught_up = threading.Event()
                hook.queue.submit(caught_up.set)  # in order: set once the calls before it ran
                assert caught_up.wait(120), f"{hook.tracker.name} did not catch up"
        os.kill(os.getpid(), signal.SIGTERM)

    def close(self, trainer: Any, cancelled: bool) -> None:
        print(f"closing the hooks at {time.monotonic():.3f}", flush=True)


@pytest.mark.timeout(900)  # two training runs and three trackers: minutes when other jobs share the cores
def test_every_tracker_gets_the_run_and_a_resume_continues_the_same_run(tracker_env, tiny_cfg_file, tiny_dataset,
                                                                       tmp_path, capsys):
    # --tracker-timeout (kept by the resumed run): a loaded machine's loopback server may need more than the
    # default 10 s for the plots and weights at the end; a tracker that fails still warns, and fails the test
    args = tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "2", "--bbox_interval", "1",
                     "--tracker-timeout", "120", "--loggers", "csv", "mlflow", "wandb", "comet")
    # SIGTERM before epoch 1, once every tracker named its run (a slow start would leave the run id out of last.pt)
    assert train_in_process(args, (StopWhenTrackersCaughtUp(),)) != 0
    stopped = tracker_warnings(capsys.readouterr().out)  # a stopped run gives its trackers 3 s, then exits
    assert all("gave up after 3 s" in line for line in stopped), stopped
    save_dir = tmp_path / "runs" / "exp"
    assert train_in_process([*tiny_args(tiny_cfg_file, tiny_dataset, tmp_path), "--resume",
                             str(save_dir / "weights" / "last.pt")]) == 0
    output = capsys.readouterr().out
    assert not tracker_warnings(output), output[-3000:]
    rows = results_rows(save_dir)
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    check_mlflow(tracker_env, rows)
    check_wandb(save_dir, rows)
    check_comet(save_dir, rows)


def check_mlflow(env: dict[str, str], rows: list[dict[str, float]]) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = mlflow_runs(env)
    assert len(runs) == 1  # the resumed process continued the run
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "exp"
    params = run.data.params
    assert params["epochs"] == "2" and float(params["hyp/lr0"]) > 0 and int(params["model/parameters"]) > 0
    assert params["env/world_size"] == "1" and params["env/launcher"] == "none" and params["env/device"] == "cpu"
    logged: dict[int, dict[str, float]] = {}
    for column in rows[0]:
        if column != "epoch":
            for metric in client.get_metric_history(run.info.run_id, column):
                logged.setdefault(metric.step, {})[column] = metric.value
    assert_metrics_match(logged, rows, "mlflow")
    files = set(mlflow_artifacts(client, run.info.run_id))
    assert {"weights/best.pt", "plots/results.png", "plots/labels.jpg", "plots/confusion_matrix.png"} <= files
    assert {f.split("/")[1] for f in files if f.startswith("validation/")} == {"epoch0", "epoch1"}


def check_wandb(save_dir: Path, rows: list[dict[str, float]]) -> None:
    run_files = sorted((save_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 2  # one file per process, one run id
    assert len({p.name for p in run_files}) == 1
    histories = [wandb_history(wandb_records(p)) for p in run_files]
    epochs = [int(h["epoch"]) for history in histories for h in history if "epoch" in h]
    assert epochs == [0, 1]  # in order across the two processes
    logged = {int(h["epoch"]): h for history in histories for h in history if "epoch" in h}
    assert_metrics_match(logged, rows, "wandb")
    keys = {k for history in histories for h in history for k in h}
    assert {"Validation", "Results"} <= {k.split("/")[0] for k in keys}
    config = [i.key for r in wandb_records(run_files[0]) if r.WhichOneof("record_type") == "config"
              for i in r.config.update]
    assert {"hyp/lr0", "model/gflops", "env/torch"} <= set(config)


def comet_offline(save_dir: Path) -> tuple[list[Path], dict[int, dict[str, float]], str]:
    """Comet's offline archives of a run folder, the metrics they hold by step, and their messages as text."""
    archives = sorted((save_dir / "comet").glob("*.zip"))
    logged: dict[int, dict[str, float]] = {}
    messages = ""
    for path in archives:
        with zipfile.ZipFile(path) as archive:
            text = archive.read("messages.json").decode()
        messages += text
        for line in text.splitlines():
            payload = json.loads(line).get("payload", {})
            metric = payload.get("metric") if isinstance(payload, dict) else None
            if metric:
                logged.setdefault(int(metric["step"]), {})[metric["metricName"]] = float(metric["metricValue"])
    return archives, logged, messages


def check_comet(save_dir: Path, rows: list[dict[str, float]]) -> None:
    archives, logged, messages = comet_offline(save_dir)
    assert len(archives) == 2 and len({a.name[:32] for a in archives}) == 1  # one experiment key, two sessions
    assert_metrics_match(logged, rows, "comet")
    assert '"best.pt"' in messages and "results.png" in messages  # the model and the plots were sent


class TrackerModulesProbe(HookBase):
    """``--hook tests.test_tracking:TrackerModulesProbe``: at close, writes the tracker packages this rank imported
    to <run folder>/modules-rank<N>.json."""

    def close(self, trainer: Any, cancelled: bool) -> None:
        from utils.distributed import comm as dist

        loaded = [name for name in TRACKER_MODULES if name in sys.modules]
        (Path(trainer.save_dir) / f"modules-rank{dist.get_rank()}.json").write_text(json.dumps(loaded))


@pytest.mark.ddp
@pytest.mark.timeout(900)
def test_a_two_rank_ddp_run_is_one_tracked_run_and_other_ranks_import_no_tracker(tracker_env, tiny_cfg_file,
                                                                                  tiny_dataset, tmp_path):
    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--loggers", "mlflow", "--hook",
                      "tests.test_tracking:TrackerModulesProbe", epochs=2)
    code, output = run_job(torchrun_cmd(2, *args), env=job_env(**tracker_env))
    assert code == 0, output[-3000:]
    save_dir = tmp_path / "runs" / "exp"
    assert json.loads((save_dir / "modules-rank0.json").read_text()) == ["mlflow"]
    assert json.loads((save_dir / "modules-rank1.json").read_text()) == []
    (run,) = mlflow_runs(tracker_env)  # one tracked run, not one per rank
    assert run.data.params["env/world_size"] == "2" and run.data.params["env/launcher"] == "torchrun"
    from mlflow import MlflowClient

    history = MlflowClient(tracker_env["MLFLOW_TRACKING_URI"]).get_metric_history(run.info.run_id, "x/lr0")
    assert [m.step for m in history] == [0, 1]


def test_evolve_makes_one_tracked_run_per_generation_grouped(tracker_env, tiny_cfg_file, tiny_dataset, tmp_path):
    args = tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "1", "--evolve", "2", "--noplots",
                     "--loggers", "mlflow")
    assert train_in_process(args) == 0
    runs = sorted(mlflow_runs(tracker_env), key=lambda r: r.info.run_name)
    assert [r.info.run_name for r in runs] == ["exp-evolve/gen0", "exp-evolve/gen1"]
    assert {r.data.tags["group"] for r in runs} == {"exp-evolve"}
    first, second = (r.data.params for r in runs)
    assert any(first[k] != second[k] for k in first if k.startswith("hyp/"))  # generation 1's hyps were mutated


# ------------------------------------------------------------------------------------------------ ClearML, stopping
def clearml_env(tmp_path: Path) -> dict[str, str]:
    """ClearML offline, its configuration and cache inside the test's folder (nothing read from or written to ~)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "CLEARML_CONFIG_FILE": str(home / "clearml.conf"), "CLEARML_OFFLINE_MODE": "1",
            "CLEARML_CACHE_DIR": str(tmp_path / "clearml-cache")}


def clearml_session(cache_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The task and the reported events of the one offline session ClearML stored (``<cache>/offline/<id>.zip``)."""
    (path,) = sorted((cache_dir / "offline").glob("*.zip"))
    with zipfile.ZipFile(path) as archive:
        task = json.loads(archive.read("task.json"))
        events = [e for line in archive.read("metrics.jsonl").decode().splitlines() for e in json.loads(line)]
    return task, events


def clearml_scalars(events: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Scalars by iteration (ClearML keeps the single values of the summary at a large negative iteration)."""
    logged: dict[int, dict[str, float]] = {}
    for event in events:
        if event["type"] == "training_stats_scalar":
            logged.setdefault(int(event["iter"]), {})[f"{event['metric']}/{event['variant']}"] = event["value"]
    return logged


@pytest.mark.timeout(900)
def test_a_stopped_run_ends_its_trackers_in_time_and_a_resume_continues_the_clearml_task(tracker_env, tiny_cfg_file,
                                                                                        tiny_dataset, tmp_path):
    env = {**tracker_env, **clearml_env(tmp_path)}
    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--bbox_interval", "1", "--hook",
                      "tests.test_tracking:StopWhenTrackersCaughtUp", "--loggers", "mlflow", "wandb", "clearml",
                      "comet", epochs=2, plots=True)
    pump = OutputPump(start([sys.executable, *args], env=job_env(**env)))
    code, ended = pump.wait()
    output = pump.text
    assert code == 128 + signal.SIGTERM, output[-3000:]
    closing = float(re.search(r"closing the hooks at ([\d.]+)", output).group(1))
    stopped = next(t for t, text in pump.lines if text.startswith("train: stopped by SIGTERM"))
    close_s, exit_s = stopped - closing, ended - stopped
    print(f"trackers closed in {close_s:.1f} s (deadline {CANCELLED_FLUSH_S:g} s), then the process exited in "
          f"{exit_s:.1f} s")
    timeline = "\n".join(f"{t - closing:+7.2f} {text}" for t, text in pump.lines if t > closing - 1)
    assert close_s <= CANCELLED_FLUSH_S + 1, timeline  # the four together within the one deadline
    assert exit_s < 4 * CANCELLED_FLUSH_S, timeline  # nothing of theirs holds the exit (a hang is minutes)
    assert not tracker_warnings(output), output[-3000:]
    save_dir = tmp_path / "runs" / "exp"
    rows = results_rows(save_dir)
    assert [int(r["epoch"]) for r in rows] == [0]  # every record below holds the epoch that finished
    (run,) = mlflow_runs(tracker_env)
    assert run.info.status == "KILLED"
    from mlflow import MlflowClient

    client = MlflowClient(tracker_env["MLFLOW_TRACKING_URI"])
    assert_metrics_match({0: {c: client.get_metric_history(run.info.run_id, c)[0].value for c in rows[0] if
                              c != "epoch"}}, rows, "mlflow")
    (run_file,) = (save_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    assert_metrics_match({int(h["epoch"]): h for h in wandb_history(records) if "epoch" in h}, rows, "wandb")
    assert any(r.WhichOneof("record_type") == "exit" for r in records)  # the run was ended, not cut off
    assert_metrics_match(clearml_scalars(clearml_session(Path(env["CLEARML_CACHE_DIR"]))[1]), rows, "clearml")
    archives, logged, _ = comet_offline(save_dir)
    assert len(archives) == 1
    assert_metrics_match(logged, rows, "comet")
    check_clearml_resumed(env, save_dir)


def check_clearml_resumed(env: dict[str, str], save_dir: Path) -> None:
    """``--resume`` the stopped run with ClearML: its offline task continues, epochs as iterations, and ends whole."""
    resume = [sys.executable, str(ROOT / "train.py"), "--resume", str(save_dir / "weights" / "last.pt"), "--device",
              "cpu", "--workers", "0", "--loggers", "clearml"]
    code, output = run_job(resume, env=job_env(**env))
    assert code == 0 and not tracker_warnings(output), output[-3000:]
    rows = results_rows(save_dir)
    task, events = clearml_session(Path(env["CLEARML_CACHE_DIR"]))  # one session: the same task, continued
    assert task["name"] == "exp"
    params = task["hyperparams"]
    assert params["options"]["epochs"]["value"] == "2" and float(params["hyp"]["lr0"]["value"]) > 0
    assert int(params["model"]["parameters"]["value"]) > 0 and params["env"]["world_size"]["value"] == "1"
    scalars = clearml_scalars(events)
    summary = {key.removeprefix("Summary/"): value for key, value in scalars.pop(min(scalars)).items()}
    assert_metrics_match(scalars, rows, "clearml")
    assert summary == pytest.approx({k: v for k, v in rows[-1].items() if k != "epoch"}, rel=1e-5)  # final metrics
    images = {int(e["iter"]) for e in events if e["type"] == "training_debug_image" and e["metric"] == "Validation"}
    assert images == {0, 1}
    artifacts = {a["key"] for a in task["execution"]["artifacts"]}
    assert {"weights/best.pt", "plots/results.png", "plots/labels.jpg", "plots/confusion_matrix.png"} <= artifacts


@pytest.mark.timeout(900)  # the last test of the module: it kills the module's MLflow server
def test_a_tracker_server_killed_mid_run_gives_one_warning_and_training_completes(
        tracker_env, mlflow_server, tiny_cfg_file, tiny_dataset, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # MLflow's own variables: fail fast, not in minutes
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")

    class KillServer(HookBase):
        def after_epoch(self, trainer: Any, epoch: int, metrics: dict[str, float]) -> None:
            if epoch == 0:
                mlflow_server.kill()

    args = tiny_args(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "2", "--noplots", "--loggers", "mlflow")
    assert train_in_process(args, (KillServer(),)) == 0
    save_dir = tmp_path / "runs" / "exp"
    rows = results_rows(save_dir)
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert (save_dir / "weights" / "best.pt").exists()
    output = capsys.readouterr().out
    warnings = tracker_warnings(output)
    assert len(warnings) == 1 and warnings[0].startswith("WARNING: mlflow: "), output[-3000:]
    assert "training continues" in warnings[0]
