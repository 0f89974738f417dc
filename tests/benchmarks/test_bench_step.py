"""benchmarks.bench_step and bench_model --reference: the step trains the model; bad reference folders are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import bench_model, bench_step
from benchmarks.reference_yolov5 import build_reference


def test_the_timed_step_is_a_real_training_step() -> None:
    step, model = bench_step.build_step("yolov5n", 64, 2, bf16=False)
    before = [p.detach().clone() for p in model.parameters()]
    step()
    moved = sum(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert moved > len(before) // 2  # SGD with momentum moved most tensors
    assert all(p.grad is None for p in model.parameters())  # gradients cleared for the next timed step
    assert model.model[0].conv.weight.is_contiguous(memory_format=torch.channels_last)  # as train.py on the CPU


def test_the_step_of_an_anchor_free_model_uses_its_family_loss() -> None:
    from utils.training.loss_anchor_free import AnchorFreeLoss

    step, model = bench_step.build_step("yolov8n", 64, 2, bf16=False)
    loss = bench_step.family_loss(model, 64)
    assert isinstance(loss, AnchorFreeLoss) and loss.gains == (7.5, 0.5, 1.5)  # hyp.anchor-free.yaml's gains
    before = [p.detach().clone() for p in model.parameters()]
    step()
    assert sum(not torch.equal(a, b) for a, b in zip(before, model.parameters())) > len(before) // 2


def test_a_step_process_times_the_step_of_the_checkout_it_serves() -> None:
    opt = bench_step.parse_opt(["--batch-size", "2", "--threads", "1", "--clock", "cpu"])
    process = bench_step.StepProcess(bench_step.ROOT, opt)
    try:
        first, second = (process.step("yolov5n", 64, "fp32") for _ in range(2))  # the first also builds it
    finally:
        process.close()
    assert 0 < second < 60 and first > 0 and process.proc.returncode == 0


def test_quick_epoch_and_threads_flags() -> None:
    opt = bench_step.parse_opt(["--quick", "--epoch", "--compare-threads"])
    assert (opt.cfg, opt.img, opt.rounds, opt.epoch, opt.compare_threads) == (["yolov5n"], [320], 2, True, True)


def test_reference_folder_must_be_the_unpacked_yolov5_package(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_model.parse_opt(["--reference", str(tmp_path)])
    assert exit_info.value.code == 2
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "yolo.py").write_text("")
    with pytest.raises(ValueError, match="expected the 'yolov5' package directory"):
        build_reference(tmp_path, "yolov5n", {})


def test_epoch_comparison_and_workers_flags(tmp_path: Path) -> None:
    opt = bench_step.parse_opt(["--epoch", "--epoch-rounds", "3", "--compare", str(tmp_path), "--epoch-workers", "0",
                                "1", "2"])
    assert (opt.epoch_rounds, opt.compare, opt.epoch_workers) == (3, tmp_path, [0, 1, 2])
    assert bench_step.paired(bench_step.Stats.of([2.0, 3.0]), bench_step.Stats.of([1.0, 2.0])) == "1.75 [1.50-2.00]"
    assert bench_step.paired(bench_step.Stats.of([2.0]), None) == ""
