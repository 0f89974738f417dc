"""How fast a recipe learns: the same model, data, epochs, image size and batch trained with each recipe variant, in
one run; each variant's best mAP@.5 and mAP@.5:.95 (results.csv) and wall time, and their ratios to the first.

    python benchmarks/bench_recipe.py                            # yolov5n: --optimizer SGD vs auto, 15 epochs
    python benchmarks/bench_recipe.py --variants sgd auto auto-close10 --epochs 15
    python benchmarks/bench_recipe.py --quick                     # 2 epochs of 64 images: the pipeline only

The data set is generated (utils/data/synthetic.py: shapes on textured backgrounds, --images train and a quarter as
many val images at 128-160 px) into a temporary folder under its own YAML, so runs use the family's scratch
hyperparameters, not the synthetic set's tuned ones. Each variant is one ``train.py`` process (``--workers 0``,
the same --seed); variants run one after another, so wall times share the machine's load of the moment (the load
average is printed). Variants (train.py flags):

    sgd           --optimizer SGD, close_mosaic: 0    (YOLOv5's former default: SGD, lr0 0.01, mosaic throughout)
    auto          --optimizer auto, close_mosaic: 0   (the optimizer rule of docs/training-recipe.md)
    auto-close10  --optimizer auto, close_mosaic: 10  (and mosaic off for the last 10 epochs: today's default)
    sgd-close10   --optimizer SGD, close_mosaic: 10
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import header  # noqa: E402

VARIANTS: dict[str, tuple[list[str], dict[str, float]]] = {  # name -> (train.py flags, hyp entries changed)
    "sgd": (["--optimizer", "SGD"], {"close_mosaic": 0}),
    "auto": (["--optimizer", "auto"], {"close_mosaic": 0}),
    "auto-close10": (["--optimizer", "auto"], {"close_mosaic": 10}),
    "sgd-close10": (["--optimizer", "SGD"], {"close_mosaic": 10}),
}


@dataclass(frozen=True)
class Outcome:
    """One variant's run: its best metrics over the epochs (results.csv) and its wall time."""

    name: str
    map50: float
    map: float
    seconds: float
    optimizer: str


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov5n", help="model YAML")
    p.add_argument("--variants", nargs="+", default=["sgd", "auto"], choices=list(VARIANTS),
                   help="recipes to compare (the first is the base of the ratios)")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--img", type=int, default=160, help="training and validation image size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--images", type=int, default=512, help="generated training images (val: a quarter as many)")
    p.add_argument("--hyp", default="hyp.scratch.yaml", help="the hyp file the variants start from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="2 epochs of 64 images at 64 px: checks the pipeline")
    opt = p.parse_args(argv)
    if opt.quick:
        opt.epochs, opt.images, opt.img = 2, 64, 64
    return opt


def best_metrics(results_csv: Path) -> tuple[float, float]:
    """The best mAP@.5 and the best mAP@.5:.95 over the epochs of a results.csv."""
    with open(results_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{results_csv} has no epochs")
    return (max(float(r["metrics/mAP_0.5"].strip()) for r in rows),
            max(float(r["metrics/mAP_0.5:0.95"].strip()) for r in rows))


def chosen_optimizer(log: str) -> str:
    """The optimizer line train.py logs (``optimizer: ... AdamW(lr=0.001429) ...``), shortened."""
    line = next((ln for ln in log.splitlines() if "optimizer:" in ln), "")
    text = line.split("optimizer:", 1)[-1].strip()
    return text.split(" with parameter groups")[0][:120]


def make_data(folder: Path, images: int) -> Path:
    """A generated data set under its own YAML (not named synthetic.yaml: the scratch hyps apply)."""
    import yaml

    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    root = ensure_synthetic(folder / "shapes", n_train=images, n_val=max(images // 4, 8), img_size=(128, 160),
                            seed=0)
    data = folder / "shapes.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                    "nc": len(SYNTHETIC_NAMES), "names": list(SYNTHETIC_NAMES)}))
    return data


def run_variant(name: str, opt: argparse.Namespace, data: Path, folder: Path) -> Outcome:
    """One train.py process with the variant's flags (and hyp changes); its best metrics and wall time."""
    from utils.hyp import find_hyp_file
    from utils.safe_yaml import load_yaml

    flags, changes = VARIANTS[name]
    hyp = folder / f"hyp-{name}.yaml"
    hyp.write_text("".join(f"{k}: {v}\n" for k, v in {**load_yaml(find_hyp_file(opt.hyp)), **changes}.items()))
    command = [sys.executable, str(ROOT / "train.py"), "--cfg", opt.cfg, "--data", str(data), "--hyp", str(hyp),
               "--epochs", str(opt.epochs), "--img", str(opt.img), "--batch-size", str(opt.batch_size),
               "--workers", "0", "--seed", str(opt.seed), "--device", opt.device, "--noplots", "--loggers", "csv",
               "--project", str(folder / "runs"), "--name", name, *flags]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: train.py failed ({done.returncode}):\n{done.stderr[-2000:]}")
    map50, map_ = best_metrics(folder / "runs" / name / "results.csv")
    return Outcome(name, map50, map_, seconds, chosen_optimizer(done.stdout + done.stderr))


def main(opt: argparse.Namespace) -> list[Outcome]:
    print(header(f"bench_recipe: {opt.cfg}, {opt.epochs} epochs, {opt.images} generated images, {opt.img} px, "
                 f"batch {opt.batch_size}, seed {opt.seed}", opt.device))
    with tempfile.TemporaryDirectory(prefix="bench_recipe_") as scratch:
        folder = Path(scratch)
        data = make_data(folder, opt.images)
        outcomes = [run_variant(name, opt, data, folder) for name in opt.variants]
    base = outcomes[0]
    print(f"{'variant':<14}{'mAP@.5':>9}{'mAP@.5:.95':>12}{'time (s)':>10}{'x mAP@.5':>10}{'x mAP':>8}"
          f"{'x time':>8}  optimizer")
    for o in outcomes:
        print(f"{o.name:<14}{o.map50:>9.4f}{o.map:>12.4f}{o.seconds:>10.1f}{o.map50 / max(base.map50, 1e-9):>10.2f}"
              f"{o.map / max(base.map, 1e-9):>8.2f}{o.seconds / base.seconds:>8.2f}  {o.optimizer}")
    return outcomes


if __name__ == "__main__":
    main(parse_opt())
