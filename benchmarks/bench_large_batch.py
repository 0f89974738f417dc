"""Accuracy at a large total batch: total batch 16 in one process against total batch 128 over 2 ranks, the same
epochs, with the large-batch rule (--batch-scaling, docs/cluster.md) and without it (the default).

    python benchmarks/bench_large_batch.py                        # yolov5n, 60 epochs of 1024 images at 64 px, 1 class
    python benchmarks/bench_large_batch.py --seed 1
    python benchmarks/bench_large_batch.py --classes 3            # circle, square, triangle
    python benchmarks/bench_large_batch.py --quick                # 2 epochs of 64 images at 64 px: the pipeline

The data set is generated as in benchmarks/bench_recipe.py (shapes at 128-160 px, a quarter as many validation
images, the family's scratch hyperparameters, --optimizer auto); with ``--classes 1`` (the default) every shape is
labelled ``shape``: at 64 px the three shapes' classes are not learned within such runs (the class loss stays flat)
and the class-aware mAP@.5 swings by tenths between epochs. Each variant is one train.py run (``--workers 0``, the
same --seed, validation after every epoch); the 2-rank ones run under ``torch.distributed.run --nproc_per_node 2``
on the CPU (gloo). Printed: each variant's mAP@.5 after the last epoch, its mean over the last 5 epochs, its best,
last.pt's mAP@.5 on square 64-px canvases (``square``: train.py validates at 64 px on 96-px canvases, a third of
them padding, and its figures swing with that; val_maps), the optimizer line train.py logged (where the rule
shows), and the differences to batch 16 (the goal: within 0.02 of mAP@.5). ``--evaluate WEIGHTS --data YAML``
prints both mAP@.5 figures of checkpoints trained elsewhere.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_recipe import make_data  # noqa: E402
from benchmarks.harness import free_port, header  # noqa: E402

VARIANTS = {  # name -> (processes, total batch, extra train.py flags)
    "b16": (1, 16, []),
    "b128-rule": (2, 128, ["--batch-scaling"]),
    "b128-norule": (2, 128, []),
}


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov5n", help="model YAML")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--img", type=int, default=64, help="training and validation image size")
    p.add_argument("--images", type=int, default=1024, help="generated training images (val: a quarter as many)")
    p.add_argument("--classes", type=int, choices=(1, 3), default=1,
                   help="3: circle, square, triangle; 1: every shape labelled shape")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                   help="the runs to make (b16 is the base of the differences when it runs)")
    p.add_argument("--quick", action="store_true", help="2 epochs of 64 images at 64 px: checks the pipeline")
    p.add_argument("--evaluate", nargs="+", type=Path, default=[], metavar="WEIGHTS",
                   help="train nothing: evaluate these checkpoints on --data's val split, both ways (see val_maps)")
    p.add_argument("--data", type=Path, help="the data YAML of --evaluate")
    opt = p.parse_args(argv)
    if opt.quick:
        opt.epochs, opt.images, opt.img = 2, 64, 64
    return opt


def epoch_maps(results_csv: Path) -> list[float]:
    """mAP@.5 after each epoch, from a results.csv."""
    rows = [[c.strip() for c in line.split(",")] for line in results_csv.read_text().strip().splitlines()]
    column = rows[0].index("metrics/mAP_0.5")
    return [float(row[column]) for row in rows[1:]]


def one_class(data: Path) -> Path:
    """The generated set with every label's class 0 under a one-class YAML beside it (``shape``)."""
    import yaml

    from utils.safe_yaml import load_yaml

    config = load_yaml(data)  # the project's bounded reader, as val_maps reads it
    for label in (Path(config["path"]) / "labels").rglob("*.txt"):
        label.write_text("".join(f"0 {line.split(maxsplit=1)[1]}\n" for line in label.read_text().splitlines()))
    single = data.with_name("shapes-one-class.yaml")
    single.write_text(yaml.safe_dump({**config, "nc": 1, "names": ["shape"]}))
    return single


def optimizer_line(log: str) -> str:
    """The optimizer train.py built (``AdamW(lr=0.002021)``) and what the large-batch rule did, from its log."""
    built = re.search(r"(\w+\(lr=[^)]*\)) with parameter groups", log)
    rule = re.search(r"batch \d+ = [^;]*;", log)
    return f"{built.group(1) if built else '?'}; {rule.group(0)[:-1] if rule else 'no rule'}"


