"""The Kubernetes manifests (deploy/kubernetes/) and what a pod of theirs runs, without a cluster: the manifests parse,
run train.py with flags train.py accepts, mount /dev/shm in memory, give SIGTERM a grace period and read object-storage
credentials from a Secret; two "pods" on loopback, each given what the Kubeflow operator gives its pods (the PET_*
variables torchrun reads, or MASTER_ADDR/RANK/WORLD_SIZE for a pod without torchrun), train one run together, and
after a pod's worker dies, the pods started again (the operator's restart) continue that run from its last.pt."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import ROOT, csv_epochs, finish, free_port, job_env, start, train_args

MANIFESTS = ROOT / "deploy" / "kubernetes"
KINDS = {"pytorchjob.yaml": ["PyTorchJob"], "pytorchjob-elastic.yaml": ["PyTorchJob"], "jobset.yaml": ["JobSet"],
         "runs-volume.yaml": ["PersistentVolumeClaim", "PersistentVolumeClaim"]}


def documents(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((MANIFESTS / name).read_text()))


def pod_specs(node: Any) -> list[dict[str, Any]]:
    """Every pod spec (a mapping with ``containers``) anywhere in a manifest."""
    if isinstance(node, dict):
        own = [node] if "containers" in node else []
        return own + [spec for value in node.values() for spec in pod_specs(value)]
    if isinstance(node, list):
        return [spec for value in node for spec in pod_specs(value)]
    return []


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def test_every_manifest_parses_and_its_pods_run_train_py_as_the_cluster_needs() -> None:
    import train

    assert {p.name for p in MANIFESTS.glob("*.yaml")} == set(KINDS)
    for name, kinds in KINDS.items():
        docs = documents(name)
        assert [d["kind"] for d in docs] == kinds, name
        for spec in pod_specs(docs):
            (container,) = spec["containers"]
            words = [*container["command"], *container["args"]]
            assert words[:2] == ["torchrun", "train.py"], name
            opt = train.parse_opt(words[2:])  # the flags are train.py's
            assert opt.project == "/runs" and opt.batch_size % 32 == 0
            assert spec["terminationGracePeriodSeconds"] >= 60  # a step and last.pt's write after SIGTERM
            shm = {v["name"]: v for v in spec["volumes"]}["dshm"]
            assert shm["emptyDir"]["medium"] == "Memory"
            assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
            assert {"secretRef": {"name": "yolo-object-storage", "optional": True}} in container["envFrom"]
            assert env_of(container)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_the_elastic_job_ranges_over_nodes_with_c10d_and_every_world_size_divides_the_batch() -> None:
    (job,) = documents("pytorchjob-elastic.yaml")
    policy = job["spec"]["elasticPolicy"]
    assert policy["rdzvBackend"] == "c10d" and policy["minReplicas"] < policy["maxReplicas"]
    (spec,) = pod_specs(job)
    batch = next(int(w.split("=")[1]) for w in spec["containers"][0]["args"] if w.startswith("--batch-size="))
    per_node = int(job["spec"]["nprocPerNode"])
    assert all(batch % (nodes * per_node) == 0 for nodes in range(policy["minReplicas"], policy["maxReplicas"] + 1))


def operator_env(rank: int, nodes: int, port: int, torchrun: bool) -> dict[str, str]:
    """What the Kubeflow training operator gives pod ``rank`` of a PyTorchJob (its master service on loopback)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(nodes), "RANK": str(rank),
           "PYTHONUNBUFFERED": "0"}
    if torchrun:
        env.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), PET_NNODES=str(nodes),
                   PET_NPROC_PER_NODE="1", PET_NODE_RANK=str(rank))
    return env


def start_pods(args: list[str], torchrun: bool, manifest_env: dict[str, str]) -> list[tuple[int, str]]:
    """Two pods started together; their (exit code, output)."""
    port = free_port()
    launcher = [sys.executable, "-m", "torch.distributed.run"] if torchrun else [sys.executable]
    pods = [start([*launcher, *args], env=job_env(**manifest_env, **operator_env(rank, 2, port, torchrun)))
            for rank in range(2)]
    return [finish(pod) for pod in pods]


@pytest.mark.ddp
@pytest.mark.slow
def test_two_pods_with_the_operators_torchrun_variables_train_and_continue_after_a_pod_fails(
        tiny_dataset: Path, tiny_cfg_file: Path, tmp_path: Path) -> None:
    """The PyTorchJob's container environment (PET_RDZV_ID, ...) plus the operator's: rank 1's worker is killed in
    epoch 1, both pods fail; started again, they continue the run from the last.pt of epoch 0 in the same folder."""
    (job,) = documents("pytorchjob.yaml")
    manifest_env = env_of(pod_specs(job)[0]["containers"][0])
    fault = f'tests.plugins.faults:FailAt(rank=1, epoch=1, batch=0, action="kill", marker="{tmp_path / "killed"}")'
    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--name", "k8s", "--hook", fault, epochs=2)
    first = start_pods(args, True, manifest_env)
    assert all(code != 0 for code, _ in first), [out[-2000:] for _, out in first]
    assert (tmp_path / "killed").is_file() and csv_epochs(tmp_path / "runs" / "k8s") == ["0"]
    again = start_pods(args, True, manifest_env)
    assert [code for code, _ in again] == [0, 0], [out[-3000:] for _, out in again]
    assert "Resuming from epoch 1 of 2" in again[0][1]
    assert csv_epochs(tmp_path / "runs" / "k8s") == ["0", "1"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")) == ["k8s"]
    assert not list((tmp_path / "runs" / ".jobs").iterdir())  # the finished run forgot its record


@pytest.mark.ddp
@pytest.mark.slow
def test_two_pods_without_torchrun_train_from_master_addr_rank_and_world_size(tiny_dataset: Path, tiny_cfg_file: Path,
                                                                              tmp_path: Path) -> None:
    args = train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs", "--name", "plain", epochs=1)
    pods = start_pods(args, False, {})
    assert [code for code, _ in pods] == [0, 0], [out[-3000:] for _, out in pods]
    assert "batch 4 per rank, 2 ranks" in pods[0][1] and "epochs completed" not in pods[1][1]  # rank 0 talks
    assert csv_epochs(tmp_path / "runs" / "plain") == ["0"]
