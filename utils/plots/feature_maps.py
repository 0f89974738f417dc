"""--visualize: the feature maps of every stage of the model, saved as images (YOLOv5's feature_visualization).

Stage ``i`` is row ``i`` of the model YAML. Its output's first 32 channels (of the first image) are drawn as a
grid, 8 a row, each channel min-max scaled and coloured with viridis, into
``<folder>/stage{i}_{module}_features.png``, with the whole map (all channels) as ``.npy`` beside it. The Detect
head and 1 x 1 maps are skipped, as the reference does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn

from utils.paths import derived_path

MAX_CHANNELS = 32
COLUMNS = 8
MIN_TILE = 48  # small maps are enlarged (nearest neighbour) to at least this many pixels a side
GAP = 2  # pixels between tiles


@contextlib.contextmanager
def capture_stages(model: nn.Module) -> Iterator[dict[int, tuple[str, torch.Tensor]]]:
    """Record the first output of each stage of our Model during the forward passes inside the block:
    {stage: (module name, tensor)}."""
    captured: dict[int, tuple[str, torch.Tensor]] = {}
    handles = []
    for layer in model.model:
        name = str(getattr(layer, "type", type(layer).__name__)).rsplit(".", 1)[-1]

        def record(module: nn.Module, inputs: object, output: object, stage: int = layer.i, kind: str = name) -> None:
            if stage not in captured and isinstance(output, torch.Tensor):
                captured[stage] = (kind, output.detach())

        handles.append(layer.register_forward_hook(record))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def feature_grid(features: torch.Tensor, max_channels: int = MAX_CHANNELS) -> np.ndarray:
    """A BGR image of the first ``max_channels`` channels of a (c, h, w) map, ``COLUMNS`` tiles a row."""
    maps = features[:max_channels].float().cpu().numpy()
    low = maps.min(axis=(1, 2), keepdims=True)
    span = maps.max(axis=(1, 2), keepdims=True) - low
    scaled = ((maps - low) / np.where(span > 0, span, 1) * 255).astype(np.uint8)  # (n, h, w), each channel 0..255
    zoom = max(1, -(-MIN_TILE // min(scaled.shape[1:])))
    tiles = [cv2.applyColorMap(cv2.resize(m, None, fx=zoom, fy=zoom, interpolation=cv2.INTER_NEAREST),
                               cv2.COLORMAP_VIRIDIS) for m in scaled]
    rows = -(-len(tiles) // COLUMNS)
    columns = min(len(tiles), COLUMNS)
    h, w = tiles[0].shape[:2]
    grid = np.full((rows * (h + GAP) - GAP, columns * (w + GAP) - GAP, 3), 255, np.uint8)
    for index, tile in enumerate(tiles):
        top, left = (index // COLUMNS) * (h + GAP), (index % COLUMNS) * (w + GAP)
        grid[top:top + h, left:left + w] = tile
    return grid


def save_feature_maps(captured: dict[int, tuple[str, torch.Tensor]], folder: Path) -> list[Path]:
    """One ``stage{i}_{module}_features.png`` (and ``.npy``) per captured stage with a map larger than 1 x 1, each
    path checked to stay inside ``folder`` (utils.paths.derived_path)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for stage, (kind, output) in sorted(captured.items()):
        if kind == "Detect" or output.dim() != 4 or min(output.shape[2:]) < 2:
            continue
        path = derived_path(folder, f"stage{stage}_{kind}_features", suffix=".png")  # kind: a module's name
        cv2.imwrite(str(path), feature_grid(output[0]))
        np.save(path.with_suffix(".npy"), output[0].float().cpu().numpy())
        written.append(path)
    return written
