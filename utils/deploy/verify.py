"""Proof that an export computes what the .pt computes: float formats against PyTorch on the same letterboxed
batches (each output component on its own scale, read as the output contract lays the rows out; a task's extra
columns and other outputs too: a segmenter's mask coefficients and prototypes), INT8 formats by mAP on --data
against the float model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from utils.deploy.formats import MAX_INT8_MAP_DROP, ExportFormat, ExportOptions, FormatError, Tolerance
from utils.deploy.runtime import InferenceModel
from utils.evaluation.results import EvalResult
from utils.evaluation.task_outputs import outputs_of
from utils.log import LOGGER
from utils.tasks.contract import ContractError, OutputContract
from utils.tasks.registry import BASE_TASK, get_task

if TYPE_CHECKING:
    from utils.evaluation.evaluate import EvalResult


class VerificationError(RuntimeError):
    """An export whose outputs are not the .pt's within the stated tolerance."""


@dataclass
class Verification:
    """What a check measured: the largest box and score differences (float), or both mAPs (INT8)."""

    box_error: float | None = None  # fraction of the input's longer side
    score_error: float | None = None
    extra_error: float | None = None  # a task's columns and other outputs, relative to their largest magnitude
    extra_noun: str = ""  # what they hold (a segmenter's masks)
    map_reference: float | None = None  # mAP@.5:.95 of the float model on --data (a classifier's top-1 accuracy)
    map_export: float | None = None
    metric: str = EvalResult.MAP_LABEL  # what the two measure (the evaluation's own name for its ``map``)
    read_back: str | None = None  # a format without a runtime here: what was read back from the written file
    boxes: bool = True  # whether the rows hold boxes (a classifier's do not: its box error is 0 and not described)

    def describe(self) -> str:
        if self.read_back is not None:
            return self.read_back
        if self.map_export is not None:
            return (f"{self.metric} {self.map_export:.4f} vs {self.map_reference:.4f} float "
                    f"(drop {self.map_reference - self.map_export:+.4f}, limit {MAX_INT8_MAP_DROP})")
        extra = "" if self.extra_error is None else f", {self.extra_noun} {self.extra_error:.1e}"
        boxes = f"boxes {self.box_error:.1e} x size, " if self.boxes else ""
        return f"max error {boxes}scores {self.score_error:.1e}{extra}"


def output_errors(reference: torch.Tensor, output: torch.Tensor, contract: OutputContract | None = None,
                  margin: float = 1e-3) -> tuple[float, float]:
    """The largest differences between two decoded outputs laid out as ``contract`` says (default: YOLOv5's): of the
    boxes (the 4 box columns, input pixels) and of the scores (objectness and class scores, or an end-to-end
    row's score, or a classifier's probabilities: there are no boxes then). An end-to-end head's final rows are
    its top candidates: each reference row is paired with the output row of its class nearest to its box (rows
    of near-equal scores may swap places), and rows within ``margin`` of the lowest kept score are left out (a
    candidate that ties the cut-off may be kept by one runtime and not the other); a task's extra columns are
    not compared (``extra_errors``)."""
    if reference.shape != output.shape:
        raise VerificationError(f"output shape {tuple(output.shape)} differs from PyTorch's {tuple(reference.shape)}")
    contract = contract or OutputContract("xywh_obj_cls", reference.shape[-1] - 5)
    reference, output = reference.float().cpu(), output.float().cpu()
    if reference.numel() == 0:
        return 0.0, 0.0
    if contract.rank == 2:  # no rows of boxes: one row of class probabilities per image (a classifier's)
        return 0.0, float((reference - output).abs().max())
    if contract.end_to_end:
        inside = reference[..., 4] > reference[..., 4].amin(1, keepdim=True) + margin  # (b, n) surely in the top k
        output = torch.stack([_paired_rows(r, o) for r, o in zip(reference, output)])
        if not torch.equal(reference[..., 5][inside], output[..., 5][inside]):
            raise VerificationError("an exported detection has another class than PyTorch's")
        reference, output = reference[inside], output[inside]  # (k, 6 + extra)
        if reference.numel() == 0:
            return 0.0, 0.0
        scores = slice(4, 5)
    else:
        scores = slice(4, contract.columns - contract.extra)
    difference = (reference - output).abs()
    return float(difference[..., :4].max()), float(difference[..., scores].max())


