"""Checkpoints: atomic writes, verification that names the damaged file, last/best never both lost, safe loading."""

from __future__ import annotations

import errno
import os
import signal
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from models.yolo import Model
from tests.helpers import finish, start, wait_for
from utils.weights import checkpoint as ckpt_mod
from utils.weights.checkpoint import (
    FORMAT,
    CheckpointError,
    load_checkpoint,
    load_first_good,
    model_from_checkpoint,
    new_checkpoint,
    save_checkpoint,
    save_run_checkpoints,
    verify_checkpoint,
)


class Arbitrary:
    """A class no weights-only load may construct."""

    def __init__(self) -> None:
        self.payload = 42


def small_ckpt(epoch: int = 0) -> dict:
    """A minimal checkpoint of this project's format (no model needed)."""
    return {"format": FORMAT, "version": 1, "model": {"w": torch.arange(256.0)}, "model_yaml": {}, "epoch": epoch}


def flip_tensor_byte(path: Path) -> None:
    """Flip one byte inside the stored tensor data (what a bad disk or a stray write does)."""
    data = bytearray(path.read_bytes())
    offset = data.find(torch.tensor([100.0]).numpy().tobytes())  # the element w[100]
    assert offset > 0
    data[offset + 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_round_trip_with_model(tmp_path: Path, tiny_cfg: dict) -> None:
    model = Model(tiny_cfg)
    path = save_checkpoint(new_checkpoint(model, epoch=3, opt={"epochs": 5, "save_dir": tmp_path}), tmp_path / "a.pt")
    loaded = load_checkpoint(path)
    assert loaded["epoch"] == 3 and loaded["opt"] == {"epochs": 5, "save_dir": str(tmp_path)}
    rebuilt = model_from_checkpoint(loaded)
    for key, value in model.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[key], value.float() if value.is_floating_point() else value), key
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind


def test_a_checkpoint_records_its_family_and_task_and_loads_rebuild_them(tmp_path: Path, tiny_cfg: dict) -> None:
    from utils.weights.checkpoint import CheckpointError, recorded_family

    model = Model(tiny_cfg)
    ckpt = new_checkpoint(model)
    assert (ckpt["family"], ckpt["task"]) == (model.head.family, model.head.task) == ("yolov5", "detect")
    old = {k: v for k, v in ckpt.items() if k not in ("family", "task")}  # written before families were recorded
    assert recorded_family(old) == ("yolov5", "detect")
    assert model_from_checkpoint(load_checkpoint(save_checkpoint(old, tmp_path / "old.pt"))).head.family == "yolov5"
    with pytest.raises(CheckpointError, match="records a yolo11 detect model but its YAML builds a yolov5 detect one"):
        model_from_checkpoint({**ckpt, "family": "yolo11"}, "other.pt")


@pytest.mark.parametrize(("damage", "expected"), [
    ("missing", "not found"),
    ("empty", "empty (0 bytes)"),
    ("truncated", "not a complete PyTorch zip file"),
    ("bitflip", "fails its CRC32 check"),
    ("not_zip", "not a complete PyTorch zip file"),
])
def test_damaged_file_is_named(tmp_path: Path, damage: str, expected: str) -> None:
    path = tmp_path / "last.pt"
    if damage != "missing":
        save_checkpoint(small_ckpt(), path)
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "bitflip":
        flip_tensor_byte(path)
    elif damage == "not_zip":
        path.write_text("model weights\n")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_bitflip_that_torch_load_accepts_is_caught(tmp_path: Path) -> None:
    path = save_checkpoint(small_ckpt(), tmp_path / "last.pt")
    flip_tensor_byte(path)
    silently_wrong = torch.load(path, weights_only=True)["model"]["w"]  # torch alone does not notice
    assert not torch.equal(silently_wrong, torch.arange(256.0))
    with pytest.raises(CheckpointError, match=r"member '.*data/\d+' fails its CRC32"):
        verify_checkpoint(path)


def test_pickled_object_refused_and_trusted_opt_in(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({**small_ckpt(), "extra": Arbitrary()}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "refused" in message and "Arbitrary" in message and "--trust-weights" in message
    assert load_checkpoint(path, trusted=True)["extra"].payload == 42


def test_foreign_checkpoint_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    with pytest.raises(CheckpointError, match="not a checkpoint of this project"):
        load_checkpoint(path)


def test_failed_write_keeps_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_checkpoint(small_ckpt(epoch=1), tmp_path / "last.pt")

    def broken_verify(p: Path) -> None:
        raise CheckpointError(f"{p} is damaged")

    monkeypatch.setattr(ckpt_mod, "verify_checkpoint", broken_verify)
    with pytest.raises(CheckpointError):
        save_checkpoint(small_ckpt(epoch=2), path)
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_full_disk_is_a_clear_error_and_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_checkpoint(small_ckpt(epoch=1), tmp_path / "last.pt")

    def disk_full(obj: object, f: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match=r"cannot write .*last.pt \(No space left on device\); the previous"):
        save_checkpoint(small_ckpt(epoch=2), path)
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 1 and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_last_then_best_never_both_missing(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    save_run_checkpoints(small_ckpt(epoch=0), weights, is_best=True)
    assert load_checkpoint(weights / "best.pt")["epoch"] == 0
    save_run_checkpoints(small_ckpt(epoch=1), weights, is_best=False, period_name="epoch1.pt")
    assert load_checkpoint(weights / "last.pt")["epoch"] == 1
    assert load_checkpoint(weights / "best.pt")["epoch"] == 0  # best is its own file, not overwritten via last
    assert load_checkpoint(weights / "epoch1.pt")["epoch"] == 1
    save_run_checkpoints(small_ckpt(epoch=2), weights, is_best=True)
    assert load_checkpoint(weights / "best.pt")["epoch"] == 2
    assert load_checkpoint(weights / "epoch1.pt")["epoch"] == 1


def test_stale_temp_of_dead_writer_removed(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    dead_pid = 2**22 + 12345  # above the default pid_max, so no such process
    stale, ours = weights / f".last.pt.tmp{dead_pid}", weights / f".last.pt.tmp{os.getpid()}x"
    stale.write_bytes(b"partial")
    ours.write_bytes(b"not a temp of the pattern")
    save_run_checkpoints(small_ckpt(), weights)
    assert not stale.exists() and ours.exists()


def test_load_first_good_falls_back_and_explains(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    weights = tmp_path / "weights"
    save_run_checkpoints(small_ckpt(epoch=4), weights, is_best=True)
    save_run_checkpoints(small_ckpt(epoch=5), weights)
    (weights / "last.pt").write_bytes((weights / "last.pt").read_bytes()[:100])
    path, loaded = load_first_good([weights / "last.pt", weights / "best.pt"])
    assert path.name == "best.pt" and loaded["epoch"] == 4
    (weights / "best.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no usable checkpoint: .*last.pt is damaged.*best.pt is empty"):
        load_first_good([weights / "last.pt", weights / "best.pt"])


def test_verify_rejects_zip_without_pickle(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(CheckpointError, match="without data.pkl"):
        verify_checkpoint(path)


def test_killed_while_writing_keeps_previous_last(tmp_path: Path) -> None:
    weights, ready = tmp_path / "weights", tmp_path / "ready"
    proc = start([sys.executable, "-m", "tests.scripts.slow_checkpoint_writer", str(weights), str(ready)])
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
