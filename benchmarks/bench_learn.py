"""How fast our models learn against ultralytics': each model trained from scratch by our train.py and by ultralytics
on the same generated data set, with the same epochs, image size and batch, in one run; each run's best mAP@.5:.95,
the same weights' mAP@.5:.95 measured by our test.py, its wall time, and the ratios of each pair.

    python benchmarks/bench_learn.py                                # yolo11n pair + our yolov5n, 15 epochs, 160 px
    python benchmarks/bench_learn.py --models yolo11n yolo26n --repeats 3
    python benchmarks/bench_learn.py --quick --ours-only            # 2 epochs of 16 images: our pipeline only
    python benchmarks/bench_learn.py --models yolo11n --ours-only --compare /tmp/before --seeds 0 1 2
                                                                    # this tree against another checkout, 3 seeds
    python benchmarks/bench_learn.py --models yolov5n --ours-only --our-hyp close_mosaic=0 --compare-hyp mosaic_pool=0
                                                                    # mosaic partners: batch pool vs whole set

ultralytics is no dependency of this project: the first run installs it (``pip install ultralytics``) into a virtual
environment of its own (``--venv``, made with ``--system-site-packages`` so that it reuses the installed torch), and
its training process runs offline (``YOLO_OFFLINE``, its settings and font in a scratch folder, and without any
network where ``unshare -n`` works). The data set is generated (utils/data/synthetic.py: shapes on textured
backgrounds at 128-160 px, --images train and a quarter as many val images) into a temporary folder, in the YOLO
layout both read, one identical copy per side (each writes its own label cache beside the labels). Each side uses
its own defaults otherwise (hyperparameters, optimizer rule, workers, threads); every run is one process, timed from
start to exit, each side's Python code already compiled to bytecode (pip compiles ultralytics' as it installs it;
our tree's is compiled beside its sources before its first run, as Python writes it on a checkout's first run). Runs
alternate (ours, theirs, ours, ...), so repeated runs share the machine's load; with --repeats N each figure is the
median of N runs and the ratios are ratios of medians. ``--seeds`` trains each side once per training seed (the data
set stays the one --seed generated); ``--compare DIR`` also trains our models with another checkout's train.py
(before/after a change), on a copy of its own, in turns with this tree's; ``--compare-hyp KEY=VALUE ...`` trains
that "compare" side with each model's family hyp file (the one our side trains with) changed by those entries (with
--compare: that checkout's file, changed); ``--our-hyp KEY=VALUE ...`` changes both our sides' files
(``close_mosaic=0``: mosaic in every epoch of a short run).

Two mAP@.5:.95 figures per run: the best over the epochs as the trainer itself validated them (its results.csv),
and its best.pt validated by our test.py (same metric code, NMS settings, validation images and image size for
both sides; ultralytics' best.pt is read by our ultralytics release reader, without unpickling code).

While a run trains, the CPU seconds of its process tree (the process, its live DataLoader workers and those it has
waited for; Linux /proc) are read each time its results.csv gains an epoch's row. Each pair's last line gives the
CPU seconds each side took to first reach the lower of the two best mAP@.5:.95 (each by its own validation): how
much computing one trainer needs to learn what the other learnt.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import EpochClock, Stats, header, launch_env  # noqa: E402

# our model name -> the ultralytics model YAML trained against it (a model without one is trained by us only)
ULTRALYTICS_MODELS = {"yolov8n": "yolov8n.yaml", "yolo11n": "yolo11n.yaml", "yolo26n": "yolo26n.yaml"}
OUR_MAP = "metrics/mAP_0.5:0.95"
THEIR_MAP = "metrics/mAP50-95(B)"
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "yolo-ddp" / "ultralytics-venv"

# The ultralytics side: one process in its own venv; argv[1] is a JSON of its arguments. Its integrations with
# trackers installed here (MLflow, Comet, ClearML, ...) and its usage reports are switched off in its settings.
THEIR_INTEGRATIONS = ("sync", "clearml", "comet", "dvc", "mlflow", "raytune", "tensorboard", "wandb", "neptune", "hub")
THEIR_TRAIN = f"""
import json, sys
from ultralytics import YOLO
from ultralytics.utils import SETTINGS
SETTINGS.update({{k: False for k in {THEIR_INTEGRATIONS!r} if k in SETTINGS}})
a = json.loads(sys.argv[1])
YOLO(a.pop("model")).train(**a)
"""


@dataclass(frozen=True)
class Run:
    """One training run: the best mAP@.5:.95 its trainer validated, its best.pt's by our test.py, its wall time."""

    model: str
    side: str  # "ours", "compare" (--compare's checkout) or "ultralytics"
    trainer_map: float
    our_map: float
    seconds: float  # wall time, start to exit
    cpu_seconds: float  # CPU time of the process and the children it waited for (its DataLoader workers)
    epoch_maps: tuple[float, ...] = ()  # mAP@.5:.95 of each epoch as its trainer validated it
    epoch_cpu: tuple[float, ...] = ()  # CPU seconds of the process tree when each epoch's row was written


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["yolo11n", "yolov5n"],
                   help=f"our model names; those in {sorted(ULTRALYTICS_MODELS)} are trained by ultralytics too")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--img", type=int, default=160, help="training and validation image size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--images", type=int, default=400, help="generated training images (val: a quarter as many)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each trainer (figures are their medians)")
    p.add_argument("--seed", type=int, default=0, help="the data set's seed, and the training seed without --seeds")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="training seeds: each side trains once per seed (overrides --repeats)")
    p.add_argument("--compare", type=Path, default=None,
                   help="another checkout whose train.py also trains our models, in turns with this tree's")
    p.add_argument("--compare-hyp", nargs="+", default=None, metavar="KEY=VALUE",
                   help="train the compare side (this tree, or --compare's) with these hyp entries changed")
    p.add_argument("--our-hyp", nargs="+", default=None, metavar="KEY=VALUE",
                   help="train our sides (ours and compare) with these hyp entries changed (e.g. close_mosaic=0)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="ultralytics' virtual environment (made once)")
    p.add_argument("--keep", type=Path, default=None,
                   help="a new folder to keep the data and runs in (default: a temporary one, removed)")
    p.add_argument("--ours-only", action="store_true", help="train our models only (no ultralytics)")
    p.add_argument("--our-flags", default="", help="extra flags for our train.py, e.g. '--amp off' (float32)")
    p.add_argument("--quick", action="store_true", help="2 epochs of 16 images at 64 px, batch 8: the pipeline")
    opt = p.parse_args(argv)
    if opt.quick:
        opt.epochs, opt.images, opt.img, opt.batch_size = 2, 16, 64, 8
    if opt.repeats < 1:
        p.error("--repeats must be >= 1")
    if opt.compare is not None and not (opt.compare / "train.py").is_file():
        p.error(f"--compare {opt.compare}: no train.py there")
    opt.seeds = opt.seeds or [opt.seed] * opt.repeats
    opt.our_changes, opt.hyp_changes = ({}, {})
    for flag, entries, changes in (("--our-hyp", opt.our_hyp, opt.our_changes),
                                   ("--compare-hyp", opt.compare_hyp, opt.hyp_changes)):
        for entry in entries or ():
            key, _, value = entry.partition("=")
            try:
                changes[key] = float(value)
            except ValueError:
                p.error(f"{flag} {entry}: expected KEY=NUMBER")
    return opt


def compare_side(opt: argparse.Namespace) -> Path | None:
    """The checkout whose train.py trains the "compare" side: --compare's, this tree with --compare-hyp alone,
    None without either."""
    if opt.compare is not None:
        return opt.compare.resolve()
    return ROOT if opt.hyp_changes else None


def changed_hyp(model: str, data: Path, changes: dict[str, float], tree: Path, folder: Path,
                side: str = "compare") -> Path:
    """A copy of the hyp file ``model``'s family trains with on ``data`` (``tree``'s file of that name) with
    ``changes``, written into ``folder`` for ``side``."""
    import yaml

    from utils.hyp import load_hyp
    from utils.training.builder import Model
    from utils.training.families import get_family

    name = get_family(Model(model).head.family).default_hyp_file(data).name
    hyp = {**load_hyp(tree / "data" / "hyps" / name), **changes}
    path = folder / f"hyp-{model}-{side}.yaml"
    path.write_text(yaml.safe_dump(hyp, sort_keys=False))
    return path


def make_data(folder: Path, images: int, seed: int = 0, sides: tuple[str, ...] = ("ours", "ultralytics")) \
        -> dict[str, Path]:
    """The generated set, one identical copy per side, each under its own data YAML (not named synthetic.yaml, so
    our side trains with its family's default hyperparameters): {side: yaml}."""
    import yaml

    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    source = ensure_synthetic(folder / "generated", n_train=images, n_val=max(images // 4, 4), img_size=(128, 160),
                              seed=seed)
    yamls = {}
    for side in sides:
        root = folder / side
        for split in ("train", "val"):
            for kind in ("images", "labels"):
                shutil.copytree(source / kind / split, root / kind / split)
        yamls[side] = folder / f"shapes-{side}.yaml"
        yamls[side].write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                               "nc": len(SYNTHETIC_NAMES), "names": list(SYNTHETIC_NAMES)}))
    return yamls


