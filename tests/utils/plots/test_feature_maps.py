"""--visualize: stage outputs captured by hooks, drawn as channel grids."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from utils.plots.feature_maps import GAP, MIN_TILE, capture_stages, feature_grid, save_feature_maps

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_grid_draws_at_most_32_channels_8_a_row_each_scaled_on_its_own() -> None:
    maps = torch.arange(40 * 4 * 4, dtype=torch.float32).view(40, 4, 4)
    grid = feature_grid(maps)
    tile = MIN_TILE  # 4 px maps are enlarged to 48
    assert grid.shape == (4 * (tile + GAP) - GAP, 8 * (tile + GAP) - GAP, 3)  # 32 channels: 4 rows of 8
    first, last = grid[:tile, :tile], grid[-tile:, -tile:]
    np.testing.assert_array_equal(first, last)  # each channel spans the full colour map, whatever its values
    assert feature_grid(torch.ones(3, 8, 8)).shape[:2] == (tile, 3 * tile + 2 * GAP)  # flat maps: no division by 0


def test_stages_are_captured_and_saved_but_not_detect(tiny_cfg: dict, tmp_path: Path) -> None:
    from models.yolo import Model

    model = Model(tiny_cfg).eval()
    with capture_stages(model) as stages, torch.no_grad():
        model(torch.rand(1, 3, 64, 64))
    assert sorted(stages) == list(range(len(model.model)))  # every stage, including Detect's (decoded) output
    assert not model.model[0]._forward_hooks  # hooks removed on leaving
    written = save_feature_maps(stages, tmp_path / "img")
    assert len(written) == len(model.model) - 1 and not any("Detect" in p.name for p in written)
    image = cv2.imread(str(tmp_path / "img" / "stage9_SPPF_features.png"))
    assert image is not None and np.load(tmp_path / "img" / "stage9_SPPF_features.npy").shape == (128, 2, 2)
