"""utils.dist outside a process group: single-process answers, device and backend errors."""

from __future__ import annotations

import pytest
import torch

from utils import dist
from utils.dist import DistError
from utils.errors import UserError

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain ``python script.py`` environment: none of torchrun's variables."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


def test_single_process_answers(no_launcher: None) -> None:
    assert not dist.is_initialized()
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_local_rank() == 0 and dist.get_local_world_size() == 1
    assert dist.is_main_process() and dist.is_local_main_process()
    assert dist.restart_count() == 0
    assert dist.backend() == "none"


def test_collectives_are_no_ops(no_launcher: None) -> None:
    assert dist.barrier() is None and dist.barrier(long=True) is None
    payload = {"a": [1, 2]}
    assert dist.all_gather_object(payload) == [payload]
    assert dist.broadcast_object(payload) is payload
    t = torch.tensor([1.0, 2.0])
    assert dist.all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    assert dist.all_reduce_mean(t).tolist() == [1.0, 2.0]
    assert dist.any_rank(True) is True and dist.any_rank(False) is False
    dist.check_agreement({"params": 10})
    ran = []
    with dist.zero_first():
        ran.append(1)
    assert ran == [1]
    dist.cleanup()


def test_read_env(monkeypatch: pytest.MonkeyPatch, no_launcher: None) -> None:
    assert dist.read_env().world_size == 1 and not dist.read_env().distributed
    assert dist.read_env(local_rank_flag=3).local_rank == 3  # the legacy --local_rank flag
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    env = dist.read_env()
    assert (env.rank, env.local_rank, env.world_size, env.restart_count) == (2, 0, 4, 1) and env.distributed


def test_init_without_launcher_stays_single_process(no_launcher: None) -> None:
    assert dist.init_distributed("cpu") == torch.device("cpu")
    assert not dist.is_initialized() and dist.get_world_size() == 1


def test_select_device_cpu_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dist.select_device("cpu") == torch.device("cpu")
    assert dist.select_device("") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["0", "0,1", "cuda:0"])
def test_gpu_without_cuda_is_a_user_error(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DistError, match=f"--device {spec} asks for CUDA but CUDA is not available"):
        dist.select_device(spec)


def test_missing_gpu_and_bad_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(DistError, match="GPU 3 does not exist"):
        dist.select_device("0,3")
    assert dist.select_device("0,1", local_rank=1) == torch.device("cuda", 1)
    with pytest.raises(DistError, match="is not valid"):
        dist.select_device("gpu0")
    assert issubclass(DistError, UserError)


def test_backend_choice() -> None:
    cpu = torch.device("cpu")
    assert dist.resolve_backend("auto", cpu) == "gloo"
    assert dist.resolve_backend("GLOO", cpu) == "gloo"
    with pytest.raises(DistError, match="nccl needs CUDA"):
        dist.resolve_backend("nccl", cpu)
    with pytest.raises(DistError, match="not one of auto, nccl, gloo"):
        dist.resolve_backend("mpi", cpu)
