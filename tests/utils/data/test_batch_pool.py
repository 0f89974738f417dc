"""utils/data/batch_pool.py and YoloDataset.__getitems__: a batch's mosaics draw their partners from the batch's own
images, each decoded once for the batch; the same batches for the same keys, and the old path's where it stays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from utils.data import datasets
from utils.data.batch_pool import POOL_MIN, BatchPool, mosaic_pool_size
from utils.data.config import load_data_config
from utils.data.datasets import YoloDataset
from utils.hyp import HypError, load_hyp


def test_the_pool_is_the_batch_topped_up_by_its_key() -> None:
    big = BatchPool(list(range(20, 40)), 100, (0, 1, 20))
    assert big.indices == list(range(20, 40))  # a batch of 16 or more: its own images only
    small = BatchPool([5, 6], 100, (0, 1, 2))
    assert small.indices[:2] == [5, 6] and len(small) == 8  # topped up to 4 x the batch (< POOL_MIN)
    assert BatchPool([5, 6], 100, (0, 1, 2)).indices == small.indices  # by the key alone
    assert BatchPool([5, 6], 100, (0, 2, 2)).indices != small.indices
    assert len(BatchPool(list(range(6)), 100, (0, 0, 0))) == POOL_MIN and len(BatchPool([1, 2], 3, None)) == 3
    assert len(BatchPool(list(range(6)), 100, (0, 0, 0), size=20)) == 20  # hyp mosaic_pool 20
    rng = np.random.default_rng(0)
    assert set(big.partners(rng, 300)) == set(range(20, 40))  # uniform over the pool
    image = np.zeros((4, 4, 3), np.uint8)
    big.put(21, image, (8, 8))
    assert big.get(21) == (image, (8, 8)) and not image.flags.writeable and big.get(22) is None


@pytest.fixture
def augmented(tiny_dataset: Path) -> YoloDataset:
    return YoloDataset(load_data_config(tiny_dataset).train, img_size=64, augment=True,
                       hyp={**load_hyp(), "mosaic": 1.0}, nc=3, seed=0)


def _keys(batch: list[int], epoch: int = 1) -> list:
    return [(i, (0, epoch, p)) for p, i in enumerate(batch)]


def test_a_batch_decodes_each_image_once_and_mosaics_only_its_images(augmented: YoloDataset,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    decoded = []
    read = datasets.read_image
    monkeypatch.setattr(datasets, "read_image", lambda path, reduce=1: decoded.append(path) or read(path, reduce))
    batch = list(range(16))
    samples = augmented.__getitems__(_keys(batch))
    pool = {augmented.im_files[i] for i in BatchPool(batch, len(augmented), (0, 1, 0)).indices}
    assert len(samples) == 16 and augmented.pool is None  # the pool lives while its batch is built
    assert len(decoded) == len(set(decoded)) <= len(pool)  # each image of the pool at most once
    assert {str(p) for p in decoded} <= {str(augmented.read_files[augmented.im_files.index(f)]) for f in pool}
    again = augmented.__getitems__(_keys(batch))
    for a, b in zip(samples, again):  # the same keys: the same batch (seeded draws, the same pool)
        assert torch.equal(a.image, b.image) and torch.equal(a.targets, b.targets)


def test_the_old_path_where_the_path_is_the_same(tiny_dataset: Path, augmented: YoloDataset) -> None:
    keys = _keys([3, 1, 4, 1, 5])
    plain = YoloDataset(load_data_config(tiny_dataset).train, img_size=64, nc=3)  # letterbox: no partners
    for a, b in zip(plain.__getitems__(list(range(5))), [plain[i] for i in range(5)]):
        assert torch.equal(a.image, b.image) and torch.equal(a.targets, b.targets)
    cached = YoloDataset(load_data_config(tiny_dataset).train, img_size=64, augment=True, cache="ram",
                         hyp={**load_hyp(), "mosaic": 1.0}, nc=3, seed=0)
    assert cached.ram is not None  # the RAM cache holds every image: partners from the whole set, as before
    for a, k in zip(cached.__getitems__(keys), keys):
        b = cached[k]
        assert torch.equal(a.image, b.image) and torch.equal(a.targets, b.targets)
    single = augmented[keys[0]]  # a sample asked for alone (plots, tests): partners from the whole set
    assert single.image.shape == (3, 64, 64)


def test_samples_are_written_into_their_batch_slots(augmented: YoloDataset) -> None:
    """Without --rect a batch's samples are built into one batch tensor: collating copies nothing, and the batch
    equals the one collated from copies of the samples."""
    samples = augmented.__getitems__(_keys(list(range(6))))
    batch = augmented.collate_fn(samples)
    assert batch.images.untyped_storage().data_ptr() == samples[0].image.untyped_storage().data_ptr()
    assert batch.images.is_contiguous(memory_format=torch.channels_last) and batch.images.shape == (6, 3, 64, 64)
    copies = [s._replace(image=s.image.clone(), targets=s.targets.clone()) for s in samples]
    again = augmented.collate_fn(copies)
    assert again.images.untyped_storage().data_ptr() != batch.images.untyped_storage().data_ptr()
    assert torch.equal(again.images, batch.images) and torch.equal(again.targets, batch.targets)
    assert datasets.slots_batch([samples[1].image, samples[0].image] + [s.image for s in samples[2:]]) is None
    assert augmented.slot is None


def test_mosaic_pool_0_draws_partners_from_the_whole_set(tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hyp ``mosaic_pool: 0``: no pool; a batch's samples are the samples asked for one by one, their partners
    drawn from the whole set and decoded for each mosaic."""
    assert mosaic_pool_size({}) == POOL_MIN and mosaic_pool_size({"mosaic_pool": 32.0}) == 32
    for bad in (-1, 2.5, "all", True):
        with pytest.raises(HypError, match="mosaic_pool must be a whole number"):
            mosaic_pool_size({"mosaic_pool": bad})
    train = load_data_config(tiny_dataset).train
    with pytest.raises(HypError, match="mosaic_pool"):
        YoloDataset(train, img_size=64, augment=True, hyp={**load_hyp(), "mosaic_pool": -4}, nc=3)
    whole = YoloDataset(train, img_size=64, augment=True, hyp={**load_hyp(), "mosaic": 1.0, "mosaic_pool": 0},
                        nc=3, seed=0)
    decoded = []
    read = datasets.read_image
    monkeypatch.setattr(datasets, "read_image", lambda path, reduce=1: decoded.append(path) or read(path, reduce))
    keys = _keys([3, 1, 4, 1])
    samples = whole.__getitems__(keys)
    assert whole.pool is None and len(decoded) == 4 * len(keys)  # four decodes per mosaic
    for a, k in zip(samples, keys):
        b = whole[k]
        assert torch.equal(a.image, b.image) and torch.equal(a.targets, b.targets)