def epoch_maps(results_csv: Path, column: str) -> tuple[float, ...]:
    """``column`` of each epoch of a results.csv (ours or ultralytics', spaces stripped)."""
    with open(results_csv, newline="") as f:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    if not rows or column not in rows[0]:
        raise ValueError(f"{results_csv} has no epochs with {column!r}")
    return tuple(float(r[column]) for r in rows)


def best_map(results_csv: Path, column: str) -> float:
    """The best value of ``column`` over the epochs of a results.csv."""
    return max(epoch_maps(results_csv, column))


def our_test_map(weights: Path, data: Path, opt: argparse.Namespace) -> float:
    """mAP@.5:.95 of ``weights`` (ours or ultralytics') on ``data``'s validation images by our test.py (its
    outputs in a ``test`` folder beside the weights' run folder)."""
    import test

    run_folder = weights.parents[1]
    return float(test.run(weights=str(weights), data=str(data), img=opt.img, batch_size=opt.batch_size,
                          device=opt.device, workers=0, project=str(run_folder.parent / "test"),
                          name=run_folder.name).map)


def children_cpu_seconds() -> float:
    """User + system CPU seconds of the children this process has waited for, so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_process(command: list[str], name: str, cwd: Path, env: dict[str, str] | None = None,
                results_csv: Path | None = None) -> tuple[float, float, str, tuple[float, ...]]:
    """Run one training process in ``cwd``: its wall seconds, its CPU seconds (with the children it waited for),
    its output (a failure ends the benchmark with its last lines) and, with ``results_csv``, the CPU seconds of its
    tree when each of that file's rows appeared (a row written as it ended: its whole CPU seconds). Runs are
    sequential, so the CPU time is this run's alone; on a loaded machine it is the fairer of the two figures."""
    cpu, start = children_cpu_seconds(), time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env if env is not None else launch_env())
    clock = EpochClock(proc.pid, results_csv) if results_csv is not None else None
    if clock is not None:
        clock.start()
    out, err = proc.communicate()
    seconds, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu
    if clock is not None:
        clock.done.set()
        clock.join()
        clock.cpu.extend([cpu] * (clock.rows() - len(clock.cpu)))  # rows it had no time to see: the run's total
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{(out + err)[-3000:]}")
    return seconds, cpu, out + err, tuple(clock.cpu) if clock is not None else ()


