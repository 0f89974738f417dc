"""utils.device: --device parsing, the cores of this process, mixed-precision contexts."""

from __future__ import annotations

import os
import re

import pytest
import torch

from utils.device import DeviceError, autocast, available_cores, select_device
from utils.errors import UserError


def test_select_device_cpu_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_device("cpu") == torch.device("cpu")
    assert select_device("") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["0", "0,1", "cuda:0"])
def test_gpu_without_cuda_is_a_user_error(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=f"--device {spec} asks for CUDA but CUDA is not available"):
        select_device(spec)


def test_missing_gpu_and_bad_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(DeviceError, match="GPU 3 does not exist"):
        select_device("0,3")
    assert select_device("0,1", local_rank=1) == torch.device("cuda", 1)
    with pytest.raises(DeviceError, match="is not valid"):
        select_device("gpu0")
    assert issubclass(DeviceError, UserError)


def test_available_cores_follows_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert available_cores() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(), raising=False)
    assert available_cores() == 1


def test_autocast_dtype_per_device() -> None:
    x = torch.ones(2, 2)
    with autocast(torch.device("cpu"), enabled=True):
        assert (x @ x).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), enabled=False):
        assert (x @ x).dtype == torch.float32


def test_mps_selects_the_apple_gpu_where_torch_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)  # as torch answers on Apple silicon
    assert select_device("mps") == torch.device("mps") and select_device(" MPS ") == torch.device("mps")
    assert select_device("") == torch.device("cpu")  # '' stays CUDA-or-CPU: MPS only when asked for
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)  # Linux, Windows, an Intel Mac
    with pytest.raises(DeviceError, match="--device mps asks for an Apple GPU but this torch has no MPS device"):
        select_device("mps")


def test_half_is_for_cuda_only() -> None:
    from utils.device import check_half

    check_half(False, torch.device("cpu"))
    check_half(True, torch.device("cuda", 0))
    with pytest.raises(DeviceError, match=r"--half needs a CUDA device \(this run uses cpu\); drop --half"):
        check_half(True, torch.device("cpu"))


# ------------------------------------------------------------------- how many processes a script starts itself
@pytest.mark.parametrize("device, nproc, launched, gpus, expected", [
    ("0,1", None, False, 2, 2),       # python train.py --device 0,1: one process per listed GPU
    ("0,1,2,3", None, False, 8, 4),
    ("[0, 1]", None, False, 2, 2),
    ("cuda:0,1", 2, False, 2, 2),
    ("0,1", None, True, 2, 1),        # under torchrun or srun the launcher started them: --device keeps its meaning
    ("cpu", 2, False, 0, 2),          # --device cpu --nproc-per-node 2
    ("cpu", 2, True, 0, 1),
    ("", 2, False, 2, 2),             # '' with CUDA: GPUs 0 and 1
    ("", 2, False, 0, 2),             # '' without CUDA: the CPU
    ("", None, False, 4, 1),          # nothing asked for: one process, as before
    ("0", None, False, 2, 1),
    ("cpu", None, False, 0, 1),
    ("x.yaml", None, False, 0, 1),    # not a device: the process refuses it (select_device), with its line
])
def test_processes_to_start(device: str, nproc: int | None, launched: bool, gpus: int, expected: int) -> None:
    from utils.device import processes_to_start

    assert processes_to_start(device, nproc, launched, gpus) == expected


@pytest.mark.parametrize("device, nproc, gpus, message", [
    ("0,1", 3, 4, "--device 0,1 lists 2 GPU(s) but --nproc-per-node is 3"),
    ("0", 2, 4, "--device 0 lists 1 GPU(s) but --nproc-per-node is 2: each process takes one listed GPU; list one"),
    ("", 4, 2, "--nproc-per-node 4 asks for one GPU per process but this machine has 2"),
    ("mps", 2, 0, "--device mps is one Apple GPU"),
    ("cpu", 0, 0, "--nproc-per-node 0: give the number of processes"),
    ("0,1", None, 0, "--device 0,1 asks for CUDA but CUDA is not available here; use --device cpu --nproc-per-node 2"),
    ("0,3", None, 2, "--device 0,3: GPU 3 does not exist (this machine has 2 GPUs)"),
])
def test_process_counts_that_cannot_work_are_one_line(device: str, nproc: int | None, gpus: int, message: str) -> None:
    from utils.device import processes_to_start

    with pytest.raises(DeviceError, match=f"^{re.escape(message)}"):
        processes_to_start(device, nproc, False, gpus)


def test_a_launcher_that_started_fewer_processes_than_gpus_is_said_once() -> None:
    from utils.device import idle_gpus_warning

    line = idle_gpus_warning("0,1", local_world_size=1, local_rank=0)
    assert line.startswith("WARNING: --device 0,1 lists 2 GPUs but the launcher started 1 process(es)")
    assert "GPU 0 trains" in line and "torchrun --nproc_per_node 2" in line
    assert idle_gpus_warning("0,1", 2, 1) is None and idle_gpus_warning("cpu", 1, 0) is None
    assert idle_gpus_warning("0", 1, 0) is None


def test_one_device_scripts_say_which_gpu_of_several_they_use() -> None:
    from utils.device import one_device_warning

    assert one_device_warning("1,2", "detect.py") == \
        "WARNING: --device 1,2: detect.py runs on one device, GPU 1; pass one GPU to choose another"
    assert one_device_warning("0", "detect.py") is None and one_device_warning("cpu", "export.py") is None
