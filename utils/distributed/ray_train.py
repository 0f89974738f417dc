"""Ray Train's TorchTrainer as a door into training: ``train.run(..., ray_workers=N)`` and ``train.ray_train_loop``.

Ray starts the workers and makes their process group before our code runs; utils.distributed.comm joins it (no
second ``init_process_group``) and leaves it to Ray to end. Everything else is the code every door runs: rank-0
logging, the start-up agreement check, the watch for a stuck rank, the checkpoints. This module adds what is Ray's:

- ``fit``: the TorchTrainer (on the cluster at ``address``, else a small local one started and stopped here), with
  ``use_gpu``, ``FailureConfig(max_failures)``, the run's storage (a local folder or object storage);
- ``RayReport``: a hook that reports every checkpoint the run writes (its ``last.pt`` with results.csv, opt.yaml
  and hyp.yaml) and every epoch's results.csv row to Ray (``ray.train.report``), so Ray's storage holds them
  without a shared file system;
- ``restore_run``: a worker group that Ray restarted (after a worker or a node was lost) continues from Ray's
  latest checkpoint by itself: rank 0 puts its files back into the run folder (files already there are kept: each
  report follows the write it reports) and every rank resumes from that last.pt, as after a torchrun restart;
- ``report_outcome`` / ``outcome_of``: the final report that carries rank 0's result (or its one-line error) back
  to the caller, as plain JSON.

``ray[train]`` is optional (requirements-dev.txt): it is imported only here, only when used.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from utils.distributed import comm
from utils.errors import UserError
from utils.hooks import HookBase, TrainerView
from utils.paths import ROOT

RUN_RECORD = "yolo_run.json"  # in every checkpoint reported to Ray: the run folder's name under --project
OUTCOME_KEY = "yolo_outcome"  # the final report's metric: rank 0's result or error, as JSON
RUN_FILES = ("weights/last.pt", "weights/last.prev.pt", "results.csv", "opt.yaml", "hyp.yaml")
LOCAL_OBJECT_STORE = 80 * 1024 * 1024  # bytes: a local cluster here moves no data through Ray's object store


class RayError(UserError, RuntimeError):
    """Ray Train is missing, or a Ray option cannot work; one line."""


def ray_modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """(ray, ray.train, ray.train.torch), or a one-line RayError when Ray Train is not installed."""
    try:
        import ray
        import ray.train
        import ray.train.torch
    except ImportError as e:
        raise RayError(f"ray_workers needs Ray Train, which is not installed ({e.name or e}): "
                       "pip install 'ray[train]'") from None
    return ray, ray.train, ray.train.torch


@dataclass(frozen=True)
class RayJob:
    """How a run goes onto Ray: ``workers`` training processes; the cluster at ``address`` ('' = a local one, started
    and stopped by ``fit``); ``use_gpu`` (one GPU per worker); ``storage`` for Ray's checkpoints ('' = Ray's default,
    ~/ray_results; a folder or a URI such as s3://bucket/path); ``max_failures`` restarts of the worker group;
    ``backend`` (auto: Ray's choice, NCCL with GPUs, else gloo) and ``timeout_s`` of the collectives."""

    workers: int
    address: str = ""
    use_gpu: bool | None = False  # None: where the cluster has GPUs
    storage: str = ""
    max_failures: int = 0
    backend: str = "auto"
    timeout_s: float = 1800.0
    cpus_per_worker: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise RayError(f"ray_workers={self.workers!r}: give the number of training workers, 1 or more")
        if not isinstance(self.max_failures, int) or self.max_failures < -1:
            raise RayError(f"ray_max_failures={self.max_failures!r}: give 0 or more restarts (-1: no limit)")


@contextlib.contextmanager
def ray_cluster(job: RayJob) -> Iterator[ModuleType]:
    """Ray connected: as it is when this process already called ``ray.init``; to ``job.address``; else a local
    cluster sized for the job (its CPUs, a small object store, no dashboard), shut down on leaving. The workers
    import the project from its folder (PYTHONPATH)."""
    ray, _, _ = ray_modules()
    if ray.is_initialized():
        yield ray
        return
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    runtime_env = {"env_vars": {"PYTHONPATH": path}}
    if job.address:
        ray.init(address=job.address, runtime_env=runtime_env, log_to_driver=True)
    else:
        ray.init(num_cpus=max(int(job.workers * job.cpus_per_worker + 0.999), 1),
                 num_gpus=0 if job.use_gpu is False else None, include_dashboard=False,
                 object_store_memory=LOCAL_OBJECT_STORE, runtime_env=runtime_env)
    try:
        yield ray
    finally:
        ray.shutdown()


def fit(loop: Callable[[dict], None], loop_config: dict, job: RayJob, name: str = "") -> dict[str, Any]:
    """Run ``loop`` (train.ray_train_loop) on ``job.workers`` Ray Train workers and return rank 0's outcome record
    (``outcome_of``). A worker that crashes ends the run with Ray's error after ``job.max_failures`` restarts."""
    with ray_cluster(job) as ray:
        _, train_api, torch_api = ray_modules()
        if job.use_gpu is None:
            job = replace(job, use_gpu=ray.cluster_resources().get("GPU", 0) > 0)
        trainer = torch_api.TorchTrainer(
            loop, train_loop_config=loop_config,
            torch_config=torch_api.TorchConfig(backend=None if job.backend == "auto" else job.backend,
                                               timeout_s=int(job.timeout_s)),
            scaling_config=train_api.ScalingConfig(num_workers=job.workers, use_gpu=job.use_gpu,
                                                   resources_per_worker={"CPU": job.cpus_per_worker,
                                                                         **({"GPU": 1} if job.use_gpu else {})}),
            run_config=train_api.RunConfig(
                name=name or f"yolo-{uuid.uuid4().hex[:12]}", storage_path=job.storage or None,
                failure_config=train_api.FailureConfig(max_failures=job.max_failures),
                checkpoint_config=train_api.CheckpointConfig(num_to_keep=2),
                logging_config=train_api.LoggingConfig(log_level="WARNING")))  # not a line per report
        result = trainer.fit()
    if not result.metrics or OUTCOME_KEY not in result.metrics:
        raise RayError("Ray Train ended without the run's result (no final report from rank 0)")
    return json.loads(result.metrics[OUTCOME_KEY])


def _ray_train() -> ModuleType:
    return ray_modules()[1]


def worker_device() -> str:
    """This Ray worker's --device: the GPU Ray gave it, else the CPU."""
    ray, _, torch_api = ray_modules()
    if not ray.get_gpu_ids():
        return "cpu"
    return str(torch_api.get_device().index)


class RayReport(HookBase):
    """Reports to Ray every checkpoint the run writes and every epoch's results.csv row (see the module docstring).
    Every rank runs it (Ray's report is a barrier that every worker calls as often); rank 0 hands over the files.
    It runs after the loggers, so an epoch's checkpoint carries that epoch's results.csv row."""

    priority = 90  # after LOGGER_PRIORITY (results.csv), before user hooks

    def __init__(self) -> None:
        self.written = False  # a checkpoint was written since the last report
        self.main = comm.is_main_process()

    def on_checkpoint(self, trainer: TrainerView, epoch: int, samples_seen: int) -> None:
        self.written = True
        if samples_seen:  # mid-epoch (--save-interval-*, a stop): report it now; an epoch's waits for its row
            self.report({"epoch": epoch, "samples_seen": samples_seen}, trainer.save_dir)

    def after_epoch(self, trainer: TrainerView, epoch: int, metrics: dict[str, float]) -> None:
        self.report({"epoch": epoch, **metrics}, trainer.save_dir if self.written else None)

    def report(self, metrics: dict[str, Any], save_dir: Path | None) -> None:
        report_run(metrics, save_dir, attach=self.main and save_dir is not None)
        self.written = False


def report_run(metrics: dict[str, Any], save_dir: Path | None, attach: bool = True) -> None:
    """``ray.train.report(metrics)``, with a checkpoint where ``attach`` (rank 0): the run's files in ``save_dir``
    (hard links where the file system allows; removed once Ray has copied them) and the run's record. Every worker
    must call it as often."""
    train_api = _ray_train()
    if not attach:
        train_api.report(metrics)
        return
    folder = Path(tempfile.mkdtemp(prefix=".ray-report-", dir=save_dir))
    try:
        for name in RUN_FILES if save_dir is not None else ():
            if (Path(save_dir) / name).is_file():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(Path(save_dir) / name, folder / name)
        if save_dir is not None:
            (folder / RUN_RECORD).write_text(json.dumps({"run": Path(save_dir).name}))
        train_api.report(metrics, checkpoint=train_api.Checkpoint.from_directory(str(folder)))
        # Ray registers a checkpoint once it has every worker's report: wait for it, so that a worker lost from now
        # on restarts from this checkpoint (as torchrun's restart finds the last.pt just written)
        train_api.get_all_reported_checkpoints(consistency_mode=train_api.CheckpointConsistencyMode.COMMITTED)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def restore_run(project: str | Path) -> str | None:
    """In a worker group Ray restarted: the last.pt to resume from (the same path on every rank), after rank 0 put
    the files of Ray's latest checkpoint back into ``project``/<the run's folder> (a file already there is kept);
    None in a first attempt. All ranks must call it."""
    def rank0() -> str | None:
        checkpoint = _ray_train().get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as folder:
            run = _run_name(Path(folder) / RUN_RECORD)
            target = Path(project) / run
            for name in RUN_FILES:
                if (Path(folder) / name).is_file() and not (target / name).exists():
                    (target / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(Path(folder) / name, target / name)
        return str((target / "weights" / "last.pt").resolve())

    return comm.main_decides(rank0)


def _run_name(record: Path) -> str:
    """The run folder's name from a checkpoint's record: one plain name, so the folder stays inside --project."""
    try:
        run = json.loads(record.read_text()[:4096])["run"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RayError(f"Ray's checkpoint has no readable {RUN_RECORD}; it was not written by this project") from None
    if not isinstance(run, str) or run in ("", ".", "..") or Path(run).name != run or "\\" in run:
        raise RayError(f"Ray's checkpoint names the run folder {str(run)[:80]!r}: not a plain folder name")
    return run


def report_outcome(value: dict[str, Any] | None, error: BaseException | None, save_dir: Path | None) -> None:
    """The final report: rank 0's result (``value``: plain data) or its one-line error, on a last checkpoint of the
    run's files in ``save_dir`` (when the run got that far): Ray keeps a run's result only with a checkpoint. Every
    worker must call it."""
    record = {"value": value} if error is None else \
        {"error": {"module": type(error).__module__, "class": type(error).__qualname__, "message": str(error)}}
    folder = Path(save_dir) if save_dir is not None and Path(save_dir).is_dir() else None
    report_run({OUTCOME_KEY: json.dumps(record, default=str)}, folder, attach=comm.is_main_process())


def outcome_of(record: dict[str, Any]) -> dict[str, Any]:
    """The value of an outcome record, or its error raised: as its own UserError class when that class is already
    loaded here (nothing is imported for it), else as a RayError with the same message."""
    if "error" not in record:
        return record["value"]
    error = record["error"]
    cls = getattr(sys.modules.get(str(error.get("module"))), str(error.get("class")), None)
    message = str(error.get("message", ""))
    rebuilt: BaseException | None = None
    if isinstance(cls, type) and issubclass(cls, UserError):
        with contextlib.suppress(Exception):
            rebuilt = cls(message)
    raise rebuilt if rebuilt is not None else RayError(message)
