"""The start-up fingerprint: what must agree across ranks, what may differ per machine."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from utils.training.config import RunConfig
from utils.training.fingerprint import code_digest, fingerprint


class _Data:
    def __init__(self, root: str) -> None:
        self.im_files = [f"{root}/images/a.jpg", f"{root}/images/b.jpg"]
        self.labels = [np.ones((1, 5)), np.zeros((0, 5))]

    def __len__(self) -> int:
        return 2


def _opt(**changes: object) -> dict:
    """A run's options (RunConfig.options())."""
    base = {"epochs": 3, "batch_size": 16, "img_size": 64, "data": "/node0/d.yaml", "project": "/node0/runs",
            "workers": 8, "device": "", "seed": 0}
    return RunConfig(**{**base, **changes}).options()


def test_per_machine_options_are_left_out_and_the_rest_compared_one_by_one(tiny_cfg: dict) -> None:
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model(tiny_cfg)
    node0 = fingerprint(model, _opt(), {"lr0": 0.01}, _Data("/node0"))
    node1 = fingerprint(model, _opt(data="/node1/d.yaml", project="/elsewhere", workers=2, device="cpu"),
                        {"lr0": 0.01}, _Data("/mnt/node1"))
    assert node0 == node1  # other paths, workers, device: the same run
    other = fingerprint(model, _opt(epochs=5), {"lr0": 0.01}, _Data("/node0"))
    assert [k for k in node0 if node0[k] != other[k]] == ["--epochs"] and other["--epochs"] == 5
    assert fingerprint(model, _opt(), {"lr0": 0.02}, _Data("/node0"))["hyperparameters"] != node0["hyperparameters"]


def test_code_digest_changes_with_the_code(tmp_path: Path) -> None:
    from utils.paths import ROOT

    for folder in ("models", "utils"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for script in ROOT.glob("*.py"):
        shutil.copy(script, tmp_path / script.name)
    before = code_digest(tmp_path)
    assert before == code_digest(ROOT)
    loss = tmp_path / "utils" / "training" / "loss.py"
    loss.write_text(loss.read_text() + "\n# edited\n")
    assert code_digest(tmp_path) != before


def test_a_path_valued_option_is_compared_by_the_file_content(tiny_cfg: dict, tmp_path: Path) -> None:
    """The default --hyp is an absolute path in the checkout: two machines with checkouts at different paths agree;
    a file with other content differs, and the message's values say so."""
    from models.yolo import Model
    from utils.paths import ROOT

    torch.manual_seed(0)
    model = Model(tiny_cfg)
    here, there = tmp_path / "home" / "alice" / "yolo", tmp_path / "scratch" / "bob" / "yolo"
    for checkout in (here, there):
        (checkout / "data" / "hyps").mkdir(parents=True)
        shutil.copy(ROOT / "data" / "hyps" / "hyp.scratch.yaml", checkout / "data" / "hyps")
    hyp_of = {c: str(c / "data" / "hyps" / "hyp.scratch.yaml") for c in (here, there)}
    node0 = fingerprint(model, _opt(hyp=hyp_of[here], cfg="yolov5n"), {"lr0": 0.01}, _Data("/node0"))
    node1 = fingerprint(model, _opt(hyp=hyp_of[there], cfg="yolov5n"), {"lr0": 0.01}, _Data("/node1"))
    assert node0 == node1 and node0["--hyp"].startswith("file content ") and node0["--cfg"] == "yolov5n"
    Path(hyp_of[there]).write_text(Path(hyp_of[there]).read_text() + "lr0: 0.02\n")
    node1 = fingerprint(model, _opt(hyp=hyp_of[there], cfg="yolov5n"), {"lr0": 0.01}, _Data("/node1"))
    assert [k for k in node0 if node0[k] != node1[k]] == ["--hyp"]


def test_anchors_are_compared_only_for_an_anchor_based_head(tiny_cfg: dict) -> None:
    from models.yolo import Model

    model = Model(tiny_cfg)
    with_anchors = fingerprint(model, _opt(), {"lr0": 0.01}, None)
    model.head.anchors.mul_(2)  # what autoanchor does on one rank
    assert fingerprint(model, _opt(), {"lr0": 0.01}, None)["anchors"] != with_anchors["anchors"]
    model.head.anchor_based = False  # an anchor-free head (the instance says so; the buffer is not its business)
    assert "anchors" not in fingerprint(model, _opt(), {"lr0": 0.01}, None)
