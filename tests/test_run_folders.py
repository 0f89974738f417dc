"""Issue 44's run-folder cases through the scripts: a run never lands on a user's folder (train.py on the command
line and train.run(); test.py and detect.py), and what a run derives from an input's name stays in its folder.
The multi-process case is in tests/test_api_ddp.py, the rules themselves in tests/utils/test_paths.py and
tests/utils/training/test_run_plan.py."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest

import detect
import train
from tests.helpers import load_script, our_tracebacks, run_job, train_args, victim_folder
from utils.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread_and_clean_logger")


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {p.relative_to(folder).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in
            sorted(folder.rglob("*"))}


def test_train_py_name_up_and_over_is_one_line_and_touches_nothing(tiny_dataset: Path, tiny_cfg_file: Path,
                                                                   tmp_path: Path) -> None:
    """``python train.py --name ../victim`` with a project folder not made yet trained into ``victim``, replacing
    its results.csv, opt.yaml, last.pt and best.pt."""
    victim, files = victim_folder(tmp_path)
    before = _tree(victim)
    code, out = run_job([sys.executable, *train_args(tiny_dataset, tiny_cfg_file, tmp_path / "runs" / "train",
                                                     "--name", "../victim", epochs=1)])
    assert code == 2 and "train: error: --name '../victim' holds a path separator" in out, out[-3000:]
    assert our_tracebacks(out) == [] and _tree(victim) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]


@pytest.mark.parametrize("name", ["../victim", "..", "exp\x00"])
def test_train_run_refuses_a_name_that_is_not_one_folder(name: str, tiny_dataset: Path, tiny_cfg_file: Path,
                                                         tmp_path: Path) -> None:
    """train.run(name='../victim') and name='..' (the project's parent) trained there; a NUL byte was a
    traceback."""
    victim, _ = victim_folder(tmp_path)
    before = _tree(victim)
    project = tmp_path / "runs"
    with pytest.raises(UserError, match=r"^--name .* give one folder name, created inside --project$"):
        train.run(data=tiny_dataset, cfg=tiny_cfg_file, img=64, epochs=1, batch_size=8, workers=0, device="cpu",
                  project=project, name=name, noplots=True, noautoanchor=True)
    assert _tree(victim) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]


def test_test_and_detect_refuse_a_name_up_and_over(tiny_dataset: Path, tiny_weights: Path, tmp_path: Path) -> None:
    victim, _ = victim_folder(tmp_path)
    before = _tree(victim)
    image = tmp_path / "images" / "a.jpg"
    image.parent.mkdir()
    cv2.imwrite(str(image), np.full((64, 64, 3), 128, np.uint8))
    test = load_script("test")
    with pytest.raises(UserError, match="^--name '../victim' holds a path separator"):
        test.run(weights=tiny_weights, data=tiny_dataset, img=64, batch_size=4, workers=0, device="cpu",
                 project=tmp_path / "runs", name="../victim", save_txt=True)
    with pytest.raises(UserError, match="^--name '../victim' holds a path separator"):
        detect.run(weights=tiny_weights, source=image, img=64, device="cpu", project=tmp_path / "runs",
                   name="../victim", save_txt=True)
    assert _tree(victim) == before and not (tmp_path / "runs").exists()


def test_visualize_on_an_image_named_dots_writes_only_inside_its_run(tiny_weights: Path, tmp_path: Path) -> None:
    """``detect.py --visualize`` on ``...jpg`` (stem ``..``) wrote its feature maps into the run folder's parent."""
    source = tmp_path / "source"
    source.mkdir()
    cv2.imwrite(str(source / "...jpg"), np.full((64, 64, 3), 128, np.uint8))
    project = tmp_path / "runs"
    result = detect.run(weights=tiny_weights, source=source / "...jpg", img=64, device="cpu", project=project,
                        visualize=True, save_txt=True, save_crop=True)
    assert sorted(p.name for p in project.iterdir()) == ["exp"] and result.save_dir == (project / "exp").resolve()
    maps = sorted(p.name for p in (result.save_dir / "image1").glob("stage*_features.png"))
    assert len(maps) > 10 and "stage0_Conv_features.png" in maps
    assert (result.save_dir / "image1.jpg").is_file()  # the annotated image: nothing of its name is left
    assert sorted(p.name for p in source.iterdir()) == ["...jpg"]


def test_a_failed_start_leaves_no_run_folder(tiny_cfg_file: Path, tmp_path: Path, in_process: Callable[..., int],
                                             tiny_weights: Path) -> None:
    """Issue 42: a failed start (a --data that does not exist) left an empty runs/train/expN."""
    project = tmp_path / "runs"
    assert in_process(train_args(tmp_path / "missing.yaml", tiny_cfg_file, project)) == 2
    assert in_process(train_args(tmp_path / "missing.yaml", tiny_cfg_file, project, "--name", "x")) == 2
    test = load_script("test")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"path: {tmp_path}\ntrain: nothing-here\nval: nothing-here\nnc: 3\n")
    with pytest.raises(UserError):
        test.run(weights=tiny_weights, data=bad, img=64, workers=0, device="cpu", project=project)
    assert not project.exists() or list(project.iterdir()) == []
