"""Samplers (order from (seed, epoch) only, exact resume across world sizes), worker seeds, collate, loaders."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from utils.data import loader
from utils.data.config import load_data_config
from utils.data.datasets import DatasetOptions, YoloDataset
from utils.data.errors import DataError
from utils.data.loader import ResumableSampler, ShardSampler, build_dataloader, create_dataloader, set_epoch, set_start
from utils.data.stream import rank_positions
from utils.distributed import comm as dist


def _ranks(n: int, world: int, seed: int = 0, epoch: int = 0, start: int = 0, shuffle: bool = True) -> list[list]:
    out = []
    for rank in range(world):
        sampler = ResumableSampler(n, shuffle=shuffle, seed=seed, rank=rank, world_size=world)
        sampler.set_epoch(epoch)
        sampler.set_start(start)
        out.append(list(sampler))
        assert len(sampler) == len(out[-1])
    return out


def test_epoch_order_depends_only_on_seed_and_epoch() -> None:
    a, b = ResumableSampler(50, seed=3, rank=0, world_size=1), ResumableSampler(50, seed=3, rank=1, world_size=4)
    a.set_epoch(2)
    b.set_epoch(2)
    assert a.epoch_order() == b.epoch_order() and sorted(a.epoch_order()) == list(range(50))
    b.set_epoch(3)
    assert a.epoch_order() != b.epoch_order()
    assert ResumableSampler(50, seed=4, rank=0, world_size=1).epoch_order() != \
        ResumableSampler(50, seed=3, rank=0, world_size=1).epoch_order()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_cover_the_epoch_with_equal_lengths(world: int) -> None:
    parts = _ranks(10, world, seed=1, epoch=5)
    assert len({len(p) for p in parts}) == 1
    interleaved = [parts[r][i] for i in range(len(parts[0])) for r in range(world)]
    order = ResumableSampler(10, seed=1, rank=0, world_size=1)
    order.set_epoch(5)
    assert interleaved[:10] == order.epoch_order()  # the global order, dealt round-robin (then padding)


@pytest.mark.parametrize(("world_before", "world_after", "batch"), [(2, 3, 2), (2, 1, 3), (1, 4, 5), (3, 2, 1)])
def test_resume_with_another_world_size_sees_exactly_the_rest(world_before: int, world_after: int,
                                                              batch: int) -> None:
    n, epoch, steps = 37, 4, 2
    before = _ranks(n, world_before, seed=7, epoch=epoch)
    consumed = steps * batch * world_before
    seen = sorted(i for part in before for i in part[:steps * batch])
    after = _ranks(n, world_after, seed=7, epoch=epoch, start=consumed)
    rest = sorted(set(i for part in after for i in part))
    assert sorted(seen + rest) == list(range(n))  # every sample exactly once over the two runs
    assert sum(len(p) for p in after) - (n - consumed) < world_after  # padding only to even out ranks


@pytest.mark.parametrize(("n", "world", "batch", "per_rank"), [(7, 1, 2, 8), (5, 2, 2, 4), (9, 2, 4, 6),
                                                               (7, 1, 3, 8), (8, 1, 3, 8), (7, 1, 1, 7)])
def test_a_last_batch_of_one_image_is_padded(n: int, world: int, batch: int, per_rank: int) -> None:
    """7 images at batch 2 (a last batch of one reached BatchNorm): each rank gets one more image, wrapped from the
    start of the epoch's order as DistributedSampler pads, the same on every rank (5 images, 2 ranks of batch 2:
    3 each, padded to 4); other last batches are kept as they are."""
    parts = []
    for rank in range(world):
        sampler = ResumableSampler(n, seed=2, rank=rank, world_size=world, batch_size=batch)
        sampler.set_epoch(1)
        parts.append(list(sampler))
        assert len(sampler) == len(parts[-1]) == per_rank and per_rank % batch != 1 or batch == 1
    assert set().union(*parts) == set(range(n))  # every image, some twice
    assert rank_positions(n, 0, 0, world, batch=batch)[-1] < n and rank_positions(n, 0, 0, world, pad=False,
                                                                                   batch=batch) == \
        list(range(0, n, world))  # evaluation: never padded


def test_seven_images_at_batch_2_and_32_px_train(tmp_path: Path) -> None:
    """The red-team's run: 7 images, --batch-size 2 --img 32 (its last batch of one image ended in a traceback)."""
    import yaml

    import train
    from tests.conftest import _tiny_cfg
    from tests.helpers import one_thread_and_logger_kept
    from utils.cli import run_main
    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    root = ensure_synthetic(tmp_path / "seven", n_train=7, n_val=2, img_size=(48, 64), seed=0)
    (tmp_path / "d.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train",
                                                     "val": "images/val", "names": list(SYNTHETIC_NAMES)}))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(_tiny_cfg()))
    opt = train.parse_opt(["--cfg", str(tmp_path / "m.yaml"), "--data", str(tmp_path / "d.yaml"), "--img", "32",
                           "--batch-size", "2", "--epochs", "1", "--device", "cpu", "--workers", "0", "--noval",
                           "--noplots", "--project", str(tmp_path / "runs")])
    with one_thread_and_logger_kept():
        assert run_main(train.main, opt, "train") == 0
    assert (tmp_path / "runs" / "exp" / "weights" / "last.pt").is_file()


