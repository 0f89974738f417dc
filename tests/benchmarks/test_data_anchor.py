"""benchmarks/data_anchor.py (bench_data.py --anchor) without ultralytics: our side's pass with its phases, the
settings check, the phase patches, and the tables from given timings."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_data
from benchmarks.data_anchor import (
    PHASES,
    SETTINGS,
    Side,
    check_settings,
    install_phases,
    report,
    time_loader,
    time_pass,
)
from benchmarks.epoch_phases import PhaseClock


def test_flags_of_the_anchor_mode() -> None:
    opt = bench_data.parse_opt(["--anchor", "ultralytics"])
    assert (opt.images, opt.source_px, opt.samples) == (400, [480, 640], 320)
    plain = bench_data.parse_opt([])
    assert (plain.images, plain.source_px, plain.samples, plain.anchor) == (32, [128, 160], 64, None)
    assert bench_data.parse_opt(["--anchor", "ultralytics", "--quick"]).samples == 96
    with pytest.raises(SystemExit):
        bench_data.parse_opt(["--anchor", "ultralytics", "--samples", "20"])  # fewer than 3 batches


def test_our_side_times_a_pass_phase_by_phase(tmp_path: Path) -> None:
    from utils.data.synthetic import ensure_synthetic

    root = ensure_synthetic(tmp_path / "set", n_train=8, n_val=1, img_size=(96, 128), seed=0)
    side = Side("ours", root, 64, 4)
    assert side.settings()["mosaic"] == 1.0 and side.settings()["hsv_s"] == 0.7
    assert side.indices(5, 2)[4] == (side.order[4], (0, 2, 4))  # the shuffled order with the sampler's keys
    clock = PhaseClock()
    install_phases(clock, side.patches)
    result = time_pass(side, 8, 1, clock)
    phases = result["phases"]
    assert set(phases) <= set(PHASES) and {"decode", "mosaic", "HSV", "collate", "other"} <= set(phases)
    assert sum(phases.values()) == pytest.approx(result["cpu"]) and result["cpu"] > 0
    assert 0 < phases["decode"] < result["cpu"]

    boxes: dict = {}  # the loader as train.py's loop runs it on the CPU: each batch handed back to the worker
    for recycle in (True, False):
        (epoch,) = time_loader(side, 8, [1], boxes, recycle)
        assert epoch["batches"] == 2 and epoch["worker_per_batch"] > 0 and epoch["colour_per_batch"] == 0
    assert boxes[True, False]["ring"] is not None and boxes[False, False]["ring"] is None
    assert boxes[True, False]["ring"]._held  # released segments kept mapped for their return
    (epoch,) = time_loader(side, 8, [1], boxes, True, later=True)  # the colour left to the step, timed after
    assert epoch["batches"] == 2 and epoch["colour_per_batch"] > 0 and not side.dataset.colour_later
    later = time_pass(side, 8, 1, clock, later=True)
    assert "HSV" not in later["phases"] and not side.dataset.colour_later  # the worker's part only


def test_the_settings_must_match() -> None:
    same = {k: 0.5 for k in SETTINGS}
    assert check_settings({"ours": same, "ultralytics": same})[0].startswith("augmentation on every side: mosaic")
    with pytest.raises(ValueError, match="hsv_h 0.5 vs 0.015"):
        check_settings({"ours": same, "ultralytics": {**same, "hsv_h": 0.015}})


def test_the_tables_from_given_timings() -> None:
    def side(worker: float, cpu: float, kept: float | None = None) -> dict:
        passes = [{"cpu": cpu, "wall": cpu, "phases": {p: cpu / len(PHASES) for p in PHASES}}] * 3
        loader = [{"worker_per_batch": worker, "main_per_batch": 0.001, "wall": 2.0, "batches": 4,
                   "colour_per_batch": 0.0}] * 3
        return {"pass": passes, "loader": loader, "kept": [{**loader[0], "worker_per_batch": kept}] * 3 if kept
                else [], "later": [{**loader[0], "worker_per_batch": worker / 2, "colour_per_batch": 0.32}] * 3
                if kept else [], "later pass": [{**passes[0], "cpu": cpu / 4}] * 3 if kept else []}

    opt = bench_data.parse_opt(["--anchor", "ultralytics", "--samples", "64", "--batch", "16"])
    lines = report({"ours": side(0.08, 0.32, kept=0.1), "ultralytics": side(0.16, 0.64)}, opt)
    later = [line for line in lines if "colour in the training step (CUDA)" in line]
    assert "400.0 [400.0-400.0]" in later[0] and "4.00 [4.00-4.00]x" in later[0]  # the worker: against theirs
    assert "800.0 [800.0-800.0]" in later[1] and "8.00 [8.00-8.00]x" in later[1]  # one thread
    colour = next(line for line in lines if line.startswith("colour in the training step (torch"))
    assert "20.000" in colour and colour.rstrip().endswith("-")  # 0.32 s a batch of 16; theirs: none
    core = next(line for line in lines if line.startswith("per worker core"))
    assert "200.0 [200.0-200.0]" in core and "100.0 [100.0-100.0]" in core and "2.00 [2.00-2.00]x" in core
    kept = next(line for line in lines if "batches kept" in line)  # ultralytics' one loader figure against it
    assert "160.0 [160.0-160.0]" in kept and "100.0 [100.0-100.0]" in kept and "1.60 [1.60-1.60]x" in kept
    thread = next(line for line in lines if line.startswith("one thread"))
    assert "200.0" in thread and "2.00 [2.00-2.00]x" in thread
    decode = next(line for line in lines if line.startswith("decode"))
    assert f"{1e3 * 0.32 / 64 / len(PHASES):.3f}" in decode
    assert any(line.startswith("transfer: training process receiving") and "0.062" in line for line in lines)
