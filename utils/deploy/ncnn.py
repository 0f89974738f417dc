"""NCNN (Tencent's mobile inference library): ``<stem>_ncnn_model/`` with model.ncnn.param/.bin written by pnnx
from a TorchScript trace, and metadata.yaml. For an anchor-based head (its export metadata has anchors) the graph
ends at the head's raw maps, as pnnx does not keep that decoding exact; for an end-to-end head (YOLO26) at the raw
rows of its one-to-one branches, as pnnx cannot convert the top-k selection. Both are decoded here by the head's
own code rebuilt from the metadata (utils/deploy/head_maps.py); other heads' graphs end at their decoded output.
A segmenter's prototypes are its last output."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from utils.deploy.formats import (
    ExportFormat,
    ExportOptions,
    FormatError,
    LoadedModel,
    LoadOptions,
    check_metadata,
    first_line,
    quiet_jit_warnings,
    read_metadata_yaml,
    require,
)
from utils.deploy.head_maps import RawMapDecoder, head_from_metadata, recorded_contract
from utils.tasks.contract import ContractError, OutputContract

PARAM, BIN, METADATA = "model.ncnn.param", "model.ncnn.bin", "metadata.yaml"


class RawMaps(nn.Module):
    """The model with its head in training mode (raw maps out) while every other layer stays in eval mode."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        self.model.head.train()
        try:
            return self.model(images)
        finally:
            self.model.head.eval()


class RawRows(RawMaps):
    """The model ending at its head's raw rows, (b, 4 * reg_max + nc, n), of the branches eval mode runs."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.head.inference_rows(super().forward(images))


def rows_decoder(meta: dict, source: object) -> Callable[[torch.Tensor], torch.Tensor]:
    """Raw rows (b, 4 * reg_max + nc, n) of an image of the metadata's size -> the contract's rows: split into the
    levels' NHWC maps (sizes from the image size and strides), decoded and selected by RawMapDecoder."""
    decoder = RawMapDecoder(meta.get("head"), source)
    h, w = meta.get("img_size") or (0, 0)
    sizes = [(int(h // s), int(w // s)) for s in decoder.head.stride.tolist()]
    if not all(ny * s == h and nx * s == w for (ny, nx), s in zip(sizes, decoder.head.stride.tolist())):
        raise FormatError(f"{source}: its img_size {[h, w]} is not a multiple of every stride; re-export it")

    def decode(rows: torch.Tensor) -> torch.Tensor:
        if rows.dim() != 3 or rows.shape[2] != sum(ny * nx for ny, nx in sizes):
            raise FormatError(f"{source}: expected raw rows of {sum(ny * nx for ny, nx in sizes)} cells, got "
                              f"{tuple(rows.shape)}")
        levels = rows.split([ny * nx for ny, nx in sizes], dim=2)
        return decoder([x.unflatten(2, size).permute(0, 2, 3, 1) for x, size in zip(levels, sizes)])

    return decode


def ends_at_rows(head_meta: Any) -> bool:
    """Whether a graph of this head ends at its raw rows: an end-to-end head's (pnnx cannot convert its top-k)."""
    try:
        return isinstance(head_meta, dict) and OutputContract.from_metadata(head_meta.get("contract")).end_to_end
    except ContractError:
        return False


def graph_end(model: nn.Module) -> nn.Module:
    """What the traced graph returns: the raw maps of an anchor-based head, the raw rows of an end-to-end one,
    else the decoded output."""
    head = model.head.export_metadata()
    return RawMaps(model) if head.get("anchors") else RawRows(model) if ends_at_rows(head) else model


class NcnnFormat(ExportFormat):
    """``best_ncnn_model/``, run by the ncnn Python package on the CPU (FP32 arithmetic), one image at a time."""

    name = "ncnn"
    suffix = "_ncnn_model"
    is_folder = True
    export_packages = (("pnnx", "pnnx"),)
    runtime_packages = (("ncnn", "ncnn"),)

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        if ends_at_rows(model.head.export_metadata()):  # rows this module cannot decode: refused before converting
            RawMapDecoder(model.head.export_metadata(), file)
        import pnnx

        file.mkdir(parents=True, exist_ok=True)
        anchors = meta.get("head", {}).get("anchors") or model.head.export_metadata().get("anchors")
        graph = graph_end(model)
        traced_file = file / "traced.pt"
        scratch = {key: str(file / name) for key, name in (("pnnxparam", "p.param"), ("pnnxbin", "p.bin"),
                                                           ("pnnxpy", "p.py"), ("pnnxonnx", "p.onnx"),
                                                           ("ncnnpy", "n.py"))}
        try:
            with quiet_jit_warnings():
                torch.jit.trace(graph, images[:1], strict=False, check_trace=False).save(str(traced_file))
            pnnx.convert(str(traced_file), images[:1], ncnnparam=str(file / PARAM), ncnnbin=str(file / BIN),
                         fp16=False, **scratch)
        finally:
            for path in [traced_file, *map(Path, scratch.values())]:
                path.unlink(missing_ok=True)
        if not (file / PARAM).is_file():
            raise RuntimeError("pnnx wrote no model.ncnn.param (see its output above)")
        extra = {"anchors": anchors} if anchors else {}
        (file / METADATA).write_text(yaml.safe_dump({**meta, "batch_size": 1, **extra}, sort_keys=False))
        return file

    def load(self, file: Path, options: LoadOptions) -> LoadedModel:
        require(self.runtime_packages, f"running {file.name}")
        import ncnn

        meta = read_metadata_yaml(file / METADATA, file)
        if not isinstance(meta, dict) or not meta:
            raise FormatError(f"{file} has no {METADATA}; re-export it with export.py --include ncnn")
        meta = check_metadata(meta, file)  # before the runtime reads anything
        # an anchor-based head's graph ends at its raw maps, an end-to-end head's at its raw rows, decoded here
        head = head_from_metadata(meta, file) if "anchors" in meta else None
        rows = rows_decoder(meta, file) if head is None and ends_at_rows(meta.get("head")) else None
        net = ncnn.Net()
        net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = net.opt.use_fp16_packed = False
        net.opt.num_threads = options.threads or net.opt.num_threads
        try:
            if net.load_param(str(file / PARAM)) or net.load_model(str(file / BIN)):
                raise RuntimeError("ncnn could not read the files")
        except RuntimeError as e:
            raise FormatError(f"{file} is not a readable NCNN model ({first_line(e)})") from None
        inputs, outputs = net.input_names(), sorted(net.output_names())

        def run_one(image: np.ndarray) -> list[torch.Tensor]:
            extractor = net.create_extractor()
            extractor.input(inputs[0], ncnn.Mat(np.ascontiguousarray(image)))
            return [torch.from_numpy(np.array(extractor.extract(name)[1]))[None] for name in outputs]

        others = len(recorded_contract(meta, file).outputs) - 1  # the task's other outputs follow the maps

        def run(images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
            array = images.detach().cpu().float().numpy()
            per_image = [run_one(image) for image in array]
            maps = [torch.cat(level) for level in zip(*per_image)]  # a task's other outputs (prototypes) last
            found = (head.decode(maps[:head.nl]) if head is not None else rows(maps[0]) if rows is not None
                     else maps[0])
            return (found, *maps[-others:]) if others else found

        img_size = meta.get("img_size")
        return LoadedModel(run, {**meta, "dynamic": False}, [1, 3, *img_size] if img_size else None)


FORMAT = NcnnFormat()
