"""``bench_data.py --anchor ultralytics``: our training data pipeline against ultralytics' on the same images, side
by side in one run, per worker core and phase by phase.

Each side runs in a process of its own (ours with this interpreter, ultralytics' in the virtual environment that
bench_learn.py makes, with the same torch and OpenCV), on its own identical copy of the generated COCO-like JPEGs,
with its default training augmentation (the same values on both sides: mosaic 1.0, translate 0.1, scale 0.5, no
rotation, shear or perspective, HSV gains 0.015 / 0.7 / 0.4, left-right flips 0.5, no mixup; checked before timing),
at the same image size, batches of --batch collated by each side's own collate function, the same shuffled order.

Two measurements, the sides taking turns (ABBA) in every repeat:
- one thread, in the process: ``--samples`` samples built and collated; a timer of the thread's CPU time wraps the
  functions of each phase (decode, resize, mosaic, perspective, HSV, flips, to-tensor, collate; a phase inside
  another counted once, as the inner one);
- a torch DataLoader with one persistent worker: the worker's CPU seconds per image (its process time read at each
  collated batch: building, collating and handing the batch to the queue: images/s per worker core), and the
  training process's CPU seconds to receive the batches (the transfer's other half). Each side's worker (and the
  process of the one-thread figure) is set up as its own trainer sets one up (ours:
  utils.data.loader.setup_worker_process; ultralytics': OpenCV on one thread), and our batches are handed back to
  the worker once received, as train.py does (on the CPU after its float copy, for CUDA after the copy into pinned
  memory: utils.data.batch_memory); the row "batches kept" times our worker without the hand-back (a loader that
  someone iterates without pinned memory outside train.py); the row "colour in the training step" times our worker
  leaving the HSV change to the training step, as train.py does on CUDA (``--colour-on``); the benchmark's process
  applies it to one batch with torch on this CPU after each epoch, timed apart (on a GPU it is the GPU's work,
  which gpu_throughput.py times).
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_data import fetch_batch, init_worker  # noqa: E402 (this tree's, before a --tree)
from benchmarks.epoch_phases import PhaseClock  # noqa: E402

PHASES = ("decode", "resize", "mosaic", "perspective", "HSV", "flips", "to tensor", "collate", "other")
# augmentation settings compared before timing: our hyp key -> ultralytics' cfg key (their defaults, our scratch hyps)
SETTINGS = {"mosaic": "mosaic", "translate": "translate", "scale": "scale", "degrees": "degrees", "shear": "shear",
            "perspective": "perspective", "hsv_h": "hsv_h", "hsv_s": "hsv_s", "hsv_v": "hsv_v",
            "fliplr": "fliplr", "flipud": "flipud", "mixup": "mixup"}
OUR_PATCHES = (("utils.data.datasets", "read_image", "decode"), ("cv2", "resize", "resize"),
               ("utils.data.datasets", "warp_mosaic", "mosaic"),
               ("utils.data.datasets", "warp_mosaic_extras", "mosaic"), ("utils.data.augment", "apply_hsv", "HSV"),
               ("utils.data.datasets", "apply_hsv", "HSV"), ("utils.data.datasets", "flip_lr", "flips"),
               ("utils.data.datasets", "flip_ud", "flips"), ("utils.data.datasets", "bgr_to_chw_rgb", "to tensor"),
               ("utils.data.datasets", "YoloDataset.collate_fn", "collate"))
THEIR_PATCHES = (("ultralytics.data.base", "imread", "decode"), ("cv2", "resize", "resize"),
                 ("ultralytics.data.augment", "Mosaic.__call__", "mosaic"),
                 ("ultralytics.data.augment", "RandomPerspective.__call__", "perspective"),
                 ("ultralytics.data.augment", "RandomHSV.__call__", "HSV"),
                 ("ultralytics.data.augment", "RandomFlip.__call__", "flips"),
                 ("ultralytics.data.augment", "Format.__call__", "to tensor"),
                 ("ultralytics.data.dataset", "YOLODataset.collate_fn", "collate"))


# ------------------------------------------------------------------------------------------- one side's process
class Side:
    """One pipeline in this process: its data set, how it builds a sample and collates, its phase patches."""

    def __init__(self, name: str, data: Path, img: int, batch: int) -> None:
        import numpy as np

        self.name, self.batch = name, batch
        self.dataset, self.keys, self.patches = (_theirs if name == "ultralytics" else _ours)(data, img, batch)
        # each side's workers set up as its own loader sets them up (ultralytics': OpenCV on one thread, at import)
        self.worker_init = _their_worker if name == "ultralytics" else init_worker
        self.new_ring = None if name == "ultralytics" else _our_ring()  # train.py hands our batches back
        self.order = [int(i) for i in np.random.default_rng(0).permutation(len(self.dataset))]

    def indices(self, samples: int, epoch: int) -> list:
        """The epoch's shuffled sample keys (the same order on both sides)."""
        return [self.keys(self.order[i % len(self.order)], epoch, i) for i in range(samples)]

    def settings(self) -> dict[str, float]:
        return self.dataset.bench_settings


