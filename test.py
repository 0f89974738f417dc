"""Validate a checkpoint on a data set's val (or test) split: P, R, mAP@.5, mAP@.5:.95, speed.

    python test.py --weights runs/train/exp/weights/best.pt --data data/synthetic.yaml --img 160
    python -m torch.distributed.run --nproc_per_node 2 test.py --weights best.pt --device cpu

Under torchrun every rank validates its shard of the images and the statistics are gathered, so the
metrics equal a 1-process run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from utils import dist
from utils.backends import check_img_size, find_trained_weights
from utils.checkpoint import load_model
from utils.cli import DISTRIBUTED, add_flags, distributed_session, project_dir, run_main, square_size
from utils.data_config import DataError, load_data_config
from utils.datasets import DatasetOptions
from utils.engine import EvalOptions, EvalResult, evaluate
from utils.errors import UserError
from utils.loader import create_dataloader
from utils.log import LOGGER, colorstr, print_options
from utils.paths import increment_path


class TestError(UserError, ValueError):
    """Bad test.py options (a split the data set lacks, a batch size the world size does not divide)."""

    __test__ = False  # not a pytest test class


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    """test.py's options (``argv=None`` reads sys.argv)."""
    p = argparse.ArgumentParser(prog="test.py", description="Validate a checkpoint (mAP@.5, mAP@.5:.95, speed)")
    add_flags(p, "weights", "trust_weights", "data", "img_size", "batch_size", "conf_thres", "iou_thres", "max_det")
    p.add_argument("--task", default="val", choices=["val", "test", "speed"], help="split to run, or speed only")
    add_flags(p, "device", "workers", "single_cls", "agnostic_nms", "half")
    p.add_argument("--verbose", action="store_true", help="report mAP per class")
    add_flags(p, "save_txt", "save_conf")
    p.add_argument("--save-json", action="store_true", help="save a COCO-format predictions JSON")
    add_flags(p, "project", "name", "exist_ok", *DISTRIBUTED)
    opt = square_size(p, p.parse_args(argv))
    opt.project = project_dir(opt, "test")
    return opt


def main(opt: argparse.Namespace) -> EvalResult:
    """Join the process group (under torchrun), validate, and always tear the group down."""
    with distributed_session(opt, "test") as device:
        print_options("test", opt)
        return run(opt, device)


def _split(data: object, task: str) -> list[Path]:
    if task == "test":
        if not data.test:
            raise TestError(f"--task test: {data.yaml_file} has no 'test' split; add one or use --task val")
        return data.test
    return data.val


def _coco_annotations(data: object) -> Path | None:
    """COCO's instances JSON, where a COCO data set keeps it (pycocotools then reports the official mAP)."""
    if not data.is_coco:
        return None
    return Path(data.root) / "annotations" / "instances_val2017.json"


def run(opt: argparse.Namespace, device: torch.device) -> EvalResult:
    """Load the checkpoint and data, build this rank's shard loader, and evaluate. All ranks must call it."""
    batch = dist.batch_per_rank(opt.batch_size)
    weights = opt.weights or find_trained_weights()
    model, _ = load_model(weights, device, fuse=True, trusted=opt.trust_weights)
    data = load_data_config(opt.data)
    if model.nc != data.nc and not opt.single_cls:
        raise TestError(f"--weights {weights} predicts {model.nc} classes but {data.yaml_file} has {data.nc}; "
                        "pass the data set the model was trained on, or --single-cls")
    stride = int(model.stride.max())
    img_size = check_img_size([opt.img_size], stride)[0]
    speed_only = opt.task == "speed"
    save_dir = dist.main_decides(lambda: increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok,
                                                        mkdir=True))
    options = DatasetOptions(img_size=img_size, batch_size=batch, stride=stride, rect=True, pad=0.5, nc=data.nc,
                             prefix=colorstr(f"{opt.task}: "), single_cls=opt.single_cls, names=data.names)
    loader, dataset = create_dataloader(_split(data, opt.task), options, workers=opt.workers, shard_eval=True)
    if not speed_only and sum(len(labels) for labels in dataset.labels) == 0:
        raise DataError(f"{opt.task} split of {data.yaml_file} has no labels (looked for .txt files in labels/ "
                        "next to images/); metrics need labels")
    with torch.no_grad():  # warm-up: first-call costs stay out of the timing
        model(torch.zeros(1, 3, img_size, img_size, device=device))
    options = EvalOptions(conf_thres=opt.conf_thres, iou_thres=opt.iou_thres, max_det=opt.max_det,
                          single_cls=opt.single_cls, agnostic=opt.agnostic_nms, half=opt.half and device.type == "cuda",
                          save_dir=save_dir, plots=not speed_only, save_json=opt.save_json and not speed_only,
                          save_txt=opt.save_txt, save_conf=opt.save_conf, verbose=opt.verbose, is_coco=data.is_coco,
                          anno_json=_coco_annotations(data))
    result = evaluate(model, loader, device, data.names, options)
    LOGGER.info(f"Results saved to {colorstr('bold', str(save_dir))}")
    return result


if __name__ == "__main__":
    sys.exit(run_main(main, parse_opt(), "test"))
