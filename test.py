"""Validate a checkpoint on a data set's val (or train/test) split: P, R, mAP@.5, mAP@.5:.95, speed.

    python test.py --weights runs/train/exp/weights/best.pt --data data/synthetic.yaml --img 160
    python test.py --weights yolov5s.pt --data coco128.yaml --augment     # release name: downloaded when missing
    python test.py --weights best.onnx --task speed                       # any export; timing only
    python test.py --weights best.pt --device cpu --nproc-per-node 2      # 2 processes, each a shard of the images
    python -m torch.distributed.run --nproc_per_node 2 test.py --weights best.pt --device cpu   # the same

Under torchrun every rank validates its shard of the images and the statistics are gathered, so the
metrics equal a 1-process run. ``val.py`` is this script under YOLOv5's newer name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import utils.distributed.openmp  # noqa: F401  first: it sets OpenMP's wait before torch loads

# isort: split
import torch

from utils import api
from utils.cli import (
    DISTRIBUTED,
    Parser,
    add_flags,
    add_refused_flags,
    check_refused_flags,
    collapse_weights,
    distributed_session,
    one_weights,
    project_dir,
    square_size,
    visible_options,
)
from utils.data.annotations import AnnotationSplit
from utils.data.coco_json import CocoIds, coco_ids
from utils.data.config import DataConfig, DataError, load_data_config
from utils.data.datasets import DatasetOptions
from utils.data.loader import create_dataloader
from utils.deploy.runtime import InferenceModel, check_img_size, default_img_size, resolve_weights_arg
from utils.device import check_half
from utils.distributed import comm as dist
from utils.errors import UserError
from utils.evaluation.evaluate import EvalOptions, EvalResult, evaluate, measure_speed
from utils.evaluation.outputs import write_study
from utils.evaluation.tta import merges
from utils.log import LOGGER, colorstr, print_options
from utils.paths import discarded_on_failure, new_run_folder
from utils.tasks.registry import get_task

TASKS = ("train", "val", "test", "speed", "study")


class TestError(UserError, ValueError):
    """Bad test.py options (a split the data set lacks, a batch size the world size does not divide)."""

    __test__ = False  # not a pytest test class


def build_parser(script: str = "test") -> argparse.ArgumentParser:
    """test.py's parser; ``script='val'`` for val.py."""
    p = Parser(prog=f"{script}.py", description="Validate a checkpoint (mAP@.5, mAP@.5:.95, speed)")
    add_flags(p, "weights", nargs={"weights": "+"})
    add_flags(p, "trust_weights", "data", "img_size", "batch_size", "conf_thres", "iou_thres", "max_det",
              img_size=None)
    p.add_argument("--task", default="val", choices=TASKS, help="split to validate (train, val, test), 'speed' "
                   "(timing only) or 'study' (mAP and speed at each --study-sizes)")
    p.add_argument("--study-sizes", nargs=3, type=int, default=[256, 1536, 128], metavar=("START", "STOP", "STEP"),
                   help="--task study: image sizes from START to STOP (included) every STEP")
    add_flags(p, "device", "workers", "single_cls", "augment", "agnostic_nms", "half")
    p.add_argument("--verbose", action="store_true", help="report mAP per class")
    add_flags(p, "save_txt")
    p.add_argument("--save-hybrid", action="store_true", help="save labels and predictions together to labels/*.txt "
                   "(auto-labelling; the reported mAP then counts the labels too)")
    add_flags(p, "save_conf")
    p.add_argument("--save-json", action="store_true", help="save a COCO-format predictions JSON (a COCO JSON "
                   "split's own ids)")
    add_flags(p, "project", "name", "exist_ok", *DISTRIBUTED)
    add_refused_flags(p, "dnn")
    return p


def parse_opt(argv: list[str] | None = None, script: str = "test") -> argparse.Namespace:
    """test.py's options (``argv=None`` reads sys.argv); ``script='val'`` for val.py (runs/val, its messages)."""
    p = build_parser(script)
    opt = square_size(p, p.parse_args(argv))
    opt.weights = collapse_weights(opt.weights)
    opt.project = project_dir(opt, script)
    return opt


def main(opt: argparse.Namespace, script: str = "test") -> EvalResult | list[EvalResult]:
    """Join the process group (under torchrun), validate, and always tear the group down."""
    with distributed_session(opt, script) as device:
        print_options(script, visible_options(opt), visible_options(parse_opt([], script=script)))
        return run_task(opt, device)