def _ours(data: Path, img: int, batch: int) -> tuple[Any, Callable, tuple]:
    from utils.data.datasets import YoloDataset
    from utils.hyp import load_hyp

    dataset = YoloDataset(data / "images" / "train", img_size=img, batch_size=batch, augment=True, hyp=load_hyp(),
                          nc=3, seed=0)
    dataset.bench_settings = {key: float(dataset.hyp.get(key, 0.0)) for key in SETTINGS}
    return dataset, lambda i, epoch, position: (i, (0, epoch, position)), OUR_PATCHES


def _theirs(data: Path, img: int, batch: int) -> tuple[Any, Callable, tuple]:
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG

    random.seed(0)
    cfg = get_cfg(DEFAULT_CFG, {"imgsz": img})
    names = {0: "circle", 1: "square", 2: "triangle"}
    dataset = build_yolo_dataset(cfg, str(data / "images" / "train"), batch, {"names": names, "nc": 3, "channels": 3},
                                 mode="train")
    dataset.bench_settings = {ours: float(getattr(cfg, theirs)) for ours, theirs in SETTINGS.items()}
    return dataset, lambda i, epoch, position: i, THEIR_PATCHES


def _our_ring() -> Callable | None:
    """How train.py's loader makes the ring its workers write batches into again (None: a tree before it)."""
    try:
        from utils.data.batch_memory import BatchRing
        from utils.data.loader import PREFETCH, RING_SPARE
    except ImportError:
        return None
    return lambda: BatchRing(1, PREFETCH + RING_SPARE)


def _their_worker(_: int) -> None:
    __import__("cv2").setNumThreads(0)


def install_phases(clock: Any, patches: tuple) -> None:
    """Wrap each (module, attribute path, phase) with ``clock``'s timer where it is looked up; names a checkout does
    not have (an older or newer one) are skipped."""
    import importlib

    for module_name, path, phase in patches:
        owner = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        if not hasattr(owner, name):
            continue
        raw = owner.__dict__.get(name) if isinstance(owner, type) else None
        timed = clock.wrap(getattr(owner, name), phase)
        setattr(owner, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)


def time_pass(side: Side, samples: int, epoch: int, clock: Any, later: bool = False) -> dict:
    """Build and collate ``samples`` samples on this thread: CPU seconds in all and by phase (``later``: the colour
    change left to the training step, ours)."""
    keys = side.indices(samples, epoch)
    side.dataset.colour_later = later
    clock.seconds.clear()
    start_cpu, start = time.thread_time(), time.perf_counter()
    fetch = fetch_batch(side.dataset)
    for i in range(0, samples, side.batch):
        side.dataset.collate_fn(fetch(keys[i:i + side.batch]))
    cpu = time.thread_time() - start_cpu
    side.dataset.colour_later = False
    phases = dict(clock.seconds)
    phases["other"] = cpu - sum(phases.values())
    return {"cpu": cpu, "wall": time.perf_counter() - start, "phases": phases}


class _StampedCollate:
    """The side's collate, returning the batch with the worker's CPU seconds so far (process time, all threads)."""

    def __init__(self, collate: Callable) -> None:
        self.collate = collate

    def __call__(self, batch: list) -> tuple[Any, float]:
        return self.collate(batch), time.process_time()


