"""utils/evaluation/classify_metrics.py: top-1 and top-5 by hand, and tallies that sum over shards to exactly the
tally of one process."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from utils.tasks.classify.metric import METRIC_NAMES, ClassifyTally, topk_hits


def test_topk_by_hand() -> None:
    probs = torch.tensor([[0.1, 0.6, 0.3],   # label 1: first
                          [0.5, 0.2, 0.3],   # label 2: second
                          [0.2, 0.3, 0.5]])  # label 0: third
    labels = torch.tensor([1, 2, 0])
    assert topk_hits(probs, labels, (1, 2, 3)).tolist() == [1, 2, 3]
    assert topk_hits(probs, labels).tolist() == [1, 3]  # top-5 of three classes: every image
    tally = ClassifyTally()
    tally.add(probs, labels, logits=probs.log())
    assert (tally.images, tally.top1, tally.top5) == (3, 1, 3)
    assert tally.metrics() == {"accuracy_top1": pytest.approx(1 / 3), "accuracy_top5": 1.0}
    assert tuple(tally.metrics()) == METRIC_NAMES and tally.fitness() == pytest.approx(1 / 3)
    assert tally.mean_loss == pytest.approx(-(torch.tensor([0.6, 0.3, 0.2]).log().mean()).item(), rel=1e-6)
    assert ClassifyTally().metrics() == {"accuracy_top1": 0.0, "accuracy_top5": 0.0}


def test_shards_sum_to_one_process() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 12, generator=generator)
    labels = torch.randint(0, 12, (37,), generator=generator)
    whole = ClassifyTally()
    whole.add(logits.softmax(1), labels, logits)
    shards = []
    for rank in range(2):  # as a DistributedSampler deals them: every other image
        tally = ClassifyTally()
        tally.add(logits[rank::2].softmax(1), labels[rank::2], logits[rank::2])
        shards.append(tally)
    summed = ClassifyTally.from_tensor(shards[0].as_tensor() + shards[1].as_tensor())  # what all_reduce sums
    assert (summed.images, summed.top1, summed.top5) == (whole.images, whole.top1, whole.top5)
    assert summed.metrics() == whole.metrics() and (shards[0] + shards[1]).metrics() == whole.metrics()
    assert summed.mean_loss == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-6)  # float32 sums
    top1 = (logits.argmax(1) == labels).float().mean().item()
    assert summed.accuracy_top1 == pytest.approx(top1)
