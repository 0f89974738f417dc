"""NCNN (Tencent's mobile inference library): ``<stem>_ncnn_model/`` with model.ncnn.param/.bin written by pnnx
from a TorchScript trace, and metadata.yaml. For an anchor-based head (its export metadata has anchors) the graph
ends at the head's raw maps and the boxes are decoded here with the head's own code (the Detect module rebuilt
from the metadata), as pnnx does not keep that decoding exact; other heads' graphs end at their decoded output. A
segmenter's prototypes are its last output."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
from utils.predictions import MAX_MASKS

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


def head_from_metadata(meta: dict, source: object = "metadata") -> nn.Module:
    """The Detect head (anchors and strides from the metadata, no convolutions) whose decode() turns raw maps into
    (b, n, 5 + nc) (YOLOv5's row layout), a Segment head's when the metadata records ``nm`` mask coefficients
    (rows (b, n, 5 + nc + nm)); the fields are checked first (check_metadata), one FormatError line otherwise."""
    from models.segment import Segment
    from models.yolo import Detect

    meta = check_metadata(meta, source)
    missing = [key for key in ("names", "anchors", "strides") if key not in meta]
    if missing:
        raise FormatError(f"{source}: its metadata lacks {', '.join(missing)}; re-export it with export.py")
    anchors = [[v for pair in level for v in pair] for level in meta["anchors"]]
    nm = mask_count(meta)
    head = Segment.decoder(len(meta["names"]), anchors, nm) if nm else Detect(len(meta["names"]), anchors, ())
    head.stride.copy_(torch.tensor(meta["strides"]))
    return head.eval()


def mask_count(meta: dict) -> int:
    """The mask coefficients per row the (checked) metadata records: 0 for a detector."""
    nm = (meta.get("head") or {}).get("nm", 0)
    return nm if isinstance(nm, int) and not isinstance(nm, bool) and 0 <= nm <= MAX_MASKS else 0


class NcnnFormat(ExportFormat):
    """``best_ncnn_model/``, run by the ncnn Python package on the CPU (FP32 arithmetic), one image at a time."""

    name = "ncnn"
    suffix = "_ncnn_model"
    is_folder = True
    export_packages = (("pnnx", "pnnx"),)
    runtime_packages = (("ncnn", "ncnn"),)

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        import pnnx

        file.mkdir(parents=True, exist_ok=True)
        anchors = meta.get("head", {}).get("anchors") or model.head.export_metadata().get("anchors")
        traced_file = file / "traced.pt"
        scratch = {key: str(file / name) for key, name in (("pnnxparam", "p.param"), ("pnnxbin", "p.bin"),
                                                           ("pnnxpy", "p.py"), ("pnnxonnx", "p.onnx"),
                                                           ("ncnnpy", "n.py"))}
        try:
            with quiet_jit_warnings():
                graph = RawMaps(model) if anchors else model  # anchors: the boxes are decoded at load time
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
        # an anchor-based head's graph ends at its raw maps, decoded here; other heads' graphs end decoded
        head = head_from_metadata(meta, file) if "anchors" in meta else None
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

        segments = mask_count(meta) > 0

        def run(images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            array = images.detach().cpu().float().numpy()
            per_image = [run_one(image) for image in array]
            maps = [torch.cat(level) for level in zip(*per_image)]  # a segmenter's prototypes last
            rows = head.decode(maps[:head.nl]) if head is not None else maps[0]
            return (rows, maps[-1]) if segments else rows

        img_size = meta.get("img_size")
        return LoadedModel(run, {**meta, "dynamic": False}, [1, 3, *img_size] if img_size else None)


FORMAT = NcnnFormat()
