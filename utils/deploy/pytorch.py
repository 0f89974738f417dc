"""The .pt checkpoint itself as a format: what every export starts from and is compared with."""

from __future__ import annotations

from pathlib import Path

import torch

from utils.deploy.formats import ExportFormat, LoadedModel, LoadOptions, export_metadata


class PyTorchFormat(ExportFormat):
    """A checkpoint of this project or a YOLOv5 release file, run by PyTorch (fused, eval mode)."""

    name = "pytorch"
    suffix = ".pt"
    exportable = False

    def load(self, file: Path, options: LoadOptions) -> LoadedModel:
        from utils.weights.checkpoint import load_model, trained_img_size

        model, ckpt = load_model(file, options.device, fuse=True, trusted=options.trusted)
        size = trained_img_size(ckpt) or 0  # recorded as the default size of a dynamic model
        model = model.half() if options.half else model
        dtype = torch.float16 if options.half else torch.float32

        def run(images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
            return model(images.to(options.device, dtype))  # rows, or (rows, prototypes): the runtime checks them

        meta = export_metadata(model, (size, size), 1, dynamic=True, half=options.half)
        return LoadedModel(run, meta, input_dtype=dtype, module=model)


FORMAT = PyTorchFormat()