def extra_errors(reference: tuple[torch.Tensor, ...], output: tuple[torch.Tensor, ...],
                 contract: OutputContract, margin: float = 1e-3) -> float:
    """The largest difference in a task's extra columns (the rows' last ``extra``) and in its other outputs (a
    segmenter's mask coefficients and prototypes), each relative to its largest magnitude in PyTorch's output
    (neither is bounded like a score); an end-to-end head's rows are paired first as ``output_errors`` pairs them
    (rows within ``margin`` of the lowest kept score left out)."""
    pairs = []
    for name, a, b in zip(contract.outputs[1:], reference[1:], output[1:]):
        if a.shape != b.shape:
            raise VerificationError(f"{name} of shape {tuple(b.shape)}, PyTorch's {tuple(a.shape)}")
        pairs.append((a.float().cpu(), b.float().cpu()))
    if contract.extra:
        columns = slice(-contract.extra, None)
        rows, other = reference[0].float().cpu(), output[0].float().cpu()
        if contract.end_to_end and rows.numel():
            inside = rows[..., 4] > rows[..., 4].amin(1, keepdim=True) + margin
            other = torch.stack([_paired_rows(r, o) for r, o in zip(rows, other)])
            rows, other = rows[inside], other[inside]
        pairs.append((rows[..., columns], other[..., columns]))
    return max((float((a - b).abs().max() / a.abs().max().clamp(min=1e-6)) for a, b in pairs if a.numel()),
               default=0.0)