@functools.cache  # once per tree and benchmark: the tree does not change while it runs
def compile_tree(tree: Path) -> None:
    """``tree``'s bytecode, written beside its sources (``__pycache__``, as Python does on a checkout's first run
    unless PYTHONDONTWRITEBYTECODE is set), so that no timed run compiles our source as it starts: pip compiled
    the baseline's when it installed it."""
    sources = [str(tree / "utils"), str(tree / "models"), *map(str, sorted(tree.glob("*.py")))]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *sources], check=True, capture_output=True)


def run_ours(model: str, opt: argparse.Namespace, data: Path, runs: Path, name: str, seed: int | None = None,
             tree: Path = ROOT, side: str = "ours", hyp: Path | None = None) -> Run:
    """Our train.py (``tree``'s: this checkout's or --compare's) with its defaults for ``model`` and ``seed``
    (default --seed), and ``hyp`` where given; the run folder is ``runs / name``."""
    seed = opt.seed if seed is None else seed
    compile_tree(tree)
    command = [sys.executable, str(tree / "train.py"), "--cfg", model, "--data", str(data), "--epochs",
               str(opt.epochs), "--img", str(opt.img), "--batch-size", str(opt.batch_size), "--seed", str(seed),
               "--device", opt.device, "--noplots", "--loggers", "csv", "--project", str(runs), "--name", name,
               *(["--hyp", str(hyp)] if hyp is not None else []), *shlex.split(opt.our_flags)]
    folder = runs / name
    seconds, cpu, output, epoch_cpu = run_process(command, f"{side} {model}", tree, results_csv=folder / "results.csv")
    amp = re.search(r"^AMP: .*$", output, re.MULTILINE)
    if amp:
        print(f"  {side} train.py: {amp.group(0)}", flush=True)
    maps = epoch_maps(folder / "results.csv", OUR_MAP)
    return Run(model, side, max(maps), our_test_map(folder / "weights" / "best.pt", data, opt), seconds, cpu, maps,
               epoch_cpu)


