"""Training speed against the reference YOLOv5 trainer: yolov5n trained from scratch for 3 epochs by our train.py and
by YOLOv5's own train.py (PyPI ``yolov5==7.0.14``) on the same generated images, in one run, the two taking turns;
each run's wall and CPU seconds, its best mAP@.5:.95, and the ratios of the medians.

    python benchmarks/bench_yolov5.py                          # yolov5n, 3 epochs, 224 px, batch 32, 400 images
    python benchmarks/bench_yolov5.py --repeats 3 --img 320
    python benchmarks/bench_yolov5.py --our-flags "--amp off"  # ours in float32 too

YOLOv5 is no dependency of this project: the first run installs it into a virtual environment of its own
(``--venv``, made with ``--system-site-packages`` so that it reuses the installed torch; the package without its
optional integrations, plus the few packages its training imports). Its training process runs without network
where ``unshare -n`` works, with its settings and font in a scratch folder. The data set is bench_learn.py's
(generated shapes on textured backgrounds at 128-160 px, --images train and a quarter as many val images), one
identical copy per side. Each side uses its own defaults otherwise (hyperparameters, optimizer, workers, threads,
precision); each run is one process, timed from start to exit, its CPU seconds those of the process and the
DataLoader workers it waited for, each side's Python code already compiled to bytecode (pip compiles YOLOv5's as it
installs it; our tree's is compiled beside its sources before its first run, as Python writes it on a checkout's first
run). "time" in the ratio line is ours / YOLOv5's: 0.50x is twice as fast.

mAP@.5:.95 is each trainer's best over its own per-epoch validation (results.csv, the same column name on both
sides), and for ours also its best.pt by our test.py; YOLOv5's best.pt is given to our test.py too, and where our
reader refuses the file (its pickled classes live under the ``yolov5`` package) that figure is left out (nan).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_learn import (  # noqa: E402
    OUR_MAP,
    Run,
    epoch_maps,
    make_data,
    offline_env,
    our_test_map,
    run_ours,
    run_process,
    summarise,
    without_network,
)
from benchmarks.harness import header  # noqa: E402

REFERENCE = "yolov5==7.0.14"
# what its train.py imports beyond this environment's packages (its package is installed without dependencies, so
# that its optional integrations - roboflow, sahi, boto3 uploads - stay out); setuptools for its pkg_resources
REFERENCE_NEEDS = ("seaborn", "thop", "setuptools<80", "huggingface_hub<0.25", "ultralytics")
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "yolo-ddp" / "yolov5-venv"

# The reference side: its train.py run as ``__main__`` in its venv (argv: its flags). Its optional integrations
# (roboflow, sahi: imported at the top of its train.py, used only on request) are empty stand-ins where they are not
# installed; its loggers for trackers installed here (Comet, ClearML, ...) and TensorFlow are kept from importing,
# as in a plain environment; numpy 2 lacks the ``trapz`` its metrics call, so it is given ``trapezoid`` (the same
# function under its new name).
REFERENCE_TRAIN = """
import importlib.abc, importlib.machinery, runpy, sys, types
import numpy
STAND_INS = ("roboflow", "sahi")


def attribute(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] in STAND_INS else None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__, module.__getattr__ = [], attribute
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(StandIns())
for name in ("comet_ml", "clearml", "wandb", "neptune", "dvclive", "mlflow", "tensorflow"):
    sys.modules[name] = None
if not hasattr(numpy, "trapz"):
    numpy.trapz = numpy.trapezoid