def test_set_epoch_rewinds_the_start() -> None:
    sampler = ResumableSampler(12, seed=0, rank=0, world_size=1)
    sampler.set_epoch(1)
    sampler.set_start(5)
    assert len(list(sampler)) == 7
    sampler.set_epoch(2)
    assert len(list(sampler)) == 12


def test_shard_eval_has_no_duplicates() -> None:
    shards = [list(ShardSampler(11, rank=r, world_size=3)) for r in range(3)]
    assert shards[0] == [0, 3, 6, 9] and sorted(sum(shards, [])) == list(range(11))


def test_worker_count_shares_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)), raising=False)
    monkeypatch.setattr(dist, "get_local_world_size", lambda: 4)
    assert loader.worker_count(8, 16) == 4
    assert loader.worker_count(2, 16) == 2
    assert loader.worker_count(8, 1) == 0 and loader.worker_count(8, 3) == 3


def test_worker_count_leaves_the_cpu_training_threads_their_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)  # 2 usable cores
    monkeypatch.setattr(dist, "get_local_world_size", lambda: 1)
    assert loader.worker_count(8, 16) == 2  # nothing reserved (a GPU trains): every core
    assert loader.worker_count(8, 16, reserved=1) == 1  # one torch thread on the CPU: the other core
    assert loader.worker_count(8, 16, reserved=2) == 1  # the threads take every core: still one worker
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)), raising=False)
    monkeypatch.setattr(dist, "get_local_world_size", lambda: 2)
    assert loader.worker_count(8, 16, reserved=4) == 4  # 8 cores per rank, 4 for its threads
    assert loader.worker_count(2, 16, reserved=4) == 2 and loader.worker_count(8, 1, reserved=4) == 0


