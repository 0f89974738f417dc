"""The SkyPilot task (deploy/skypilot/train-spot.yaml), checked without SkyPilot or a cloud: it parses, asks for spot
instances with recovery, mounts the run folder from a bucket, and its run step starts torchrun with a fixed job id
and train.py flags that train.py accepts, writing into the mounted folder (what a recovered cluster resumes from)."""

from __future__ import annotations

import shlex

import yaml

import train
from tests.helpers import ROOT

TASK = ROOT / "deploy" / "skypilot" / "train-spot.yaml"


def test_the_spot_task_resumes_from_the_mounted_run_folder() -> None:
    task = yaml.safe_load(TASK.read_text())
    resources = task["resources"]
    assert resources["use_spot"] is True and resources["job_recovery"]["max_restarts_on_errors"] >= 1
    assert task["num_nodes"] >= 2 and task["envs"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    runs = task["file_mounts"]["/runs"]
    assert runs["store"] in ("s3", "gcs", "azure", "r2") and runs["mode"] == "MOUNT_CACHED"
    env = {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "8", "SKYPILOT_NODE_RANK": "0",
           "MASTER_ADDR": "10.0.0.1", **task["envs"]}
    command = task["run"].split("\n", 1)[1].replace("\\\n", " ")
    for name, value in env.items():
        command = command.replace(f'"${name}"', value)
    words = shlex.split(command)
    torchrun = words.index("torchrun")
    script = words.index("train.py")
    launcher = words[torchrun + 1:script]
    assert launcher[launcher.index("--rdzv-id") + 1] == "yolo-train" and "--node_rank" in launcher
    opt = train.parse_opt(words[script + 1:])
    assert (opt.project, opt.name, opt.save_interval_minutes) == ("/runs", "yolo-train", 10.0)
    assert opt.batch_size % 16 == 0  # 2 nodes x 8 GPUs