sys.argv = ["yolov5.train", *sys.argv[1:]]
runpy.run_module("yolov5.train", run_name="__main__", alter_sys=True)
"""


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="yolov5n", choices=[f"yolov5{s}" for s in "nsmlx"])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--images", type=int, default=400, help="generated training images (val: a quarter as many)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each trainer (figures are their medians)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="YOLOv5's virtual environment (made once)")
    p.add_argument("--keep", type=Path, default=None, help="a new folder to keep the data and runs in")
    p.add_argument("--our-flags", default="", help="more flags for our train.py")
    opt = p.parse_args(argv)
    if opt.repeats < 1 or opt.epochs < 1:
        p.error("--repeats and --epochs must be >= 1")
    return opt


def ensure_reference(venv: Path) -> Path:
    """The Python of ``venv``, with the reference YOLOv5 installed in it when it has none yet."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import yolov5.utils.general"],
                                          capture_output=True).returncode == 0:
        return python
    print(f"installing {REFERENCE} into {venv} (once)", flush=True)
    for command in ([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                    [python, "-m", "pip", "install", "--quiet", "--no-deps", REFERENCE],
                    [python, "-m", "pip", "install", "--quiet", *REFERENCE_NEEDS]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"could not install {REFERENCE}: {' '.join(map(str, command))} failed:\n"
                             f"{done.stderr[-2000:]}")
    return python


def reference_command(python: Path, opt: argparse.Namespace, data: Path, runs: Path, name: str) -> list[str]:
    """YOLOv5's train.py from scratch with its defaults, the same model, epochs, image size, batch, seed, device."""
    return [*without_network(), str(python), "-c", REFERENCE_TRAIN, "--cfg", f"{opt.model}.yaml", "--weights", "",
            "--data", str(data), "--epochs", str(opt.epochs), "--img", str(opt.img), "--batch-size",
            str(opt.batch_size), "--seed", str(opt.seed), "--device", opt.device, "--project", str(runs), "--name",
            name, "--noplots"]


def reference_env(config_dir: Path) -> dict[str, str]:
    """YOLOv5's environment: its settings and fonts in ``config_dir`` (nothing fetched), ultralytics' offline, and
    torch.load unpickling as in the torch it was written for (it reloads only the checkpoints it wrote itself, to
    strip their optimizer, which torch >= 2.6's weights-only default refuses)."""
    env = offline_env(config_dir)
    return {**env, "YOLOV5_CONFIG_DIR": str(config_dir), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


def run_reference(python: Path, opt: argparse.Namespace, data: dict[str, Path], runs: Path, name: str,
                  env: dict[str, str]) -> Run:
    """One reference run on its copy of the data; its best.pt tested by our test.py on ours where our reader
    takes it (nan where it refuses the file)."""
    runs.mkdir(parents=True, exist_ok=True)
    folder = runs / name
    seconds, cpu, _, epoch_cpu = run_process(reference_command(python, opt, data["yolov5"], runs, name), "YOLOv5",
                                             runs, env, folder / "results.csv")
    try:
        tested = our_test_map(folder / "weights" / "best.pt", data["ours"], opt)
    except Exception as e:  # noqa: BLE001 - a figure left out, said why; the timing stands
        print(f"  our test.py did not read YOLOv5's best.pt ({type(e).__name__}: {str(e)[:120]}): nan", flush=True)
        tested = float("nan")
    maps = epoch_maps(folder / "results.csv", OUR_MAP)
    return Run(opt.model, "yolov5", max(maps), tested, seconds, cpu, maps, epoch_cpu)


def main(opt: argparse.Namespace) -> list[Run]:
    print(header(f"bench_yolov5: {opt.model}, {opt.epochs} epochs, {opt.images} generated images, {opt.img} px, "
                 f"batch {opt.batch_size}, seed {opt.seed}, {opt.repeats} run(s) each", opt.device))
    python = ensure_reference(opt.venv)
    print(f"reference: {REFERENCE} in {opt.venv}", flush=True)
    results: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench_yolov5_") as scratch:
        folder = Path(scratch) if opt.keep is None else opt.keep
        if opt.keep is not None:
            folder.mkdir(parents=True)  # a new folder: nothing of the user's is overwritten
        data = make_data(folder, opt.images, opt.seed, ("ours", "yolov5"))
        env = reference_env(folder / "yolov5-config")
        for repeat in range(opt.repeats):
            name = f"{opt.model}-{repeat}"
            results.append(run_ours(opt.model, opt, data["ours"], folder / "ours", name))
            print(f"  {results[-1]}", flush=True)
            results.append(run_reference(python, opt, data, folder / "yolov5", name, env))
            print(f"  {results[-1]}", flush=True)
    for line in summarise(results):
        print(line)
    return results


if __name__ == "__main__":
    main(parse_opt())