def run(*, script: str = "test", nproc_per_node: int | None = None, **options: Any) -> EvalResult | list[EvalResult]:
    """test.py from Python: ``test.run(weights="best.pt", data="coco128.yaml")`` takes the command line's option
    names (utils/api.py) and returns the EvalResult (P, R, mAP@.5, mAP@.5:.95, per-class AP, speed; a list of
    them for --task study). Called inside a torchrun job, every rank validates its shard; ``nproc_per_node=N`` or
    several GPUs in ``device`` start the processes here, as on the command line, and return rank 0's result.
    Errors are the UserErrors the command line prints."""
    argv = api.to_argv(build_parser(script), {**options, "nproc_per_node": nproc_per_node}, script)
    opt = api.parse(lambda a: parse_opt(a, script=script), argv, script)
    processes = api.processes(opt)
    if processes == 1:
        return main(opt, script=script)
    return api.launch(_launched, processes, argv, script)


def _launched(argv: list[str], script: str) -> api.RankOutcome:
    """One process of ``run(nproc_per_node=N)``."""
    return api.outcome(lambda: main(parse_opt(argv, script=script), script=script))


def _split(data: DataConfig, task: str) -> list[Path]:
    if task == "test":
        if not data.test:
            raise TestError(f"--task test: {data.yaml_file} has no 'test' split; add one or use --task val")
        return data.test
    return data.train if task == "train" else data.val


def _coco_annotations(data: DataConfig, sources: list, save_json: bool) -> tuple[Path | None, CocoIds | None]:
    """The annotation file pycocotools scores against, and the ids the predictions JSON must use: a COCO JSON
    split's own file and ids (read only for --save-json), else COCO's instances JSON where a COCO data set keeps
    it, with COCO's 91 category ids."""
    if len(sources) == 1 and isinstance(sources[0], AnnotationSplit) and sources[0].format == "coco":
        return sources[0].annotations, coco_ids(sources[0]) if save_json else None
    if not data.is_coco:
        return None, None
    return Path(data.root) / "annotations" / "instances_val2017.json", None


def check_options(opt: argparse.Namespace, model: InferenceModel) -> None:
    """Refuse what cannot work with these weights; warn that --save-hybrid's mAP is not the model's."""
    if opt.augment and model.contract.end_to_end:
        raise TestError(f"--augment merges three passes before NMS; {model.weights.name} returns final rows "
                        f"({model.contract.layout}, no NMS): drop --augment")
    if opt.augment and not merges(model.contract):
        task = get_task(model.contract.task)
        raise TestError(f"--augment merges boxes of three passes; {model.weights.name} is {task.model_noun}, whose "
                        f"{task.results_noun} it does not merge: drop --augment")
    fixed = f"{model.weights.name} is a static export (one input size)"
    if not model.dynamic and (opt.augment or opt.task == "study"):
        flag = "--augment runs 3 image sizes" if opt.augment else "--task study runs several image sizes"
        raise TestError(f"{flag}; {fixed}: export it with --dynamic, or use the .pt")
    if model.img_size is not None and model.img_size[0] != model.img_size[1]:
        raise TestError(f"{fixed} of {list(model.img_size)} pixels; test.py validates square images: export it "
                        "with one --img-size or with --dynamic")
    if opt.save_hybrid:
        opt.save_txt = True
        LOGGER.warning("WARNING: --save-hybrid adds the labels to the predictions (for auto-labelling): the mAP it "
                       "reports is not the model's")


def image_size(opt: argparse.Namespace, model: InferenceModel, size: int) -> int:
    """``size`` on the stride grid; a static export's own size (with a warning) when it differs."""
    size = check_img_size([size], model.stride)[0]
    if model.img_size is not None and model.img_size[0] != size:
        LOGGER.warning(f"WARNING: {model.weights.name} was exported for {model.img_size[0]} px inputs; "
                       f"using that instead of --img-size {size}")
        size = model.img_size[0]
    return size


