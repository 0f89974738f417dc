"""benchmarks/bench_learn.py without ultralytics: the data set in both layouts, our side's run end to end at a tiny
size, what it reads from either trainer's results.csv, what ultralytics would be asked, and the table."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from benchmarks.bench_learn import (
    OUR_MAP,
    THEIR_MAP,
    Run,
    best_map,
    changed_hyp,
    compare_side,
    make_data,
    offline_env,
    parse_opt,
    run_ours,
    run_process,
    summarise,
    their_arguments,
)
from utils.paths import ROOT
from utils.safe_yaml import load_yaml


def test_the_data_in_both_layouts_and_our_side_end_to_end(tmp_path: Path) -> None:
    data = make_data(tmp_path, 8)
    assert set(data) == {"ours", "ultralytics"}
    copies = [load_yaml(data[side]) for side in ("ours", "ultralytics")]
    assert all(c["names"] == ["circle", "square", "triangle"] and c["nc"] == 3 for c in copies)
    for split, count in (("train", 8), ("val", 4)):
        ours, theirs = (sorted((Path(c["path"]) / "images" / split).glob("*.jpg")) for c in copies)
        assert len(ours) == count and [p.name for p in ours] == [p.name for p in theirs]
        assert all(a.read_bytes() == b.read_bytes() for a, b in zip(ours, theirs))  # identical images
        labels = Path(copies[1]["path"]) / "labels" / split
        assert sorted(p.stem for p in labels.glob("*.txt")) == [p.stem for p in theirs]

    opt = parse_opt(["--epochs", "1", "--img", "64", "--batch-size", "8", "--ours-only", "--our-flags", "--amp off",
                     "--compare-hyp", "mosaic_pool=0"])
    hyp = changed_hyp("yolo11n", data["ours"], opt.hyp_changes, compare_side(opt), tmp_path)
    run = run_ours("yolo11n", opt, data["ours"], tmp_path / "runs", "tiny", hyp=hyp)
    folder = tmp_path / "runs" / "tiny"
    assert (folder / "weights" / "best.pt").is_file()
    assert load_yaml(folder / "opt.yaml")["amp"] == "off"  # --our-flags reached train.py
    assert load_yaml(folder / "hyp.yaml")["mosaic_pool"] == 0  # --compare-hyp's file reached train.py
    assert (tmp_path / "runs" / "test" / "tiny").is_dir()  # our test.py's outputs beside the run, not in runs/
    tag = sys.implementation.cache_tag
    assert all((ROOT / folder / "__pycache__" / f"{name}.{tag}.pyc").is_file() for folder, name in
               ((".", "train"), (".", "test"), ("utils", "device"), ("models", "yolo"), ("utils/training", "loop")))
    assert run.model == "yolo11n" and run.side == "ours" and run.seconds > 0 and run.cpu_seconds > 0
    assert run.trainer_map == best_map(folder / "results.csv", OUR_MAP)
    assert 0.0 <= run.trainer_map <= 1.0 and 0.0 <= run.our_map <= 1.0 and math.isfinite(run.our_map)


def test_the_best_epoch_of_either_results_csv(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs.csv"
    theirs.write_text("epoch,time,metrics/mAP50(B),metrics/mAP50-95(B)\n1,3.0,0.2,0.05\n2,6.0,0.3,0.12\n"
                      "3,9.0,0.35,0.10\n")
    assert best_map(theirs, THEIR_MAP) == 0.12
    ours = tmp_path / "ours.csv"
    ours.write_text("       epoch,  metrics/mAP_0.5, metrics/mAP_0.5:0.95\n 0, 0.1, 0.07\n 1, 0.2, 0.03\n")
    assert best_map(ours, OUR_MAP) == 0.07  # columns padded with spaces are read too
    with pytest.raises(ValueError, match="no epochs"):
        best_map(ours, THEIR_MAP)


def test_ultralytics_is_asked_for_the_same_schedule_offline(tmp_path: Path) -> None:
    opt = parse_opt(["--epochs", "7", "--img", "96", "--batch-size", "4", "--seed", "3"])
    asked = their_arguments("yolo11n", opt, tmp_path / "d.yaml", tmp_path / "runs", "yolo11n-0")
    assert asked["model"] == "yolo11n.yaml" and (asked["epochs"], asked["imgsz"], asked["batch"]) == (7, 96, 4)
    assert asked["seed"] == 3 and asked["project"] == str(tmp_path / "runs") and asked["plots"] is False
    env = offline_env(tmp_path / "config")
    assert env["YOLO_OFFLINE"] == "true" and env["YOLO_CONFIG_DIR"] == str(tmp_path / "config")
    assert (tmp_path / "config" / "Arial.ttf").stat().st_size > 0  # its data check finds a font: nothing fetched
    assert parse_opt([]).models == ["yolo11n", "yolov5n"]


def test_the_table_gives_medians_and_the_ratios_of_each_pair() -> None:
    runs = [Run("yolo11n", "ours", 0.30, 0.28, 100.0, 150.0), Run("yolo11n", "ultralytics", 0.20, 0.21, 300.0, 500.0),
            Run("yolo11n", "ours", 0.40, 0.36, 140.0, 250.0), Run("yolo11n", "ultralytics", 0.30, 0.29, 200.0, 300.0),
            Run("yolov5n", "ours", 0.10, 0.09, 50.0, 60.0)]
    lines = summarise(runs)
    assert lines[1].split()[:3] == ["yolo11n", "ours", "2"] and "120.0 [100.0-140.0]" in lines[1]
    assert "0.3500 [0.3000-0.4000]" in lines[1] and "250.0 [200.0-300.0]" in lines[2]
    assert "200.0 [150.0-250.0]" in lines[1] and "400.0 [300.0-500.0]" in lines[2]  # CPU seconds
    assert lines[3].startswith("yolov5n  ours")
    assert lines[-1] == "yolo11n ours / ultralytics: mAP@.5:.95 1.40x (own val), 1.28x (our test.py); time 0.48x, " \
                        "CPU time 0.50x"
    assert len(lines) == 5  # yolov5n has no pair: no ratio line
    compared = summarise([Run("yolov5n", "ours", 0.30, 0.20, 10.0, 20.0),
                          Run("yolov5n", "compare", 0.20, 0.25, 20.0, 10.0)])
    assert compared[2].split()[:3] == ["yolov5n", "compare", "1"]
    assert compared[-1] == "yolov5n ours / compare: mAP@.5:.95 1.50x (own val), 0.80x (our test.py); time 0.50x, " \
                           "CPU time 2.00x"


def test_compare_hyp_changes_the_family_file_the_run_would_train_with(tmp_path: Path) -> None:
    opt = parse_opt(["--compare-hyp", "mosaic_pool=0", "mixup=0.25", "--seeds", "0", "1"])
    assert opt.hyp_changes == {"mosaic_pool": 0.0, "mixup": 0.25} and opt.seeds == [0, 1]
    assert compare_side(opt) == ROOT and compare_side(parse_opt([])) is None
    for model, family_file in (("yolo11n", "hyp.anchor-free.yaml"), ("yolov5n", "hyp.scratch.yaml")):
        changed = load_yaml(changed_hyp(model, tmp_path / "shapes-compare.yaml", opt.hyp_changes, ROOT, tmp_path))
        base = load_yaml(ROOT / "data" / "hyps" / family_file)
        assert changed == {**base, "mosaic_pool": 0.0, "mixup": 0.25}
    both = parse_opt(["--our-hyp", "close_mosaic=0"])
    assert both.our_changes == {"close_mosaic": 0.0} and both.hyp_changes == {} and compare_side(both) is None
    ours = changed_hyp("yolov5n", tmp_path / "shapes-ours.yaml", both.our_changes, ROOT, tmp_path, "ours")
    assert ours.name == "hyp-yolov5n-ours.yaml" and load_yaml(ours)["close_mosaic"] == 0
    for bad in (["--compare-hyp", "mosaic_pool"], ["--our-hyp", "close_mosaic=all"]):
        with pytest.raises(SystemExit):
            parse_opt(bad)
    with pytest.raises(SystemExit):
        parse_opt(["--compare", str(tmp_path)])  # no train.py there


def test_the_cpu_seconds_to_the_lower_best_map_of_each_pair() -> None:
    runs = [Run("yolo11n", "ours", 0.30, 0.28, 100.0, 150.0, (0.1, 0.26, 0.30), (10.0, 20.0, 30.0)),
            Run("yolo11n", "ultralytics", 0.20, 0.21, 300.0, 500.0, (0.1, 0.2), (50.0, 100.0)),
            Run("yolo11n", "ours", 0.40, 0.36, 140.0, 250.0, (0.2, 0.4), (15.0, 25.0)),
            Run("yolo11n", "ultralytics", 0.30, 0.29, 200.0, 300.0, (0.25, 0.3), (40.0, 80.0))]
    lines = summarise(runs)  # the target is 0.25, ultralytics' median best; its first run never reached it
    assert lines[-1] == "yolo11n CPU seconds to mAP@.5:.95 0.2500 (own val, the lower best): ours 22.5 [20.0-25.0], " \
                        "ultralytics 40.0 [40.0-40.0] (1 of 2 runs reached it); ours / ultralytics 0.56x"
    unclocked = [Run(r.model, r.side, r.trainer_map, r.our_map, r.seconds, r.cpu_seconds) for r in runs]
    assert summarise(unclocked)[-1].startswith("yolo11n ours / ultralytics: mAP")  # no epochs clocked: no line


def test_each_epochs_cpu_seconds_count_the_live_workers_and_those_waited_for(tmp_path: Path) -> None:
    """The tree's CPU seconds when each results.csv row appears: a live child's, then a child waited for."""
    script = f"""
