"""Everything around the model works for the anchor-free families (YOLOv8, YOLO11) and YOLO26's end-to-end head:
--evolve, --freeze, resume mid-epoch at another world size, 2-rank gloo DDP, test.py against COCOeval, detect.py,
TTA where it applies. Tiny models: the family YAMLs at 1/16 width, 64 px, 1 epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import train

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("yolov8", "yolo11", "yolo26")


@pytest.fixture(autouse=True)
def one_thread_and_clean_logger():
    from utils.log import LOGGER

    threads, handlers, level = torch.get_num_threads(), list(LOGGER.handlers), LOGGER.level
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    LOGGER.handlers[:], LOGGER.level = handlers, level


@pytest.fixture(scope="session")
def family_cfgs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's YAML at scale n with 1/16 width and 3 classes, as a --cfg file."""
    folder = tmp_path_factory.mktemp("family_cfgs")
    files = {}
    for family in FAMILIES:
        cfg = yaml.safe_load((ROOT / "models" / f"{family}.yaml").read_text())
        cfg.update(nc=3, scale="n", scales={"n": [0.33, 0.0625, 1024]})
        files[family] = folder / f"{family}-tiny.yaml"
        files[family].write_text(yaml.safe_dump(cfg))
    return files


def args(cfg: Path, data: Path, project: Path, *extra: str) -> list[str]:
    return ["--cfg", str(cfg), "--data", str(data), "--img", "64", "--batch-size", "8", "--epochs", "1", "--device",
            "cpu", "--workers", "0", "--project", str(project), "--noplots", "--loggers", "csv", *extra]


def test_evolve_mutates_and_records_the_values_an_auto_optimizer_run_trains_with(family_cfgs, tiny_dataset,
                                                                                 tmp_path) -> None:
    """--optimizer auto replaces the hyp file's lr0 (0.01) and momentum by its rule's (AdamW, 0.001429 for 3
    classes): generation 0 records those, later generations mutate them and train with what they record, and the
    returned TrainResult.hyp is what the fittest generation trained with, not the file's values."""
    result = train.main(train.parse_opt(args(family_cfgs["yolo11"], tiny_dataset, tmp_path, "--evolve", "2")))
    evolve_dir = tmp_path / "exp-evolve"
    with open(evolve_dir / "evolve.csv") as f:
        header, *rows = [line.strip().split(",") for line in f]
    recorded = [dict(zip(header, map(float, row))) for row in rows]
    used = [yaml.safe_load((evolve_dir / f"gen{g}" / "hyp.yaml").read_text()) for g in range(2)]
    assert used[0]["lr0"] == recorded[0]["lr0"] == 0.001429 and used[0]["momentum"] == 0.9
    assert all(u["optimizer"] == "AdamW" for u in used)
    for u, r in zip(used, recorded):  # what each generation trained with is what evolve.csv says
        assert all(u[k] == pytest.approx(r[k], rel=1e-4) for k in ("lr0", "momentum", "box", "cls", "dfl"))
    assert any(used[1][k] != used[0][k] for k in ("lr0", "momentum", "box", "cls", "dfl", "hsv_h", "scale"))
    assert result.hyp in used and result.hyp["lr0"] != 0.01
    assert yaml.safe_load((evolve_dir / "hyp_evolve.yaml").read_text())["optimizer"] == "AdamW"
