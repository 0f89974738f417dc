"""One DDP step = one process's step: two gloo ranks, each on half of a batch, end with the gradients (after DDP's
averaging) and the logged loss terms of one process on the whole batch, for every family's loss (YOLOv5, YOLOv8,
YOLO26) and both segmentation losses, BatchNorm held in eval mode. The halves are made unequal (rank 0's images hold
three boxes each, rank 1's one), so a loss that divided by its own rank's counts would fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from tests.helpers import ROOT, assert_stepped_as_one, free_port, gloo_rank
from utils.distributed.loss_share import LossShare

HALF, SIZE = 4, 64  # images per rank, pixels
MODELS = {  # name -> (model YAML, overrides at a tiny size)
    "yolov5": ("yolov5n", {"width_multiple": 0.125}),
    "yolov8": ("yolov8", {"scale": "n", "scales": {"n": [0.33, 0.0625, 1024]}}),
    "yolo26": ("yolo26", {"scale": "n", "scales": {"n": [0.33, 0.0625, 1024]}}),
    "yolov5-seg": ("yolov5n-seg", {"width_multiple": 0.125}),
    "yolo11-seg": ("yolo11-seg", {"scale": "n", "scales": {"n": [0.33, 0.0625, 1024]}}),
}


def test_one_process_gets_its_own_counts_and_means_untouched() -> None:
    share = LossShare([torch.tensor(0.25), 3, torch.tensor(7.0)])
    assert not share.shared
    assert share.divisor(0).item() == 0.25 and share.divisor(0, floor=1).item() == 1.0
    assert share.divisor(2).item() == 7.0
    mean = torch.tensor(0.123456789)
    assert share.mean(mean, 1) is mean


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """2 x HALF images, their targets [image, class, cx, cy, w, h] (3 boxes on each of the first half's images, 1 on
    the second's) and their overlap index masks at 1/4 size."""
    gen = torch.Generator().manual_seed(0)
    imgs = torch.rand(2 * HALF, 3, SIZE, SIZE, generator=gen)
    rows, masks = [], torch.zeros(2 * HALF, SIZE // 4, SIZE // 4, dtype=torch.uint8)
    for image in range(2 * HALF):
        for obj in range(3 if image < HALF else 1):
            centre = torch.rand(2, generator=gen) * 0.5 + 0.25
            wh = torch.rand(2, generator=gen) * 0.3 + 0.15
            rows.append([image, obj % 3, *centre.tolist(), *wh.tolist()])
            (x1, y1), (x2, y2) = ((centre - wh / 2) * SIZE / 4).long(), ((centre + wh / 2) * SIZE / 4).long()
            masks[image, y1:y2, x1:x2] = obj + 1
    return imgs, torch.tensor(rows), masks


def build(name: str) -> tuple[torch.nn.Module, object]:
    """The tiny model (seed 0, BatchNorm in eval mode, the rest training) and its family's loss."""
    from models.yolo import Model
    from utils.hyp import load_hyp
    from utils.training.families import get_family

    yaml_name, overrides = MODELS[name]
    cfg = {**yaml.safe_load((ROOT / "models" / f"{yaml_name}.yaml").read_text()), "nc": 3, **overrides}
    torch.manual_seed(0)
    model = Model(cfg).train()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eval()
    family = get_family(model.head.family)
    hyp = load_hyp(str(family.hyp_file), family.required_hyp, family.name)
    return model, family.loss_for(model.head.task)(model, {**hyp, "img_size": SIZE})


def step(name: str, rank: int | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The gradients and loss items of one step: the whole batch (``rank`` None) or rank ``rank``'s half under DDP,
    its loss times the world size backpropagated as the Trainer does."""
    from utils.distributed import comm

    model, loss_fn = build(name)
    imgs, targets, masks = batch()
    world = 1
    if rank is not None:
        world, images = comm.get_world_size(), slice(rank * HALF, (rank + 1) * HALF)
        keep = (targets[:, 0] >= rank * HALF) & (targets[:, 0] < (rank + 1) * HALF)
        imgs, masks, targets = imgs[images], masks[images], targets[keep].clone()
        targets[:, 0] -= rank * HALF
    runner = comm.wrap_ddp(model, torch.device("cpu")) if rank is not None else model
    extra = {"masks": masks} if model.head.task == "segment" else {}
    loss, items = loss_fn(runner(imgs), targets, **extra)
    (loss * world).backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()], \
        items


def _rank(rank: int, port: int, out_dir: str) -> None:
    from utils.distributed import comm

    with gloo_rank(rank, port):
        results = {}
        for name in MODELS:
            grads, items = step(name, rank)
            results[name] = (grads, comm.all_reduce_mean(items.clone()))  # what results.csv logs: the ranks' mean
        if rank == 0:
            torch.save(results, Path(out_dir) / "ddp.pt")


@pytest.mark.ddp
def test_two_ranks_step_as_one_process_on_the_whole_batch(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert_stepped_as_one(MODELS, step, ddp)
    finally:
        torch.set_num_threads(threads)