import subprocess, sys, time
from pathlib import Path
csv, marker = Path({str(tmp_path / "results.csv")!r}), Path({str(tmp_path / "busy")!r})
burn = ("import time, pathlib, sys\\nwhile time.process_time() < 0.5: pass\\n"
        "pathlib.Path(sys.argv[1]).touch()\\ntime.sleep(60)")
child = subprocess.Popen([sys.executable, "-c", burn, str(marker)])
while not marker.exists():
    time.sleep(0.05)
csv.write_text("epoch,map\\n0,0.1\\n")  # the child is alive, its 0.5 s of CPU spent
time.sleep(1.0)
child.kill(); child.wait()
marker.unlink()
waited = subprocess.Popen([sys.executable, "-c", burn, str(marker)])
while not marker.exists():
    time.sleep(0.05)
waited.kill(); waited.wait()  # reaped: its CPU is this process's children's now
csv.write_text("epoch,map\\n0,0.1\\n1,0.2\\n")
time.sleep(1.0)
"""
    seconds, cpu, _, epoch_cpu = run_process([sys.executable, "-c", script], "clocked", tmp_path,
                                             results_csv=tmp_path / "results.csv")
    assert len(epoch_cpu) == 2, epoch_cpu
    assert 0.45 <= epoch_cpu[0] and 0.95 <= epoch_cpu[1] <= cpu + 0.05, (epoch_cpu, cpu)  # in clock ticks
