"""The classify and obb tasks on two gloo ranks equal one process: the classifier's top-1 and top-5 of a sharded
validation (7 images: 4 and 3 a rank) are one process's, and one DDP step of each task's loss is one process's
step: two gloo ranks, each on half of a batch, end with the gradients (after DDP's averaging) and the logged loss
terms of one process on the whole batch (utils/distributed/loss_share.py): YOLO11-cls (the mean over every rank's
images), YOLO11-obb and YOLO26-obb (the target scores summed over the ranks). The halves are unequal (rank 0's
images hold three oriented boxes each, rank 1's one; the classifier's ranks get 5 and 3 images), so a loss that
divided by its own rank's counts would fail; BatchNorm is held in eval mode."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from tests.helpers import ROOT, assert_stepped_as_one, free_port, gloo_rank

HALF, SIZE = 4, 64  # images per rank, pixels
TINY = {"scale": "n", "scales": {"n": [0.33, 0.0625, 1024]}}
MODELS = {"yolo11-cls": "yolo11-cls", "yolo11-obb": "yolo11-obb", "yolo26-obb": "yolo26-obb"}


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """2 x HALF images, their targets [image, class, cx, cy, w, h] (three boxes on each of the first half's images,
    one on the second's; a classifier reads the first row's class of each image) and the rotated boxes (n, 5)."""
    gen = torch.Generator().manual_seed(0)
    imgs = torch.rand(2 * HALF, 3, SIZE, SIZE, generator=gen)
    rows, rboxes = [], []
    for image in range(2 * HALF):
        for obj in range(3 if image < HALF else 1):
            centre = torch.rand(2, generator=gen) * 0.5 + 0.25
            wh = torch.rand(2, generator=gen) * 0.3 + 0.15
            angle = float(torch.rand(1, generator=gen)) * math.pi / 2
            rows.append([image, (image + obj) % 3, *centre.tolist(), *wh.tolist()])
            rboxes.append([*centre.tolist(), *wh.tolist(), angle])
    return imgs, torch.tensor(rows), torch.tensor(rboxes)


def build(name: str) -> tuple[torch.nn.Module, object]:
    from models.yolo import Model
    from utils.hyp import load_hyp
    from utils.training.families import get_family

    cfg = {**yaml.safe_load((ROOT / "models" / f"{MODELS[name]}.yaml").read_text()), "nc": 3, **TINY}
    torch.manual_seed(0)
    model = Model(cfg).train()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eval()
    family = get_family(model.head.family)
    hyp = load_hyp(str(family.hyp_file), family.required_hyp, family.name)
    return model, family.loss_for(model.head.task)(model, {**hyp, "img_size": SIZE, "label_smoothing": 0.1})


def step(name: str, rank: int | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The gradients and loss items of one step on the whole batch (``rank`` None) or on rank ``rank``'s half under
    DDP, its loss times the world size backpropagated as the Trainer does."""
    from utils.distributed import comm

    model, loss_fn = build(name)
    imgs, targets, rboxes = batch()
    world, cut = 1, HALF + (model.head.task != "obb")  # the classifier's halves: 5 and 3 images
    if rank is not None:
        world, (start, end) = comm.get_world_size(), ((0, cut), (cut, 2 * HALF))[rank]
        keep = (targets[:, 0] >= start) & (targets[:, 0] < end)
        imgs, targets, rboxes = imgs[start:end], targets[keep].clone(), rboxes[keep]
        targets[:, 0] -= start
    runner = comm.wrap_ddp(model, torch.device("cpu")) if rank is not None else model
    if model.head.task == "obb":
        loss, items = loss_fn(runner(imgs), targets, rboxes=rboxes)
    else:  # one row per image: its first box's class
        first = torch.cat((torch.ones(1, dtype=torch.bool), targets[1:, 0] != targets[:-1, 0]))
        loss, items = loss_fn(runner(imgs), targets[first])
    (loss * world).backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()], \
        items


class ColourClassifier(torch.nn.Module):
    """A classifier of 3 classes whose probabilities follow the image's mean colour (what the synthetic images
    differ in), so its ranking varies from image to image."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images.mean((2, 3)) * 40).softmax(1)


def validated(folder: Path) -> object:
    """The classify metric's pass over the 7 validation images of a synthetic set, sharded over the ranks."""
    from utils.data.loader import create_dataloader
    from utils.data.samples import DatasetOptions
    from utils.evaluation.results import EvalOptions
    from utils.tasks.classify.metric import METRIC
    from utils.tasks.classify.synthetic import ensure_synthetic_cls

    root = ensure_synthetic_cls(folder / "set", n_train=3, n_val=7, img_size=48, seed=5)
    options = DatasetOptions(img_size=32, batch_size=2, task="classify", nc=3, names=["circle", "square", "triangle"])
    loader = create_dataloader([root / "val"], options, workers=0, shard_eval=True)[0]
    return METRIC.run(ColourClassifier(), loader, torch.device("cpu"), ["circle", "square", "triangle"],
                      EvalOptions(), compute_loss=object())


def _rank(rank: int, port: int, out_dir: str) -> None:
    from utils.distributed import comm

    with gloo_rank(rank, port):
        result = validated(Path(out_dir))
        results = {"validation": [result.seen, result.top1, result.top5, result.loss["cls"],
                                  result.maps.tolist()]}
        for name in MODELS:
            grads, items = step(name, rank)
            results[name] = (grads, comm.all_reduce_mean(items.clone()))  # what results.csv logs: the ranks' mean
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")


@pytest.mark.ddp
def test_two_ranks_step_as_one_process_on_the_whole_batch(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    ddp, other = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = validated(tmp_path)
        expected = [one.seen, one.top1, one.top5, one.loss["cls"], one.maps.tolist()]
        assert ddp["validation"] == other["validation"]  # every rank returns the whole set's figures
        assert ddp["validation"][:3] == expected[:3] and one.seen == 7 and 0 < one.top1 < 1
        assert ddp["validation"][3] == pytest.approx(expected[3], rel=1e-6)  # a sum of floats in another order
        assert ddp["validation"][4] == expected[4] and len(set(expected[4])) > 1  # per-class accuracies differ
        assert_stepped_as_one(MODELS, step, ddp)
    finally:
        torch.set_num_threads(threads)
