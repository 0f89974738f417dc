"""benchmarks/bench_data.py --shards: the same images streamed from loopback S3 shards and read as files, timed
alternately, with the start-up of each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import bench_data


def test_shards_mode_times_s3_shards_against_the_same_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("YOLO_DATA_DIR", str(tmp_path))
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(name, "")  # the benchmark points them at its server; restored after the test
    opt = bench_data.parse_opt(["--shards", "--quick", "--img", "64", "--shard-images", "8", "--workers", "0"])
    opt.repeats = 1
    header, speed, startup = bench_data.bench_shards(opt)
    assert header.startswith("--shards: 8 images") and "4 shards on loopback S3" in header
    values = [float(v) for v in re.findall(r"(\d+\.\d+) \[", speed)]
    assert len(values) == 3 and all(v > 0 for v in values)  # files, shards, their ratio
    assert abs(values[2] - values[1] / values[0]) < 0.02 + 0.01 * values[2]
    assert "files (label scan)" in startup and "S3 shards (index)" in startup