def val_maps(weights: Path, data: Path, img: int) -> tuple[float, float]:
    """mAP@.5 of ``weights`` on the val split of ``data``: on the canvases train.py validates on (rect batches, each
    side rounded up from ``img`` + half a stride: 96 px at 64), and on square ``img`` canvases (no padding beyond
    the letterbox's), where a model trained at a small ``img`` is judged at the scale and context it trained at."""
    from utils.data.datasets import DatasetOptions
    from utils.data.loader import create_dataloader
    from utils.evaluation.evaluate import EvalOptions, evaluate
    from utils.safe_yaml import load_yaml
    from utils.weights.checkpoint import load_model

    model, ckpt = load_model(weights, "cpu")
    config = load_yaml(data)
    names = list(config["names"])
    maps = []
    for rect, pad in ((True, 0.5), (False, 0.0)):
        options = DatasetOptions(img_size=img, batch_size=32, stride=32, hyp=ckpt.get("hyp") or {}, rect=rect,
                                 pad=pad, nc=len(names))
        loader, _ = create_dataloader(str(Path(config["path"]) / config["val"]), options, workers=0, shuffle=False)
        maps.append(evaluate(model, loader, "cpu", names, EvalOptions()).named_results()["mAP_0.5"])
    return maps[0], maps[1]


def run_variant(name: str, opt: argparse.Namespace, data: Path, folder: Path) -> tuple[list[float], float, float, str]:
    """One train.py run of the variant: (mAP@.5 after each epoch, mAP@.5 of last.pt on square canvases, seconds, the
    optimizer line)."""
    processes, batch, flags = VARIANTS[name]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())] if processes > 1 else [sys.executable]
    command = [*launcher, str(ROOT / "train.py"), "--cfg", opt.cfg, "--data", str(data), "--epochs", str(opt.epochs),
               "--img", str(opt.img), "--batch-size", str(batch), "--workers", "0", "--seed", str(opt.seed),
               "--device", "cpu", "--noplots", "--loggers", "csv", "--project", str(folder / "runs"),
               "--name", name, *flags]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: train.py failed ({done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}")
    run = folder / "runs" / name
    return (epoch_maps(run / "results.csv"), val_maps(run / "weights" / "last.pt", data, opt.img)[1], seconds,
            optimizer_line(done.stdout + done.stderr))


def main(opt: argparse.Namespace) -> dict[str, tuple[list[float], float, float, str]]:
    if opt.evaluate:
        print(f"{'mAP@.5':>8}{'square':>8}  weights (mAP@.5 on train.py's validation canvases, then on {opt.img} px)")
        for weights in opt.evaluate:
            print("".join(f"{value:>8.4f}" for value in val_maps(weights, opt.data, opt.img)) + f"  {weights}")
        return {}
    print(header(f"bench_large_batch: {opt.cfg}, {opt.epochs} epochs, {opt.images} generated images, {opt.img} px, "
                 f"{opt.classes} class(es), seed {opt.seed}: total batch 16 (1 process) vs 128 (2 ranks)"))
    with tempfile.TemporaryDirectory(prefix="bench_large_batch_") as scratch:
        folder = Path(scratch)
        data = make_data(folder, opt.images)
        data = one_class(data) if opt.classes == 1 else data
        outcomes = {name: run_variant(name, opt, data, folder) for name in opt.variants}
    last = {name: outcome[0][-1] for name, outcome in outcomes.items()}
    base = last.get("b16", 0.0)
    print(f"{'variant':<13}{'mAP@.5':>8}{'- b16':>8}{'last 5':>8}{'best':>7}{'square':>8}{'time (s)':>10}  optimizer")
    for name, (maps, square, seconds, line) in outcomes.items():
        print(f"{name:<13}{maps[-1]:>8.4f}{maps[-1] - base:>+8.4f}{sum(maps[-5:]) / len(maps[-5:]):>8.4f}"
              f"{max(maps):>7.4f}{square:>8.4f}{seconds:>10.1f}  {line}")
    if len(outcomes) == len(VARIANTS):
        rule, norule = last["b128-rule"], last["b128-norule"]
        print(f"the rule's effect at batch 128: mAP@.5 {norule:.4f} -> {rule:.4f} ({rule - norule:+.4f}); "
              f"batch 128 with the rule vs batch 16: {rule - base:+.4f} (goal: within 0.02)")
    return outcomes


if __name__ == "__main__":
    main(parse_opt())
