"""utils/training/engine.py: the CPU training path (channels_last model and batches, utils.training.builder's
layout) against the plain NCHW path: the same loss and gradients within float rounding, and weights that save,
load and fuse as before."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from models.yolo import Model
from utils.training.engine import prepare_images, train_memory_format
from utils.training.loss import ComputeLoss
from utils.weights.checkpoint import load_model, new_checkpoint, save_checkpoint

CPU = torch.device("cpu")
HYP = {"box": 0.05, "obj": 1.0, "cls": 0.5, "anchor_t": 4.0}
# The convolutions of the two layouts sum in different orders (oneDNN's blocked kernels, 1x1 ones as matrix
# products), and BatchNorm's backward over the few pixels of the deep 2x2 maps magnifies the rounding: measured
# against float64, the plain path's gradients are up to 6e-5 off and the channels_last ones 1.1e-4 (relative to
# each tensor's largest value); the two paths differ by up to 1.1e-4. The bound:
RELATIVE = 1e-3


def _batch(img: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """4 uint8 images and 3 boxes each [image, class, cx, cy, w, h] (normalised)."""
    g = torch.Generator().manual_seed(0)
    imgs = torch.randint(0, 256, (4, 3, img, img), dtype=torch.uint8, generator=g)
    boxes = torch.cat((torch.rand(12, 2, generator=g) * 0.6 + 0.2, torch.rand(12, 2, generator=g) * 0.3 + 0.1), 1)
    image, cls = torch.arange(4).repeat_interleave(3), torch.randint(0, 3, (12,), generator=g)
    return imgs, torch.cat((image[:, None].float(), cls[:, None].float(), boxes), 1)


def _close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool((actual - expected).abs().max() <= RELATIVE * expected.abs().max().clamp(min=1e-12))


def test_the_cpu_trains_channels_last_and_other_devices_as_asked() -> None:
    assert train_memory_format(CPU) is torch.channels_last
    assert train_memory_format(torch.device("cuda")) is torch.preserve_format  # today's behaviour on a GPU
    assert train_memory_format(torch.device("cuda"), channels_last=True) is torch.channels_last
    imgs, _ = _batch()
    images = prepare_images(imgs, CPU, None)
    assert images.is_contiguous(memory_format=torch.channels_last) and images.dtype == torch.float32
    assert torch.equal(images, imgs.float() / 255)  # the same values as the plain cast
    loader_batch = imgs.contiguous(memory_format=torch.channels_last)  # as the loader collates them
    assert torch.equal(prepare_images(loader_batch, CPU, None), images)
    resized = prepare_images(imgs, CPU, 96)  # --multi-scale keeps the layout
    assert resized.shape[-1] == 96 and resized.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_training_gives_the_plain_paths_loss_and_gradients(tiny_cfg: dict) -> None:
    torch.manual_seed(0)
    plain = Model(tiny_cfg, nc=3).train()
    fast = copy.deepcopy(plain).to(memory_format=train_memory_format(CPU))
    imgs, targets = _batch()
    results = []
    for model, images in ((plain, imgs.float() / 255), (fast, prepare_images(imgs, CPU, None))):
        loss, items = ComputeLoss(model, HYP, 64)(model(images), targets)
        loss.backward()
        results.append((loss.detach(), items, {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, items_a, grads_a), (loss_b, items_b, grads_b) = results
    assert loss_a > 0 and _close(loss_b, loss_a) and _close(items_b, items_a)
    assert grads_a.keys() == grads_b.keys() and all(g is not None for g in grads_b.values())
    far = [n for n in grads_a if not _close(grads_b[n], grads_a[n])]
    assert not far, f"gradients beyond float rounding: {far[:5]}"
    stats = [(b.running_mean, b.running_var) for b in plain.modules() if isinstance(b, torch.nn.BatchNorm2d)]
    stats_fast = [(b.running_mean, b.running_var) for b in fast.modules() if isinstance(b, torch.nn.BatchNorm2d)]
    assert all(_close(m2, m1) and _close(v2, v1) for (m1, v1), (m2, v2) in zip(stats, stats_fast))


def test_weights_trained_channels_last_save_load_and_fuse_as_plain_ones(tiny_cfg: dict, tmp_path: Path) -> None:
    torch.manual_seed(0)
    plain = Model(tiny_cfg, nc=3).eval()
    fast = copy.deepcopy(plain).to(memory_format=train_memory_format(CPU))
    saved = save_checkpoint(new_checkpoint(fast), tmp_path / "last.pt")  # weights_only loading, below
    loaded, _ = load_model(saved, fuse=False)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), plain.state_dict().values()))
    images = _batch()[0].float() / 255
    with torch.no_grad():
        expected = plain(images)[0]
        for model in (loaded.fuse(), copy.deepcopy(fast).fuse()):  # the validation copy of the EMA is fused so
            assert _close(model(images)[0], expected)


def test_the_non_finite_reload_hook_reloads_after_three_skipped_steps_in_a_row(yolo_log) -> None:
    from utils.hooks import CHECKPOINT_PRIORITY, Hooks, StepInfo
    from utils.training.checkpointer import Checkpointer
    from utils.training.engine import NONFINITE_LIMIT, NonFiniteReload

    reloads: list[int] = []
    hook = NonFiniteReload(reloads.append)
    assert hook.priority == CHECKPOINT_PRIORITY and NONFINITE_LIMIT == 3
    assert Hooks([Checkpointer(lambda *a, **k: None), hook]).hooks[0] is not hook  # registration order decides
    skipped = [True, True, False, True, True, True, True, True, True, True]
    for batch, skip in enumerate(skipped):
        hook.after_step(None, StepInfo(0, batch, torch.zeros(0), torch.zeros(0, 6), [], not skip, skip))
    assert reloads == [3, 3]  # a good step in between starts the count again; the 7th skip in a row is 1 again
    hook.after_epoch(None, 0, {})
    assert any("Epoch 0: skipped 9 steps with a non-finite loss (9 in all)" in m for m in yolo_log)
    hook.after_epoch(None, 1, {})
    assert sum("skipped" in m for m in yolo_log) == 1  # an epoch without skips says nothing


def test_parameters_take_their_gradients_strides_and_nothing_else_changes(tiny_cfg: dict) -> None:
    """A 1x1 convolution's weight in channels_last has strides oneDNN does not give its gradient (they differ in
    size-1 dimensions); DDP's buckets would copy each such gradient with a warning. After the alignment a training
    step's gradients have their parameters' strides; weights, BatchNorm statistics and the RNG are unchanged."""
    from utils.training.engine import align_to_gradients

    torch.manual_seed(0)
    model = Model(tiny_cfg).to(memory_format=torch.channels_last)
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()

    def mismatched() -> list[str]:
        model.zero_grad(set_to_none=True)
        outputs = model(prepare_images(torch.zeros(2, 3, 64, 64, dtype=torch.uint8), torch.device("cpu"), None))
        sum(o.float().sum() for o in outputs).backward()
        return [name for name, p in model.named_parameters() if p.grad.stride() != p.stride()]

    found = mismatched()
    model.load_state_dict(before)
    assert any(".conv.weight" in name for name in found)  # what torch warns about under DDP
    assert align_to_gradients(model, torch.device("cpu"), 64) == len(found)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    assert mismatched() == []
