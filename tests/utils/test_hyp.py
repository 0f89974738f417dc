"""Hyperparameter files: one loader for training and augmentation, found by path or by name in data/hyps."""

from __future__ import annotations

from pathlib import Path

import pytest

from utils.hyp import HYPS_DIR, REQUIRED, HypError, default_hyp_file, load_hyp


def test_shipped_files_load_by_name_and_by_path() -> None:
    scratch = load_hyp()
    assert scratch["lr0"] == 0.01 and scratch["mosaic"] == 1.0 and scratch["anchor_t"] == 4.0
    finetune = load_hyp("hyp.finetune.yaml")  # found in data/hyps by its name alone
    assert finetune == load_hyp(HYPS_DIR / "hyp.finetune.yaml") and finetune["lr0"] < scratch["lr0"]
    assert all(isinstance(v, float) for v in scratch.values())


def test_optimizer_entry_is_text_and_everything_else_a_number(tmp_path: Path) -> None:
    base = "\n".join(f"{k}: 1" for k in REQUIRED)
    (tmp_path / "adam.yaml").write_text(base + "\noptimizer: Adam\n")
    assert load_hyp(tmp_path / "adam.yaml")["optimizer"] == "Adam"
    (tmp_path / "bad.yaml").write_text(base + "\nmosaic: lots\n")
    with pytest.raises(HypError, match="'mosaic' must be a number"):
        load_hyp(tmp_path / "bad.yaml")


def test_missing_keys_file_and_syntax_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "short.yaml").write_text("lr0: 0.01\n")
    with pytest.raises(HypError, match="lacks lrf, momentum"):
        load_hyp(tmp_path / "short.yaml")
    with pytest.raises(HypError, match="not found"):
        load_hyp(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("lr0: [\n")
    with pytest.raises(HypError, match="not valid YAML"):
        load_hyp(tmp_path / "broken.yaml")
    with pytest.raises(HypError, match="lacks"):
        load_hyp({"lr0": 0.1})


def test_default_file_depends_on_the_data() -> None:
    assert default_hyp_file("data/synthetic.yaml").name == "hyp.synthetic.yaml"
    assert default_hyp_file("coco128.yaml").name == "hyp.scratch.yaml"


def test_hyp_set_items_override_the_file() -> None:
    from utils.hyp import override_hyp

    hyp = load_hyp(HYPS_DIR / "hyp.scratch.yaml")
    changed = override_hyp(hyp, ["lr0=0.002", "fliplr=0", "copy_paste=0.5", "optimizer=SGD"])
    assert (changed["lr0"], changed["fliplr"], changed["copy_paste"], changed["optimizer"]) == (0.002, 0.0, 0.5, "SGD")
    assert hyp["lr0"] == 0.01 and override_hyp(hyp, []) == hyp  # the original is left alone
    with pytest.raises(HypError, match=r"^--hyp-set 'lr=0.1': 'lr' is not a hyperparameter of this run; did you mean"):
        override_hyp(hyp, ["lr=0.1"])
    with pytest.raises(HypError, match=r"^--hyp-set 'lr0': give KEY=VALUE"):
        override_hyp(hyp, ["lr0"])
    with pytest.raises(HypError, match=r"^--hyp-set 'lr0=fast': 'lr0' takes a number"):
        override_hyp(hyp, ["lr0=fast"])
