"""utils.device: --device parsing, the cores of this process, mixed-precision contexts."""

from __future__ import annotations

import os

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
