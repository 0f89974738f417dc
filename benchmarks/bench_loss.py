"""The training loss alone: forward and backward of a model family's loss on a fixed head output, in this checkout and
in another one (``--compare DIR``, before/after a change), in turns; and whether the two give the same loss and
gradients, bit for bit.

    python benchmarks/bench_loss.py --compare /tmp/before              # yolo11n and yolo26n, 160 px, batch 32
    python benchmarks/bench_loss.py --cfg yolov5n yolo11n --rounds 20 --threads 1 --clock cpu

Each checkout runs in its own process (``--serve``), which builds the model (seed 0, 3 classes) with its own code,
runs it once in train mode on a fixed batch of random images (``--precision bf16``: under bfloat16 autocast, as
train.py on a CPU that is fast in it) and keeps the output; each timed call is the family's loss (its default
hyperparameters) on a fresh leaf copy of that output, then backward. With a few boxes per image at random places
and sizes (``--boxes``), the task-aligned assigner of the anchor-free families has real work. Rounds alternate the
checkouts (ABBA); "speed-up" is the compared checkout's time over this one's, per round (> 1: this one is faster).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import CLOCKS, ServeProcess, Stats, add_timing_flags, header  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", nargs="+", default=["yolo11n", "yolo26n"], help="model YAMLs")
    p.add_argument("--img", type=int, default=160, help="square image size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--boxes", type=int, default=5, help="boxes per image")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16", help="of the model's output")
    p.add_argument("--rounds", type=int, default=10, help="timed calls per checkout and model, taken in turns")
    p.add_argument("--compare", type=Path, default=None, help="also time this checkout's loss, in turns")
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # internal: a checkout's timing process
    add_timing_flags(p)
    return p.parse_args(argv)


def fixed_batch(batch: int, img_size: int, boxes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images in [0, 1] and (n, 6) target rows [image, class, cx, cy, w, h], the same in every checkout."""
    g = torch.Generator().manual_seed(0)
    imgs = torch.rand(batch, 3, img_size, img_size, generator=g)
    rows = [[i, j % 3, *(torch.rand(2, generator=g) * 0.8 + 0.1).tolist(),
             *(torch.rand(2, generator=g) * 0.4 + 0.02).tolist()] for i in range(batch) for j in range(boxes)]
    return imgs, torch.tensor(rows)


def build_case(cfg: str, opt: argparse.Namespace):
    """(loss, head output, targets) with the importing checkout's code: the family's loss and hyperparameters."""
    from models.yolo import Model
    from utils.hyp import load_hyp
    from utils.training.families import get_family

    torch.manual_seed(0)
    model = Model(cfg, nc=3).train()
    family = get_family(model.head.family)
    hyp = load_hyp(family.hyp_file, family.required_hyp, family.name)
    imgs, targets = fixed_batch(opt.batch_size, opt.img, opt.boxes)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=opt.precision == "bf16"):
        output = model(imgs)  # with its graph, so that leaves() knows which tensors the weights made
    return family.loss(model, {**hyp, "img_size": opt.img}), leaves(output), targets


def leaves(output):
    """A copy of the head's output, detached; the tensors that needed gradients (not the anchor points) are leaves
    that collect them."""
    if torch.is_tensor(output):
        return output.detach().clone().requires_grad_(output.requires_grad)
    if isinstance(output, dict):
        return {k: leaves(v) for k, v in output.items()}
    if isinstance(output, (list, tuple)):
        return type(output)(leaves(v) for v in output)
    return output


def gradients(output) -> list[torch.Tensor]:
    if torch.is_tensor(output):
        return [output.grad] if output.grad is not None else []
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else []
    return [g for v in values for g in gradients(v)]


def serve(opt: argparse.Namespace) -> None:
    """Answer requests (one JSON line each: cfg) with the seconds of one loss forward + backward of the served
    checkout's code, and a digest of its total, items and gradients."""
    sys.path.insert(0, str(Path(opt.serve).resolve()))
    if opt.threads > 0:
        torch.set_num_threads(opt.threads)
    clock, cases = CLOCKS[opt.clock], {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cfg = json.loads(line)["cfg"]
        if cfg not in cases:
            cases = {cfg: build_case(cfg, opt)}  # one model in memory at a time
        loss_fn, output, targets = cases[cfg]
        preds = leaves(output)
        start = clock()
        total, items = loss_fn(preds, targets)
        total.backward()
        seconds = clock() - start
        digest = hashlib.sha1()
        for t in (total.detach(), items.detach(), *gradients(preds)):
            digest.update(t.float().contiguous().numpy().tobytes())
        # ServeProcess.ask returns "seconds": here the seconds, the digest and the total
        print(json.dumps({"seconds": [seconds, digest.hexdigest(), total.item()]}), flush=True)


class LossProcess(ServeProcess):
    def __init__(self, tree: Path, opt: argparse.Namespace) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--serve", str(tree), "--img", str(opt.img),
                   "--batch-size", str(opt.batch_size), "--boxes", str(opt.boxes), "--precision", opt.precision,
                   "--threads", str(opt.threads), "--clock", opt.clock]
        env = {**os.environ, **({"OMP_NUM_THREADS": str(opt.threads)} if opt.threads > 0 else {})}
        super().__init__(tree, command, env)


def main(opt: argparse.Namespace) -> dict:
    if opt.threads > 0:
        torch.set_num_threads(opt.threads)  # as the serving processes (the header states it)
    print(header(f"bench_loss: {' '.join(opt.cfg)}, {opt.img} px, batch {opt.batch_size}, {opt.boxes} boxes per "
                 f"image, {opt.precision} head output, {opt.rounds} rounds", clock=opt.clock))
    trees = {"this tree": LossProcess(ROOT, opt)}
    if opt.compare is not None:
        trees["compare"] = LossProcess(opt.compare.resolve(), opt)
    print(f"{'model':<10}{'tree':<11}{'ms [min-max]':>22}{'speed-up':>22}  loss total, same as compared")
    results = {}
    for cfg in opt.cfg:
        answers = {name: [tree.ask(cfg=cfg)] for name, tree in trees.items()}  # warm-up (and build)
        order = list(trees)
        for r in range(opt.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                answers[name].append(trees[name].ask(cfg=cfg))
        seconds = {name: Stats.of(a[0] for a in answers[name][1:]).scaled(1e3) for name in trees}
        digests = {name: {a[1] for a in answers[name]} for name in trees}
        for name in trees:
            speed = ""
            if name == "this tree" and "compare" in trees:
                speed = Stats.of(b[0] / a[0] for a, b in zip(answers["this tree"][1:], answers["compare"][1:]))
                speed = f"{speed.fmt(2)}x"
            agree = digests[name] == digests["this tree"] and len(digests[name]) == 1
            same = "" if len(trees) == 1 else f", {'identical' if agree else 'DIFFERENT'}"
            print(f"{cfg:<10}{name:<11}{seconds[name].fmt(1, 22)}{speed:>22}  {answers[name][0][2]:.6f}{same}")
        results[cfg] = {"seconds": seconds, "digests": digests}
    for tree in trees.values():
        tree.close()
    return results


if __name__ == "__main__":
    options = parse_opt()
    if options.serve:
        serve(options)
    else:
        main(options)
