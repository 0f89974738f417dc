"""benchmarks/bench_loss.py: the leaves of a head's output, and two checkouts' losses timed in turns and compared
bit for bit (here the same checkout twice: identical)."""

from __future__ import annotations

import torch

from benchmarks import bench_loss


def test_the_case_differentiates_the_head_output_only() -> None:
    opt = bench_loss.parse_opt(["--img", "64", "--batch-size", "2", "--boxes", "2", "--precision", "fp32"])
    loss, output, targets = bench_loss.build_case("yolov8n", opt)
    assert targets.shape == (4, 6) and torch.equal(targets, bench_loss.fixed_batch(2, 64, 2)[1])
    assert output["boxes"].requires_grad and output["scores"].requires_grad and output["boxes"].is_leaf
    assert not output["anchor_points"].requires_grad  # not made by the weights: no gradient asked for
    total, _ = loss(output, targets)
    total.backward()
    assert [g.shape for g in bench_loss.gradients(output)] == [output["boxes"].shape, output["scores"].shape]


def test_two_checkouts_in_turns_with_a_digest_of_their_results(capsys) -> None:
    opt = bench_loss.parse_opt(["--cfg", "yolov8n", "--img", "64", "--batch-size", "2", "--boxes", "2", "--rounds",
                                "2", "--threads", "1", "--compare", str(bench_loss.ROOT)])
    results = bench_loss.main(opt)["yolov8n"]
    assert results["digests"]["this tree"] == results["digests"]["compare"] and len(results["digests"]["compare"]) == 1
    assert all(len(s.samples) == 2 and s.median > 0 for s in results["seconds"].values())
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("yolov8n   this tree") and lines[-2].endswith("identical") and "x  " in lines[-2]
