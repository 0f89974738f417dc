"""The epoch loop's helpers: the model validation runs on."""

from __future__ import annotations

import torch

from models.common import Conv
from models.yolo import Model
from utils.training.loop import validation_model
from utils.training.optim import ModelEMA


def test_validation_runs_a_fused_copy_of_the_ema_with_the_same_outputs(tiny_cfg: dict) -> None:
    torch.manual_seed(0)
    model = Model(tiny_cfg, nc=3)
    ema = ModelEMA(model)
    for m in ema.ema.modules():  # BatchNorm statistics that are not the identity, so that folding them matters
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    fused = validation_model(ema.ema)
    assert fused is not ema.ema
    convs = [m for m in fused.modules() if isinstance(m, Conv)]
    assert convs and all(isinstance(m.bn, torch.nn.Identity) for m in convs)
    assert all(isinstance(m.bn, torch.nn.BatchNorm2d) for m in ema.ema.modules() if isinstance(m, Conv))  # untouched
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        expected, got = ema.ema.eval()(x)[0], fused.eval()(x)[0]
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_model_without_fuse_is_validated_as_it_is() -> None:
    plain = torch.nn.Linear(2, 2)
    assert validation_model(plain) is plain


def test_mosaic_closes_for_the_last_close_mosaic_epochs_as_ultralytics_counts_them() -> None:
    from types import SimpleNamespace

    from utils.training.loop import Trainer

    def closed(epochs: int, close: float | None) -> list[int]:
        run = SimpleNamespace(hyp={} if close is None else {"close_mosaic": close},
                              config=SimpleNamespace(epochs=epochs))
        return [e for e in range(epochs) if Trainer.mosaic_closed(run, e)]

    assert closed(15, 10) == list(range(5, 15)) and closed(10, 10) == list(range(10))
    assert closed(5, 10) == [] and closed(15, 0) == [] and closed(15, None) == []  # short runs keep mosaic


def test_closing_mosaic_restarts_persistent_workers_without_it(tiny_dataset) -> None:
    from utils.data.config import load_data_config
    from utils.data.datasets import DatasetOptions
    from utils.data.loader import close_mosaic, create_dataloader

    hyp = {"mosaic": 1.0, "fliplr": 0.0}
    options = DatasetOptions(img_size=64, batch_size=8, augment=True, hyp=hyp, nc=3)
    loader, dataset = create_dataloader(load_data_config(tiny_dataset).train, options, workers=1, shuffle=True)
    assert loader.persistent_workers and dataset.mosaic
    assert all(shape is None for _, _, _, shapes in loader for shape in shapes)  # every sample a mosaic
    assert close_mosaic(loader) and not dataset.mosaic
    assert all(shape is not None for _, _, _, shapes in loader for shape in shapes)  # the workers' copy too
    assert not close_mosaic(loader)  # closed already: nothing to do
    assert not close_mosaic([("fixed", "batches")])  # batches given in code have no dataset