def ensure_ultralytics(venv: Path) -> Path:
    """The Python of ``venv``, made with ultralytics installed in it when it has none yet."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import ultralytics"], capture_output=True).returncode == 0:
        return python
    print(f"installing ultralytics into {venv} (once)", flush=True)
    for command in ([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                    [python, "-m", "pip", "install", "--quiet", "ultralytics"]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"could not install ultralytics: {' '.join(map(str, command))} failed:\n"
                             f"{done.stderr[-2000:]}")
    return python


def offline_env(config_dir: Path) -> dict[str, str]:
    """ultralytics' environment: offline, no auto-installs, its settings in ``config_dir`` with a font there (so
    that its data check does not fetch one)."""
    config_dir.mkdir(parents=True, exist_ok=True)
    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    for name in ("Arial.ttf", "Arial.Unicode.ttf"):
        if not (config_dir / name).exists():
            shutil.copyfile(font, config_dir / name)
    return launch_env(YOLO_OFFLINE="true", YOLO_AUTOINSTALL="false", YOLO_VERBOSE="false",
                      YOLO_CONFIG_DIR=str(config_dir))


def without_network() -> list[str]:
    """``unshare -n`` (a new network namespace: no network at all) where it works here, else nothing."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


def their_arguments(model: str, opt: argparse.Namespace, data: Path, runs: Path, name: str,
                    seed: int | None = None) -> dict:
    """ultralytics' ``YOLO(model).train(...)`` arguments: the same epochs, image size, batch, seed and device."""
    return {"model": ULTRALYTICS_MODELS[model], "data": str(data), "epochs": opt.epochs, "imgsz": opt.img,
            "batch": opt.batch_size, "seed": opt.seed if seed is None else seed, "device": opt.device,
            "project": str(runs), "name": name,
            "exist_ok": False, "plots": False, "verbose": False}


