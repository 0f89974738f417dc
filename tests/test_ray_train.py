"""Ray Train as a door: ``train.run(..., ray_workers=2)`` on a local Ray cluster on the CPU (gloo, 2 workers, one
cluster for the module), returning rank 0's metrics with the run's checkpoints in Ray's storage; a worker killed
mid-run restarted by Ray and resumed from Ray's checkpoint with every epoch once in results.csv; a user error in the
workers raised as itself; Ray missing and a foreign checkpoint record refused in one line."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import train
from tests.helpers import ROOT, csv_epochs
from tests.plugins.faults import FailAt, LoseRunFiles
from tests.test_api import results_row, tiny_train
from utils.api import OptionError
from utils.distributed import ray_train
from utils.distributed.comm import DistError

pytestmark = [pytest.mark.ddp, pytest.mark.slow]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One small local Ray cluster for the module: 2 CPUs, no dashboard, a small object store; the workers import
    the project from its folder."""
    import ray

    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, object_store_memory=ray_train.LOCAL_OBJECT_STORE,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}}, log_to_driver=True)
    try:
        yield
    finally:
        ray.shutdown()


def reported(storage: Path) -> list[Path]:
    """The checkpoint folders Ray keeps in ``storage``."""
    return sorted(p.parent for p in storage.glob(f"*/checkpoint_*/{ray_train.RUN_RECORD}"))


def test_two_ray_workers_train_and_return_rank_0s_metrics(local_ray: None, tiny_dataset: Path, tiny_cfg_file: Path,
                                                         tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    result = train.run(ray_workers=2, ray_storage=str(tmp_path / "ray"), **tiny_train(tiny_dataset, tiny_cfg_file,
                                                                                      tmp_path / "runs"))
    output = capfd.readouterr()
    assert "batch 4 per rank, 2 ranks" in output.out + output.err, (output.out + output.err)[-3000:]
    assert result.save_dir == tmp_path / "runs" / "exp" and (result.save_dir / "weights" / "last.pt").is_file()
    row = results_row(result.save_dir)
    assert list(result.metrics) == ["precision", "recall", "mAP_0.5", "mAP_0.5:0.95"]
    assert [result.metrics[k] for k in result.metrics] == pytest.approx(
        [row[f"metrics/{k}"] for k in result.metrics], abs=1e-5)
    assert result.hyp["optimizer"] == "AdamW"
    kept = reported(tmp_path / "ray")  # Ray's storage holds the run's files: the epoch's and the final report
    assert kept and all((k / "weights" / "last.pt").is_file() and (k / "results.csv").is_file() for k in kept)
    assert json.loads((kept[-1] / ray_train.RUN_RECORD).read_text()) == {"run": "exp"}


def test_a_killed_worker_is_restarted_by_ray_and_every_epoch_appears_once(local_ray: None, tiny_dataset: Path,
                                                                          tiny_cfg_file: Path, tmp_path: Path,
                                                                          capfd: pytest.CaptureFixture) -> None:
    """Rank 1 is killed (SIGKILL) before the first batch of epoch 1 of 2, and rank 0's run folder loses its checkpoints
    and results.csv (as on a machine that never had them); Ray restarts the group, which puts back the files of the
    checkpoint of epoch 0 that Ray's storage holds, resumes from it and finishes."""
    killed, lost = tmp_path / "killed", tmp_path / "lost"
    options = {**tiny_train(tiny_dataset, tiny_cfg_file, tmp_path / "runs"), "epochs": 2}
    faults = [LoseRunFiles(str(lost), rank=0, epoch=1), FailAt(rank=1, epoch=1, batch=0, action="kill",
                                                               marker=str(killed))]
    result = train.run(ray_workers=2, ray_storage=str(tmp_path / "ray"), ray_max_failures=1, hooks=faults, **options)
    output = capfd.readouterr()
    assert killed.is_file() and lost.is_file(), "the faults never fired"
    assert "Resuming from epoch 1 of 2" in output.out + output.err, (output.out + output.err)[-4000:]
    assert result.save_dir == tmp_path / "runs" / "exp"
    assert csv_epochs(result.save_dir) == ["0", "1"]
    assert (result.save_dir / "weights" / "last.pt").is_file()


def test_a_user_error_in_the_workers_is_raised_as_itself(local_ray: None, tiny_dataset: Path, tiny_cfg_file: Path,
                                                        tmp_path: Path) -> None:
    options = {**tiny_train(tiny_dataset, tiny_cfg_file, tmp_path / "runs"), "batch_size": 3}
    with pytest.raises(DistError, match=r"^--batch-size 3 must be a positive multiple of the world size 2"):
        train.run(ray_workers=2, ray_storage=str(tmp_path / "ray"), **options)


def test_ray_missing_is_one_line(monkeypatch: pytest.MonkeyPatch, tiny_dataset: Path, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as where it is not installed
    with pytest.raises(ray_train.RayError, match=r"needs Ray Train, which is not installed .*pip install 'ray\["):
        train.run(ray_workers=2, data=tiny_dataset, project=tmp_path, device="cpu")
    with pytest.raises(ray_train.RayError, match="ray_workers=0.5"):
        ray_train.RayJob(workers=0.5)
    with pytest.raises(ray_train.RayError, match="--device 'mps' with ray_workers"):
        train.run(ray_workers=2, data=tiny_dataset, project=tmp_path, device="mps")
    with pytest.raises(OptionError, match="nproc_per_node or ray_workers, not both"):
        train.run(ray_workers=2, nproc_per_node=2, data=tiny_dataset, project=tmp_path)


@pytest.mark.parametrize("record", ['{"run": "../elsewhere"}', '{"run": "/etc"}', '{"run": 3}', "not json"])
def test_a_checkpoint_record_naming_a_folder_outside_the_project_is_refused(tmp_path: Path, record: str) -> None:
    (tmp_path / ray_train.RUN_RECORD).write_text(record)
    with pytest.raises(ray_train.RayError):
        ray_train._run_name(tmp_path / ray_train.RUN_RECORD)


def test_an_outcome_record_raises_its_own_user_error_class_and_nothing_else() -> None:
    error = {"module": "utils.distributed.launcher", "class": "DistError", "message": "no"}
    with pytest.raises(DistError, match="^no$"):
        ray_train.outcome_of({"error": error})
    with pytest.raises(ray_train.RayError, match="^boom$"):  # not a UserError: its class is not rebuilt
        ray_train.outcome_of({"error": {"module": "builtins", "class": "SystemExit", "message": "boom"}})
    assert ray_train.outcome_of({"value": {"a": 1}}) == {"a": 1}