def time_loader(side: Side, samples: int, epochs: list[int], boxes: dict, recycle: bool = True,
                later: bool = False) -> list[dict]:
    """Epochs through a DataLoader with one persistent worker: per epoch the worker's CPU seconds per batch (from
    its first to its last batch), the receiving process's CPU seconds, and the wall seconds. ``later``: the colour
    change left to the training step (ours, as on CUDA), which this process then applies on the CPU, timed apart."""
    import torch

    class Keys(torch.utils.data.Sampler):
        def __init__(self) -> None:
            self.epoch = 0

        def __iter__(self):  # noqa: ANN204
            return iter(side.indices(samples, self.epoch))

        def __len__(self) -> int:
            return samples

    loader_box = boxes.setdefault((recycle, later), {})
    if "loader" not in loader_box:
        ring = loader_box["ring"] = side.new_ring() if side.new_ring and recycle else None
        if side.new_ring:
            side.dataset.ring = ring  # what the worker (forked at the first batch) writes into
        side.dataset.colour_later = later  # likewise (the in-process passes keep the loader's colour change)
        sampler = Keys()
        loader = torch.utils.data.DataLoader(side.dataset, batch_size=side.batch, sampler=sampler, num_workers=1,
                                             collate_fn=_StampedCollate(side.dataset.collate_fn),
                                             worker_init_fn=side.worker_init, persistent_workers=True)
        loader_box.update(loader=loader, sampler=sampler)
        for b, (batch, _) in enumerate(loader):  # the worker's start-up and first batches, untimed
            _hand_back(loader_box, batch)
            if b == 2:
                break
        side.dataset.colour_later = False
    results = []
    for epoch in epochs:
        loader_box["sampler"].epoch = epoch
        stamps, main_cpu, start, kept = [], time.thread_time(), time.perf_counter(), None
        for batch, stamp in loader_box["loader"]:
            stamps.append(stamp)
            if later and kept is None:  # its colour change timed after the epoch, not beside the worker
                kept = (batch[0].clone(), batch[4]["colour"])
            _hand_back(loader_box, batch)
        wall, main = time.perf_counter() - start, time.thread_time() - main_cpu
        results.append({"worker_per_batch": (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1),
                        "main_per_batch": main / len(stamps), "wall": wall, "batches": len(stamps),
                        "colour_per_batch": _colour_in_step(*kept) if later else 0.0})
    return results


def _colour_in_step(images: Any, gains: Any) -> float:
    """What train.py's step does first with a batch whose colour change was left to it, on this CPU: its CPU
    seconds (torch on this process's thread)."""
    from utils.data.colour import recolour

    start = time.thread_time()
    recolour(images, gains)
    return time.thread_time() - start


def _hand_back(loader_box: dict, batch: Any) -> None:
    """What train.py's loop does with our batches once it has its float copy: release them to the worker."""
    if loader_box.get("ring") is not None:
        loader_box["ring"].release(batch[0])