def run_theirs(model: str, opt: argparse.Namespace, data: dict[str, Path], runs: Path, name: str, python: Path,
               env: dict[str, str], seed: int | None = None) -> Run:
    """ultralytics' trainer with its defaults for ``model`` on its copy of the data; the run folder is
    ``runs / name``; its best.pt is tested on our copy (the same images; each side keeps its own label caches)."""
    command = [*without_network(), str(python), "-c", THEIR_TRAIN,
               json.dumps(their_arguments(model, opt, data["ultralytics"], runs, name, seed))]
    runs.mkdir(parents=True, exist_ok=True)  # its working folder: whatever it writes beside its run stays there
    folder = runs / name
    seconds, cpu, _, epoch_cpu = run_process(command, f"ultralytics {model}", runs, env, folder / "results.csv")
    maps = epoch_maps(folder / "results.csv", THEIR_MAP)
    return Run(model, "ultralytics", max(maps), our_test_map(folder / "weights" / "best.pt", data["ours"], opt),
               seconds, cpu, maps, epoch_cpu)


SIDES = ("ours", "compare", "ultralytics")
TABLE_SIDES = (*SIDES, "yolov5")  # bench_yolov5.py's reference trainer too


def summarise(runs: list[Run]) -> list[str]:
    """The table: per model and side the medians [min-max] of the runs, and per pair (ours / ultralytics, ours /
    compare) the ratios of the medians."""
    lines = [f"{'model':<9}{'trainer':<13}{'runs':>5}{'mAP@.5:.95 (own val)':>24}{'mAP@.5:.95 (our test.py)':>28}"
             f"{'time (s)':>24}{'CPU (s)':>24}"]
    medians: dict[tuple[str, str], tuple[float, float, float, float]] = {}
    for model in dict.fromkeys(r.model for r in runs):
        for side in TABLE_SIDES:
            mine = [r for r in runs if r.model == model and r.side == side]
            if not mine:
                continue
            own, ours_test, seconds, cpu = (Stats.of(getattr(r, k) for r in mine)
                                            for k in ("trainer_map", "our_map", "seconds", "cpu_seconds"))
            medians[model, side] = own.median, ours_test.median, seconds.median, cpu.median
            lines.append(f"{model:<9}{side:<13}{len(mine):>5}{own.fmt(4, 24)}{ours_test.fmt(4, 28)}"
                         f"  {seconds.fmt(1, 22)}  {cpu.fmt(1, 22)}")  # a space even when a value is wider
    for model in dict.fromkeys(r.model for r in runs):
        for other in ("ultralytics", "yolov5", "compare"):
            if (model, "ours") in medians and (model, other) in medians:
                (o_own, o_test, o_s, o_cpu), (t_own, t_test, t_s, t_cpu) = medians[model, "ours"], \
                    medians[model, other]
                lines.append(f"{model} ours / {other}: mAP@.5:.95 {o_own / max(t_own, 1e-9):.2f}x (own val), "
                             f"{o_test / max(t_test, 1e-9):.2f}x (our test.py); time {o_s / t_s:.2f}x, "
                             f"CPU time {o_cpu / max(t_cpu, 1e-9):.2f}x")
                pair = [r for r in runs if r.model == model and r.side in ("ours", other)]
                line = cpu_to_reach(model, other, pair, min(o_own, t_own))
                if line:
                    lines.append(line)
    return lines


def cpu_at(run: Run, target: float) -> float:
    """CPU seconds of ``run``'s tree when its first epoch with mAP@.5:.95 >= ``target`` was written (nan when none
    did, or its epochs were not clocked)."""
    for value, cpu in zip(run.epoch_maps, run.epoch_cpu):
        if value >= target:
            return cpu
    return math.nan