def _paired_rows(reference: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """``output``'s rows (n, 6 + extra) reordered to pair ``reference``'s: for each reference row, the output row of
    the same class with the nearest box (largest coordinate difference)."""
    distance = (reference[:, None, :4] - output[None, :, :4]).abs().amax(-1)  # (n, n)
    distance[reference[:, None, 5] != output[None, :, 5]] = float("inf")
    return output[distance.argmin(1)]


def verify_float(file: Path, model: nn.Module, checks: list[torch.Tensor], tolerance: Tolerance,
                 device: torch.device) -> Verification:
    """Run ``file`` through InferenceModel on each batch of ``checks``; VerificationError when a box differs by
    more than ``tolerance.box`` of the input's longer side or a score by more than ``tolerance.score``, or when
    the file's output contract is not the model's."""
    inference = InferenceModel(file, device, trusted=True)  # the file export.py just wrote
    if inference.contract != model.head.contract:
        raise VerificationError(f"{file} records the output contract {inference.contract}, the model has "
                                f"{model.head.contract}")
    contract = inference.contract
    several, extra = len(contract.outputs) > 1, bool(contract.extra or len(contract.outputs) > 1)
    task = get_task(contract.task)
    boxes = contract.has_boxes
    worst = Verification(box_error=0.0, score_error=0.0, extra_error=0.0 if extra else None,
                         extra_noun=task.results_noun, boxes=boxes)
    with torch.no_grad():
        for images in checks:
            reference, output = model(images), inference(images)
            reference, output = (tuple(reference), tuple(output)) if several else ((reference,), (output,))
            box_px, score = output_errors(reference[0], output[0], contract, tolerance.score)
            box = box_px / max(images.shape[-2:])
            if box > tolerance.box or score > tolerance.score:
                raise VerificationError(f"output differs from PyTorch: boxes by {box_px:.2e} px ({box:.1e} x image "
                                        f"size), scores by {score:.1e} (limit {tolerance.describe()})")
            error = extra_errors(reference, output, contract, tolerance.score) if extra else None
            if error is not None and error > tolerance.score:
                what = " or ".join([*([task.columns] if contract.extra else []), *contract.outputs[1:]])
                raise VerificationError(f"{what} differ from PyTorch's by {error:.1e} of their largest magnitude "
                                        f"(limit {tolerance.score:.0e})")
            worst = Verification(max(worst.box_error, box), max(worst.score_error, score),
                                 None if error is None else max(worst.extra_error, error), task.results_noun,
                                 boxes=boxes)
    return worst


def verify_written(fmt: ExportFormat, file: Path, images: torch.Tensor, meta: dict) -> Verification:
    """A format that cannot run here: its own tools read the file back, with the input shape, one output and the
    metadata export.py wrote; VerificationError otherwise."""
    found = fmt.read_back(file)
    outputs = len(recorded_outputs(meta))  # the rows, then the task's other outputs
    problems = [what for what, ok in (("input", found["inputs"] == {"images": list(images.shape)}),
                                      ("output", len(found["outputs"]) == outputs), ("metadata", found["meta"] == meta))
                if not ok]
    if problems:
        raise VerificationError(f"{file} read back with a different {', '.join(problems)}: {found}")
    return Verification(read_back=f"read back: input images {list(images.shape)}, output "
                                  f"{', '.join(map(str, found['outputs']))}, metadata; not run "
                                  f"({fmt.runs_where.split(';')[0]})")


def recorded_outputs(meta: dict) -> tuple[str, ...]:
    """The outputs the contract in ``meta`` (export.py's own metadata) promises: the rows, then its task's others."""
    try:
        return OutputContract.from_metadata((meta.get("head") or {}).get("contract"), nc=len(meta.get("names") or
                                                                                         [0])).outputs
    except ContractError:
        return ("rows",)


def spread(items: list, count: int) -> list:
    """At most ``count`` of ``items``, evenly spaced (a bounded sample that covers the whole list)."""
    if len(items) <= count:
        return list(items)
    return [items[i] for i in np.linspace(0, len(items) - 1, count).round().astype(int)]


def model_task(module: nn.Module) -> str:
    """The task of ``module``'s head (the base task's when it has none)."""
    return getattr(getattr(module, "head", None), "task", BASE_TASK)


def calibration_batches(data_yaml: str, options: ExportOptions, stride: int,
                        task: str | None = None) -> list[torch.Tensor]:
    """At most ``options.calib_images`` training images of ``data_yaml``, fitted to the export's input size as
    ``task``'s model reads them (letterboxed; a classifier's centre-cropped: its TaskOutputs.fit_input), in batches
    of the export's batch size (float in [0, 1])."""
    from utils.data.config import load_data_config
    from utils.data.image_io import ImageRefused, read_image
    from utils.data.label_cache import list_image_files
    from utils.data.sources import network_input

    files = spread(list_image_files(load_data_config(data_yaml).train), options.calib_images)
    fit = outputs_of(task).fit_input
    images, refused = [], 0
    for file in files:
        try:  # the same bounded, header-checked reader as training: a calibration image is a file from a stranger
            image = read_image(file)
        except ImageRefused as e:
            refused += 1
            LOGGER.warning(f"INT8 calibration: {file} skipped: {e}")
            continue
        images.append(torch.from_numpy(network_input(image, options.img_size, stride, False, fit)[0]))
    if refused:
        LOGGER.warning(f"INT8 calibration: {refused} of {len(files)} images skipped")
    if not images:
        raise FormatError(f"--data {data_yaml}: no readable training images to calibrate --int8 on")
    usable = len(images) - len(images) % options.batch_size or len(images)
    batch = torch.stack(images[:usable]).float() / 255
    LOGGER.info(f"INT8 calibration on {len(batch)} training images of {data_yaml}")
    return list(batch.split(options.batch_size))


def map_on_data(module: nn.Module, data_yaml: str, options: ExportOptions, stride: int,
                task: str | None = None) -> float:
    """Box mAP@.5:.95 of ``module`` on at most ``options.verify_images`` validation images of ``data_yaml``, its
    labels read as ``task`` reads them (default: the module's head's task)."""
    return evaluate_on_data(module, data_yaml, options, stride, task).map


def evaluate_on_data(module: nn.Module, data_yaml: str, options: ExportOptions, stride: int,
                     task: str | None = None) -> EvalResult:
    """map_on_data's validation pass (square ``options.img_size`` inputs, test.py's thresholds) and all it measured:
    box P, R, mAP@.5 and mAP@.5:.95, and each view of its task's metric beside them."""
    task = task or model_task(module)
    from utils.data.config import load_data_config
    from utils.data.datasets import DatasetOptions
    from utils.data.label_cache import list_image_files
    from utils.data.loader import create_dataloader
    from utils.evaluation.evaluate import EvalOptions, evaluate

    if options.img_size[0] != options.img_size[1]:
        raise FormatError(f"--int8 measures mAP on square images; give one --img-size (not {list(options.img_size)})")
    data = load_data_config(data_yaml)
    files = spread(list_image_files(data.val), options.verify_images)
    dataset_options = DatasetOptions(img_size=options.img_size[0], batch_size=options.batch_size, stride=stride,
                                     nc=data.nc, names=data.names, task=task, task_options=data.task_options)
    loader, _ = create_dataloader(files, dataset_options, workers=0)
    device = next(iter(module.parameters()), torch.zeros(0)).device
    return evaluate(module, loader, device, data.names, EvalOptions())


def verify_int8(file: Path, model: nn.Module, options: ExportOptions, stride: int,
                reference_map: float | None = None) -> Verification:
    """mAP of the INT8 ``file`` and of the float ``model`` on --data (a classifier's top-1 accuracy: the evaluation's
    ``map``, named by its MAP_LABEL); VerificationError when the drop exceeds MAX_INT8_MAP_DROP."""
    task = model_task(model)
    reference = map_on_data(model, options.data, options, stride, task) if reference_map is None else reference_map
    exported = evaluate_on_data(InferenceModel(file, trusted=True).as_module(), options.data, options, stride, task)
    result = Verification(map_reference=reference, map_export=exported.map, metric=exported.MAP_LABEL)
    if reference - exported.map > MAX_INT8_MAP_DROP:
        raise VerificationError(f"INT8 {result.describe()}")
    return result