def test_a_cpu_run_builds_its_loaders_with_the_cores_its_threads_leave(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    images = tmp_path / "images"
    images.mkdir()
    import cv2

    for i in range(4):
        cv2.imwrite(str(images / f"{i}.jpg"), np.full((32, 32, 3), 60 * i, np.uint8))
    options = DatasetOptions(img_size=32, batch_size=2, stride=32, hyp={})
    built, _ = loader.create_dataloader(images, options, workers=8, reserved_cores=1)
    assert built.num_workers == 1
    built, _ = loader.create_dataloader(images, options, workers=8)
    assert built.num_workers == 2


class _Draws(torch.utils.data.Dataset):
    """Returns a random draw from the dataset's stream (as augmentation does) and the worker id."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        return torch.tensor([self.rng.random(), info.id if info else -1])


def _draws(rank: int, monkeypatch: pytest.MonkeyPatch, workers: int = 2) -> dict[int, list[float]]:
    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    data = build_dataloader(_Draws(), 2, shuffle=False, workers=workers, seed=0)
    assert data.persistent_workers == (workers > 0) and data.num_workers == workers
    out: dict[int, list[float]] = {}
    for batch in data:
        for draw, worker in batch.tolist():
            out.setdefault(int(worker), []).append(draw)
    return out


def test_augmentation_seeds_differ_per_worker_and_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    rank0, rank1 = _draws(0, monkeypatch), _draws(1, monkeypatch)
    assert set(rank0) == {0, 1}
    assert rank0[0][:2] != rank0[1][:2]  # two workers of one rank
    assert rank0[0][:2] != rank1[0][:2]  # the same worker on two ranks
    assert _draws(0, monkeypatch) == rank0  # and reproducible


def test_collate_indexes_targets_and_pads_mixed_shapes() -> None:
    a = (torch.zeros(3, 32, 64, dtype=torch.uint8), torch.tensor([[0, 1, 0.5, 0.5, 0.5, 1.0]]), "a", None)
    b = (torch.zeros(3, 64, 64, dtype=torch.uint8), torch.tensor([[0, 2, 0.5, 0.5, 0.2, 0.2]] * 2), "b", None)
    imgs, targets, paths, shapes = YoloDataset.collate_fn([a, b])
    assert imgs.shape == (2, 3, 64, 64) and paths == ("a", "b")
    assert targets[:, 0].tolist() == [0, 1, 1]
    assert targets[0, 2:].tolist() == [0.5, 0.25, 0.5, 0.5]  # image a padded at the bottom: y and h halve
    assert (imgs[0, :, 32:] == 114).all()


def test_collate_in_a_worker_builds_the_batch_in_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """As torch's default_collate: the batch is not copied again on its way to the main process."""
    imgs = [torch.full((3, 8, 8), i, dtype=torch.uint8) for i in range(3)]
    batch = [(img, torch.zeros((0, 6)), str(i), None) for i, img in enumerate(imgs)]
    assert not YoloDataset.collate_fn(batch)[0].is_shared()
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    out = YoloDataset.collate_fn(batch)[0]
    assert out.is_shared() and torch.equal(out, torch.stack(imgs))


def test_create_dataloader_train_and_rect_val(tiny_dataset: Path) -> None:
    config = load_data_config(tiny_dataset)
    hyp = {"mosaic": 1.0, "mixup": 0.5, "fliplr": 0.5, "translate": 0.1, "scale": 0.5, "hsv_v": 0.4}
    train_options = DatasetOptions(img_size=64, batch_size=8, hyp=hyp, augment=True, seed=1, nc=3)
    train_loader, train_set = create_dataloader(config.train, train_options, shuffle=True, workers=0)
    set_epoch(train_loader, 1)
    set_start(train_loader, 16)
    batches = list(train_loader)
    assert len(batches) == 1 and batches[0][0].shape == (8, 3, 64, 64)
    imgs, targets, _, _ = batches[0]
    assert targets.shape[1] == 6 and 0 <= targets[:, 0].min() and targets[:, 0].max() < 8
    val_options = DatasetOptions(img_size=96, batch_size=4, rect=True, pad=0.5, nc=3)
    val_loader, val_set = create_dataloader(config.val, val_options, workers=0)
    shapes = [tuple(b[0].shape[2:]) for b in val_loader]
    assert len(shapes) == 3 and all(h % 32 == 0 and w % 32 == 0 for h, w in shapes)
    assert sum(len(b[2]) for b in val_loader) == 12


def test_shapes_map_targets_back_to_the_original_pixels(tiny_dataset: Path) -> None:
    from utils.boxes import scale_boxes, xywh2xyxy

    config = load_data_config(tiny_dataset)
    for rect in (False, True):
        ds = YoloDataset(config.val, img_size=80, batch_size=4, rect=rect, pad=0.5, nc=3)
        for i in range(len(ds)):
            img, targets, _, (shape0, ratio_pad) = ds[i]
            h, w = img.shape[1:]
            boxes = xywh2xyxy(targets[:, 2:] * torch.tensor([w, h, w, h]))
            back = scale_boxes((h, w), boxes, shape0, ratio_pad)
            expected = xywh2xyxy(torch.from_numpy(ds.labels[i][:, 1:]) * torch.tensor(
                [shape0[1], shape0[0], shape0[1], shape0[0]]))
            torch.testing.assert_close(back, expected, atol=0.6, rtol=0)


@pytest.mark.parametrize("shard_eval", [True, False])
def test_rect_batches_share_one_shape_on_every_rank(tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                                    shard_eval: bool) -> None:
    config = load_data_config(tiny_dataset)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    for rank in range(2):
        monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
        options = DatasetOptions(img_size=96, batch_size=2, rect=True, pad=0.5, nc=3, augment=not shard_eval)
        data, dataset = create_dataloader(config.val, options, workers=0, shard_eval=shard_eval)
        for batch in data.batch_sampler:
            indices = [i[0] if isinstance(i, tuple) else i for i in batch]  # training samplers add a seed key
            assert len({tuple(dataset.batch_shapes[dataset.batch_index[i]]) for i in indices}) == 1


def test_augmentations_repeat_exactly_on_resume_whatever_the_workers(tiny_dataset: Path) -> None:
    config = load_data_config(tiny_dataset)
    augmented = DatasetOptions(img_size=64, batch_size=4, augment=True, seed=3, nc=3)

    def run(workers: int, start: int) -> list:
        data, _ = create_dataloader(config.train, augmented, shuffle=True, workers=workers)
        set_epoch(data, 2)
        set_start(data, start)
        return list(data)

    full, resumed = run(0, 0), run(2, 8)
    assert len(full) == 6 and len(resumed) == 4
    for (img_a, tgt_a, paths_a, _), (img_b, tgt_b, paths_b, _) in zip(full[2:], resumed):
        assert paths_a == paths_b and torch.equal(img_a, img_b) and torch.equal(tgt_a, tgt_b)
    other_epoch = create_dataloader(config.train, augmented, shuffle=True, workers=0)[0]
    set_epoch(other_epoch, 3)
    assert not torch.equal(next(iter(other_epoch))[0], full[0][0])


def test_image_weights_favour_rare_and_badly_detected_classes_and_shard_one_order() -> None:
    from utils.data.loader import image_weights

    labels = [np.array([[0, 0.5, 0.5, 0.1, 0.1]])] * 6 + [np.array([[1, 0.5, 0.5, 0.1, 0.1]])] * 2 + \
        [np.zeros((0, 5))]
    weights = image_weights(labels, nc=2, maps=np.array([0.0, 0.5]))
    # class weights 1/6 and 1/2 (normalised: 0.25, 0.75) times (1 - mAP)^2 / nc: 0.125 and 0.09375
    assert weights.tolist() == pytest.approx([0.125] * 6 + [0.09375] * 2 + [0.0])
    sampler = ResumableSampler(len(labels), shuffle=True, seed=0, rank=0, world_size=1)
    sampler.set_weights(weights)
    counts = np.zeros(len(labels))
    for epoch in range(400):
        sampler.set_epoch(epoch)
        np.add.at(counts, sampler.epoch_order(), 1)
    share = counts / counts.sum()
    assert share[8] == 0 and share[6:8].sum() == pytest.approx(2 * 0.09375 / weights.sum(), abs=0.01)
    shards = []
    for rank in range(2):  # every rank draws the same weighted order and takes its half of it
        s = ResumableSampler(len(labels), shuffle=True, seed=0, rank=rank, world_size=2)
        s.set_weights(weights)
        s.set_epoch(3)
        shards.append(list(s))
    sampler.set_epoch(3)
    order = sampler.epoch_order()
    assert shards[0] == order[0::2] and shards[1] == order[1::2] + order[:1]  # the last padded by wrapping


def test_a_segmenter_is_refused_streamed_shards_in_one_line(tmp_path: Path) -> None:
    from utils.data.config import DataError
    from utils.data.datasets import DatasetOptions
    from utils.data.loader import create_dataloader
    from utils.data.shard_urls import ShardSpec

    spec = ShardSpec("train-{000..001}.tar", ("a.tar", "b.tar"), str(tmp_path / "index.json"), True)
    with pytest.raises(DataError, match="tar shards hold boxes only; a segment model reads YOLO segment labels"):
        create_dataloader([spec], DatasetOptions(img_size=64, task="segment"), workers=0)


@pytest.mark.parametrize("mosaic", [0.0, 1.0])
def test_batches_that_leave_the_colour_to_the_step(tmp_path: Path, mosaic: float) -> None:
    """defer_colour: the same samples (boxes, order, draws) with each image's gains carried by the batch, and the
    step's change of them equal to the loader's within a level (within the resizes' rounding for mosaics, whose
    tiles the loader colours before resizing them)."""
    from utils.data.colour import COLOUR_KEY, recolour, take_colour
    from utils.data.synthetic import ensure_synthetic
    from utils.hyp import load_hyp

    root = ensure_synthetic(tmp_path / "syn", n_train=12, n_val=2, img_size=(64, 96), seed=0)
    hyp = {**load_hyp(), "mosaic": mosaic}
    loader_side = YoloDataset(root / "images" / "train", img_size=64, augment=True, hyp=hyp, seed=0)
    step_side = YoloDataset(root / "images" / "train", img_size=64, augment=True, hyp=hyp, seed=0, defer_colour=True)
    keys = [(i, (0, 0, i)) for i in range(8)]
    coloured = loader_side.collate_fn(loader_side.__getitems__(keys))
    later = step_side.collate_fn(step_side.__getitems__(keys))
    assert type(coloured).__name__ == "Batch" and set(later.extras) == {COLOUR_KEY}
    assert torch.equal(coloured.targets, later.targets) and coloured.paths == later.paths
    gains = take_colour([later.extras])
    assert gains.shape == (8, 3) and len(set(gains[:, 2].tolist())) == 8  # each image its own draw
    diff = (recolour(later.images, gains).int() - coloured.images.int()).abs().float()
    assert (later.images.int() - coloured.images.int()).abs().float().mean() > 10  # not coloured by the loader
    if mosaic:
        assert diff.mean() < 1.0
    else:
        assert diff.max() <= 1
    plain = YoloDataset(root / "images" / "train", img_size=64, augment=True, seed=0, defer_colour=True,
                        hyp={**hyp, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0})
    assert not plain.colour_later and type(plain.collate_fn(plain.__getitems__(keys))).__name__ == "Batch"
    single = step_side[keys[0]]  # a sample taken alone (no batch to carry its gains) is coloured as before
    assert torch.equal(single.image, loader_side[keys[0]].image)
    with pytest.raises(DataError, match="--quad tiles 4 images"):  # one image of 4, each with its own change
        step_side.collate_quad(step_side.__getitems__(keys[:4]))


def test_a_segment_batch_carries_its_masks_and_its_colour(tmp_path: Path) -> None:
    from utils.data.colour import COLOUR_KEY
    from utils.tasks.segment.synthetic import ensure_synthetic_seg

    root = ensure_synthetic_seg(tmp_path / "seg", n_train=5, n_val=2, img_size=(64, 96), seed=3)
    dataset = YoloDataset(root / "images" / "train", img_size=64, augment=True, seed=0, task="segment",
                          defer_colour=True)
    batch = dataset.collate_fn(dataset.__getitems__([(i, (0, 0, i)) for i in range(4)]))
    assert {COLOUR_KEY, "masks"} <= set(batch.extras) and batch.extras[COLOUR_KEY].shape == (4, 3)