def cpu_to_reach(model: str, other: str, pair: list[Run], target: float) -> str | None:
    """The pair's line of CPU seconds to ``target`` (the lower of the two best medians): each side's median over
    the runs that reached it, and their ratio; None when a side has no clocked run that reached it."""
    sides = ("ours", other)
    runs = {side: [r for r in pair if r.side == side] for side in sides}
    found = {side: [c for c in (cpu_at(r, target) for r in runs[side]) if not math.isnan(c)] for side in sides}
    if not all(found.values()):
        return None
    ours, theirs = Stats.of(found["ours"]), Stats.of(found[other])
    reached = {side: "" if len(found[side]) == len(runs[side]) else f" ({len(found[side])} of {len(runs[side])} "
                                                                      f"runs reached it)" for side in sides}
    return (f"{model} CPU seconds to mAP@.5:.95 {target:.4f} (own val, the lower best): ours {ours.fmt(1)}"
            f"{reached['ours']}, {other} {theirs.fmt(1)}{reached[other]}; "
            f"ours / {other} {ours.median / max(theirs.median, 1e-9):.2f}x")


def main(opt: argparse.Namespace) -> list[Run]:
    seeds = " ".join(map(str, dict.fromkeys(opt.seeds)))
    print(header(f"bench_learn: {' '.join(opt.models)}, {opt.epochs} epochs, {opt.images} generated images, "
                 f"{opt.img} px, batch {opt.batch_size}, data seed {opt.seed}, training seed(s) {seeds}, "
                 f"{len(opt.seeds)} run(s) each", opt.device))
    theirs = [] if opt.ours_only else [m for m in opt.models if m in ULTRALYTICS_MODELS]
    python = ensure_ultralytics(opt.venv) if theirs else None
    if python is not None:
        version = subprocess.run([python, "-c", "import ultralytics; print(ultralytics.__version__)"],
                                 capture_output=True, text=True).stdout.strip()
        print(f"ultralytics {version} in {opt.venv}")
    tree = compare_side(opt)
    if tree is not None:
        changes = ", ".join(f"{k} {v:g}" for k, v in opt.hyp_changes.items()) or "no hyp changed"
        print(f"compare: our models trained by {tree}'s train.py too ({changes})")
    if opt.our_changes:
        print("our sides' hyp: " + ", ".join(f"{k} {v:g}" for k, v in opt.our_changes.items()))
    results: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench_learn_") as scratch:
        folder = Path(scratch) if opt.keep is None else opt.keep
        if opt.keep is not None:
            folder.mkdir(parents=True)  # a new folder: nothing of the user's is overwritten
        data = make_data(folder, opt.images, opt.seed, SIDES if tree is not None else SIDES[::2])
        ours = {m: changed_hyp(m, data["ours"], opt.our_changes, ROOT, folder, "ours")
                for m in opt.models} if opt.our_changes else {}
        changes = {**opt.our_changes, **opt.hyp_changes}
        hyps = {m: changed_hyp(m, data["compare"], changes, tree, folder)
                for m in opt.models} if tree is not None and changes else {}
        env = offline_env(folder / "ultralytics-config") if theirs else None
        for repeat, seed in enumerate(opt.seeds):
            for model in opt.models:
                name = f"{model}-{repeat}"
                results.append(run_ours(model, opt, data["ours"], folder / "ours", name, seed, hyp=ours.get(model)))
                print(f"  seed {seed}: {results[-1]}", flush=True)
                if tree is not None:
                    results.append(run_ours(model, opt, data["compare"], folder / "compare", name, seed, tree,
                                            "compare", hyps.get(model)))
                    print(f"  seed {seed}: {results[-1]}", flush=True)
                if model in theirs:
                    results.append(run_theirs(model, opt, data, folder / "ultralytics", name, python, env, seed))
                    print(f"  seed {seed}: {results[-1]}", flush=True)
    for line in summarise(results):
        print(line)
    return results


if __name__ == "__main__":
    main(parse_opt())
