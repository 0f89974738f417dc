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
from utils.backends import check_img_size
from utils.checkpoint import load_model
from utils.cli import add_distributed_flags, distributed_session, run_main
from utils.datasets import DataError, load_data_config
from utils.engine import EvalResult, evaluate
from utils.errors import UserError
from utils.loader import create_dataloader
from utils.logging import LOGGER, colorstr, print_options
from utils.paths import ROOT, increment_path


class TestError(UserError, ValueError):
    """Bad test.py options (a split the data set lacks, a batch size the world size does not divide)."""

    __test__ = False  # not a pytest test class


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="test.py", description="Validate a checkpoint (mAP@.5, mAP@.5:.95, speed)")
    p.add_argument("--weights", default=str(ROOT / "runs" / "train" / "exp" / "weights" / "best.pt"),
                   help="checkpoint written by train.py")
    p.add_argument("--trust-weights", action="store_true", help="allow full unpickling of --weights (trusted only)")
    p.add_argument("--data", default=str(ROOT / "data" / "synthetic.yaml"), help="dataset YAML")
    p.add_argument("--img-size", "--imgsz", "--img", dest="img_size", type=int, default=640,
                   help="inference size (pixels), rounded up to a multiple of the model's stride")
    p.add_argument("--batch-size", type=int, default=32, help="total batch over all ranks")
    p.add_argument("--conf-thres", type=float, default=0.001, help="confidence threshold")
    p.add_argument("--iou-thres", type=float, default=0.6, help="NMS IoU threshold")
    p.add_argument("--max-det", type=int, default=300, help="maximum detections per image")
    p.add_argument("--task", default="val", choices=["val", "test", "speed"], help="split to run, or speed only")
    p.add_argument("--device", default="", help="'cpu', a GPU '0', or GPUs '0,1' (one per local rank)")
    p.add_argument("--workers", type=int, default=8, help="max dataloader workers per rank")
    p.add_argument("--single-cls", action="store_true", help="treat every class as one")
    p.add_argument("--agnostic-nms", action="store_true", help="class-agnostic NMS")
    p.add_argument("--half", action="store_true", help="FP16 inference (CUDA only)")
    p.add_argument("--verbose", action="store_true", help="report mAP per class")
    p.add_argument("--save-txt", action="store_true", help="save results to labels/*.txt")
    p.add_argument("--save-conf", action="store_true", help="save confidences in --save-txt labels")
    p.add_argument("--save-json", action="store_true", help="save a COCO-format predictions JSON")
    p.add_argument("--project", default=str(ROOT / "runs" / "test"), help="save to project/name")
    p.add_argument("--name", default="exp", help="save to project/name")
    p.add_argument("--exist-ok", action="store_true", help="reuse project/name instead of incrementing")
    add_distributed_flags(p, long_wait="label cache")
    return p.parse_args(argv)


def main(opt: argparse.Namespace) -> EvalResult:
    """Join the process group (under torchrun), validate, and always tear the group down."""
    with distributed_session(opt) as device:
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
    world = dist.get_world_size()
    if opt.batch_size < 1 or opt.batch_size % world:
        raise TestError(f"--batch-size {opt.batch_size} must be a positive multiple of the world size {world}")
    model, _ = load_model(opt.weights, device, fuse=True, trusted=opt.trust_weights)
    data = load_data_config(opt.data)
    if model.nc != data.nc and not opt.single_cls:
        raise TestError(f"--weights {opt.weights} predicts {model.nc} classes but {data.yaml_file} has {data.nc}; "
                        "pass the data set the model was trained on, or --single-cls")
    stride = int(model.stride.max())
    img_size = check_img_size([opt.img_size], stride)[0]
    speed_only = opt.task == "speed"
    chosen = str(increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok, mkdir=True)) \
        if dist.is_main_process() else None
    save_dir = Path(dist.broadcast_object(chosen))
    loader, dataset = create_dataloader(_split(data, opt.task), img_size, opt.batch_size // world, stride, rect=True,
                                        pad=0.5, workers=opt.workers, prefix=colorstr(f"{opt.task}: "),
                                        single_cls=opt.single_cls, shard_eval=True, nc=data.nc, names=data.names)
    if not speed_only and sum(len(labels) for labels in dataset.labels) == 0:
        raise DataError(f"{opt.task} split of {data.yaml_file} has no labels (looked for .txt files in labels/ "
                        "next to images/); metrics need labels")
    with torch.no_grad():  # warm-up: first-call costs stay out of the timing
        model(torch.zeros(1, 3, img_size, img_size, device=device))
    result = evaluate(model, loader, device=device, names=data.names, conf_thres=opt.conf_thres,
                      iou_thres=opt.iou_thres, max_det=opt.max_det, single_cls=opt.single_cls,
                      half=opt.half and device.type == "cuda", save_dir=save_dir, plots=not speed_only,
                      save_json=opt.save_json and not speed_only, save_txt=opt.save_txt, save_conf=opt.save_conf,
                      verbose=opt.verbose, is_coco=data.is_coco, agnostic=opt.agnostic_nms,
                      anno_json=_coco_annotations(data))
    LOGGER.info(f"Results saved to {colorstr('bold', str(save_dir))}")
    return result


if __name__ == "__main__":
    sys.exit(run_main(main, parse_opt(), "test"))