def run_task(opt: argparse.Namespace, device: torch.device) -> EvalResult | list[EvalResult]:
    """Load the weights and data, then validate, time (--task speed) or study sizes. All ranks must call it."""
    check_refused_flags(opt)
    check_half(opt.half, device)
    weights = resolve_weights_arg(one_weights(opt.weights))
    model = InferenceModel(weights, device, trusted=opt.trust_weights)
    check_options(opt, model)
    data = load_data_config(opt.data)
    if len(model.names) != data.nc and not opt.single_cls:
        raise TestError(f"--weights {weights} predicts {len(model.names)} classes but {data.yaml_file} has "
                        f"{data.nc}; pass the data set the model was trained on, or --single-cls")
    save_dir = dist.main_decides(lambda: new_run_folder(opt.project, opt.name, opt.exist_ok))
    with discarded_on_failure(save_dir, enabled=dist.is_main_process()):  # a failed start leaves no empty folder
        if opt.task != "study":
            size = default_img_size([opt.img_size] if opt.img_size else None, model)[0]
            result = validate(opt, model, data, device, save_dir, image_size(opt, model, size))
        else:
            result = study(opt, model, data, device, save_dir, weights)
    LOGGER.info(f"Results saved to {colorstr('bold', str(save_dir))}")
    return result


def validate(opt: argparse.Namespace, model: InferenceModel, data: DataConfig, device: torch.device,
             save_dir: Path, img_size: int) -> EvalResult:
    """One pass over the split at ``img_size``: metrics and outputs, timing only (--task speed), or metrics
    without plots and JSON (one size of --task study)."""
    speed_only, files = opt.task == "speed", opt.task not in ("speed", "study")
    split = opt.task if opt.task in ("train", "test") else "val"
    module = model.as_module()
    options = DatasetOptions(img_size=img_size, batch_size=dist.batch_per_rank(opt.batch_size), stride=model.stride,
                             rect=model.dynamic, pad=0.5, nc=data.nc, prefix=colorstr(f"{opt.task}: "),
                             single_cls=opt.single_cls, names=data.names,
                             task=model.contract.task, task_options=data.task_options)  # what its task's samples carry
    sources = _split(data, split)
    loader, dataset = create_dataloader(sources, options, workers=opt.workers, shard_eval=True)
    if not speed_only and sum(len(labels) for labels in dataset.labels) == 0:
        raise DataError(f"{opt.task} split of {data.yaml_file} has no labels (looked for .txt files in labels/ "
                        "next to images/); metrics need labels")
    anno_json, ids = _coco_annotations(data, sources, opt.save_json and files)
    with torch.no_grad():  # warm-up: first-call costs stay out of the timing
        module(torch.zeros(1, 3, img_size, img_size, device=device))
    options = EvalOptions(conf_thres=opt.conf_thres, iou_thres=opt.iou_thres, max_det=opt.max_det,
                          single_cls=opt.single_cls, agnostic=opt.agnostic_nms, half=opt.half,
                          save_dir=save_dir, plots=files, save_json=opt.save_json and files,
                          save_txt=opt.save_txt, save_conf=opt.save_conf, verbose=opt.verbose, is_coco=data.is_coco,
                          anno_json=anno_json, coco_ids=ids, augment=opt.augment, save_hybrid=opt.save_hybrid)
    if speed_only:
        return measure_speed(module, loader, device, options)
    return evaluate(module, loader, device, data.names, options)


def study_sizes(spec: list[int]) -> list[int]:
    """--study-sizes START STOP STEP as the list of sizes (STOP included)."""
    start, stop, step = spec
    if start < 1 or stop < start or step < 1:
        raise TestError(f"--study-sizes {start} {stop} {step}: need 1 <= START <= STOP and STEP >= 1")
    return list(range(start, stop + 1, step))


def study(opt: argparse.Namespace, model: InferenceModel, data: DataConfig, device: torch.device, save_dir: Path,
          weights: Path) -> list[EvalResult]:
    """--task study: validate at every --study-sizes size; study_<data>_<weights>.txt and study.png (rank 0)."""
    sizes = study_sizes(opt.study_sizes)
    results = []
    for size in sizes:
        LOGGER.info(f"\nStudy: --img-size {size}")
        results.append(validate(opt, model, data, device, save_dir, image_size(opt, model, size)))
    if dist.is_main_process():
        from utils.plots.figures import plot_study

        table = write_study(save_dir / f"study_{Path(data.yaml_file).stem}_{weights.stem}.txt", sizes, results)
        plot_study(table, save_dir / "study.png")
        LOGGER.info(f"Study: {len(sizes)} image sizes written to {table} and {save_dir / 'study.png'}")
    return results


if __name__ == "__main__":
    sys.exit(api.command_line(__file__, parse_opt, main))