def serve(name: str, data: str, img: int, batch: int) -> None:
    """One side's process: build its pipeline, then answer timing requests (one JSON line each) on stdin."""
    import cv2
    import torch

    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    if name != "ultralytics":  # our samples are made in a process set up as our workers are (OpenCV, heap)
        init_worker(0)
    side = Side(name, Path(data), img, batch)
    clock = PhaseClock()
    install_phases(clock, side.patches)
    loader_box: dict = {}
    print(json.dumps({"ready": True, "seconds": side.settings()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["kind"] == "pass":
            answer = time_pass(side, request["samples"], request["epoch"], clock, request.get("later", False))
        else:
            answer = time_loader(side, request["samples"], request["epochs"], loader_box, request["recycle"],
                                 request.get("later", False))
        print(json.dumps({"seconds": answer}), flush=True)


# ------------------------------------------------------------------------------------------------ the parent
def make_sides(folder: Path, images: int, source_px: tuple[int, int], names: list[str]) -> dict[str, Path]:
    """The generated COCO-like set (JPEGs of ``source_px`` sides, 3 classes), one identical copy per side."""
    from utils.data.synthetic import ensure_synthetic

    source = ensure_synthetic(folder / "generated", n_train=images, n_val=1, img_size=source_px, seed=0)
    roots = {}
    for side in names:
        roots[side] = folder / side
        for kind in ("images", "labels"):
            shutil.copytree(source / kind / "train", roots[side] / kind / "train")
    return roots


class AnchorServe:
    """A side's serve process (``tree``: the checkout whose pipeline "ours" times); its ready line carries its
    augmentation settings."""

    def __init__(self, name: str, root: Path, opt: Any, python: Path, env: dict[str, str] | None,
                 tree: Path = ROOT) -> None:
        import subprocess

        command = [str(python), str(Path(__file__).resolve()), "--serve", name, str(root), "--img", str(opt.img),
                   "--batch", str(opt.batch), "--tree", str(tree)]
        self.name = name
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env=env)
        self.settings = self._read()

    def ask(self, **request: Any) -> Any:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> Any:
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)["seconds"]
        raise RuntimeError(f"the {self.name} pipeline's process ended (exit code {self.proc.wait()})")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def check_settings(settings: dict[str, dict[str, float]]) -> list[str]:
    """The augmentation settings of every side against ultralytics'; ValueError when a value differs."""
    theirs = settings["ultralytics"]
    for name, ours in settings.items():
        differ = [k for k in SETTINGS if abs(ours[k] - theirs[k]) > 1e-9]
        if differ:
            raise ValueError(f"the pipelines' augmentation settings differ ({name} vs ultralytics): " +
                             ", ".join(f"{k} {ours[k]} vs {theirs[k]}" for k in differ))
    return [f"augmentation on every side: {', '.join(f'{k} {theirs[k]:g}' for k in SETTINGS)}"]


def measure(sides: dict[str, AnchorServe], opt: Any) -> dict[str, dict[str, list]]:
    """Every repeat: a pass and a DataLoader epoch per side, in ABBA order; a warm-up pass each first."""
    results: dict[str, dict[str, list]] = {name: {"pass": [], "loader": [], "kept": [], "later": [], "later pass": []}
                                           for name in sides}
    for side in sides.values():
        side.ask(kind="pass", samples=opt.samples, epoch=0)
    names = list(sides)
    for r in range(opt.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            results[name]["pass"].append(sides[name].ask(kind="pass", samples=opt.samples, epoch=r + 1))
            results[name]["loader"] += sides[name].ask(kind="loader", samples=opt.samples, epochs=[r + 1],
                                                       recycle=True)
            if name != "ultralytics":  # ours without the hand-back: a loader iterated outside train.py
                results[name]["kept"] += sides[name].ask(kind="loader", samples=opt.samples, epochs=[r + 1],
                                                         recycle=False)
            if name == "ours":  # the colour change left to the training step, as train.py does on CUDA
                results[name]["later"] += sides[name].ask(kind="loader", samples=opt.samples, epochs=[r + 1],
                                                          recycle=True, later=True)
                results[name]["later pass"].append(sides[name].ask(kind="pass", samples=opt.samples, epoch=r + 1,
                                                                   later=True))
    return results


def _row(label: str, cells: list[str]) -> str:
    return f"{label:<44}" + "".join(f"{c:>24}" for c in cells)


def report(results: dict[str, dict[str, list]], opt: Any) -> list[str]:
    """The tables: images/s per worker core and per thread with each side's ratio to ultralytics (the median of the
    paired repeats' ratios), the loader's wall rate, and each phase's CPU ms per image."""
    from benchmarks.harness import Stats

    names = list(results)
    ours = [n for n in names if n != "ultralytics"]
    lines = [_row("images/s", names + [f"{n} / ultralytics" for n in ours])]
    for label, figure, kind in (("per worker core (DataLoader, 1 worker, CPU)", "worker_per_batch", "loader"),
                                ("  the same, batches kept (not handed back)", "worker_per_batch", "kept"),
                                ("  the same, colour in the training step (CUDA)", "worker_per_batch", "later"),
                                ("one thread in the process (CPU)", "cpu", "pass"),
                                ("  the same, colour in the training step (CUDA)", "cpu", "later pass")):
        per = opt.batch if "pass" not in kind else opt.samples
        # ultralytics is timed one way: the rows of our variants compare with it
        of = {n: results[n][("pass" if "pass" in kind else "loader") if n == "ultralytics" else kind] for n in names}
        rates = [Stats.of(per / e[figure] for e in of[n]).fmt(1) if of[n] else "-" for n in names]
        ratios = [Stats.of(t[figure] / o[figure] for o, t in zip(of[n], of["ultralytics"])).fmt(2) + "x"
                  if of[n] else "-" for n in ours]
        lines.append(_row(label, rates + ratios))
    lines += [_row("DataLoader, 1 worker (wall, this load)",
                   [Stats.of(opt.samples / e["wall"] for e in results[n]["loader"]).fmt(1) for n in names]),
              "", _row("ms per image (CPU), median [min-max]", names)]
    for phase in PHASES:
        values = [[p["phases"].get(phase) for p in results[n]["pass"]] for n in names]
        lines.append(_row(phase, [Stats.of(1e3 * v / opt.samples for v in vs).fmt(3) if None not in vs else "-"
                                  for vs in values]))
    lines += [_row("transfer: worker, loader over in-process",
                   [Stats.of(1e3 * (e["worker_per_batch"] / opt.batch - p["cpu"] / opt.samples)
                             for e, p in zip(results[n]["loader"], results[n]["pass"])).fmt(3) for n in names]),
              _row("transfer: training process receiving",
                   [Stats.of(1e3 * e["main_per_batch"] / opt.batch for e in results[n]["loader"]).fmt(3)
                    for n in names]),
              _row("colour in the training step (torch, this CPU)",
                   [Stats.of(1e3 * e["colour_per_batch"] / opt.batch for e in results[n]["later"]).fmt(3)
                    if results[n]["later"] else "-" for n in names]),
              _row("in all (one thread)", [Stats.of(1e3 * p["cpu"] / opt.samples for p in results[n]["pass"]).fmt(3)
                                           for n in names])]
    return lines


def run_anchor(opt: Any) -> list[str]:
    """Make the data, start the sides (ours, --compare's if given, ultralytics'), measure; the lines to print."""
    import tempfile

    from benchmarks.bench_learn import ensure_ultralytics, offline_env

    python = ensure_ultralytics(opt.venv)
    names = ["ours", *(["compare"] if opt.compare is not None else []), "ultralytics"]
    with tempfile.TemporaryDirectory(prefix="bench_data_anchor_") as tmp:
        roots = make_sides(Path(tmp), opt.images, tuple(opt.source_px), names)
        env = {**offline_env(Path(tmp) / "ultralytics-config"), "OMP_NUM_THREADS": "1"}
        sides: dict[str, AnchorServe] = {}
        try:
            for name in names:
                python_of = python if name == "ultralytics" else Path(sys.executable)
                tree = opt.compare.resolve() if name == "compare" else ROOT
                sides[name] = AnchorServe(name, roots[name], opt, python_of, env if name == "ultralytics" else None,
                                          tree)
            lines = check_settings({name: side.settings for name, side in sides.items()})
            results = measure(sides, opt)
        finally:
            for side in sides.values():
                side.close()
    if opt.compare is not None:
        lines.append(f"(compare: our pipeline from {opt.compare})")
    return lines + report(results, opt)


def main_anchor(opt: Any) -> None:
    """bench_data.py --anchor: print the header and the tables."""
    from benchmarks.bench_learn import DEFAULT_VENV
    from benchmarks.harness import header

    opt.venv = opt.venv or DEFAULT_VENV
    print(header(f"bench_data --anchor {opt.anchor}: {opt.images} JPEGs of {opt.source_px[0]}-{opt.source_px[1]} px "
                 f"at {opt.img} px, batch {opt.batch}, {opt.samples} samples a pass, median [min-max] of "
                 f"{opt.repeats} repeats in turns", clock="cpu"), flush=True)
    print("\n".join(run_anchor(opt)))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="one side of bench_data.py --anchor (internal)")
    parser.add_argument("--serve", nargs=2, metavar=("SIDE", "DATA"), required=True)
    parser.add_argument("--img", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose pipeline a side of ours times")
    args = parser.parse_args()
    if args.tree.resolve() != ROOT:
        sys.path.insert(0, str(args.tree.resolve()))
    serve(*args.serve, args.img, args.batch)
