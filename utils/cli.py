"""What the four scripts share on the command line: their parser (no abbreviations, one-line errors naming the
nearest flags, ultralytics' ``key=value`` words), one definition of every common flag, the distributed session,
one-line errors for bad input, and exit codes.

A flag that two scripts have is defined here once (name, aliases, type, help); a script chooses which ones it
takes and may give a different default (``--conf-thres`` is 0.001 for validation, 0.25 for detection).
The spellings YOLOv5's README and CI type (``--batch``, ``--img``, ``--conf``, ``--iou``) are explicit aliases: the
parsers take no abbreviations, so a new flag can never make an old spelling ambiguous. YOLOv5 v7.0 flags that do
not apply here are accepted too (REFUSED) and refused with one line saying what to use.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from utils import paths
from utils.compat.ultralytics import SpellingError, flags_of, nearest, translate
from utils.device import freeze_long_lived, idle_gpus_warning
from utils.distributed import comm as dist
from utils.distributed.launcher import record_error_line
from utils.distributed.signals import StopRequested, ignore_launcher_stop
from utils.errors import UserError
from utils.log import LOGGER, setup_logging
from utils.paths import ROOT

EXIT_USER_ERROR = 2
EXIT_PEER_LOST = 3
EXIT_INTERRUPTED = 130

# name -> (option strings, argparse keywords). Defaults here are the common ones; scripts may override them.
FLAGS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "weights": (("--weights",), {"default": "", "help": "a .pt of this project, a YOLOv5 release file or name "
                                 "(yolov5s.pt, downloaded when missing); detect.py and test.py also run an export "
                                 "(.torchscript, .onnx, *_openvino_model/, *_ncnn_model/); '' = train.py: from "
                                 "scratch, others: the newest runs/train/*/weights/best.pt"}),
    "trust_weights": (("--trust-weights",), {"action": "store_true",
                                             "help": "allow full unpickling of --weights, and TorchScript "
                                             "files and TF SavedModels, which hold code (only for files you trust)"}),
    "data": (("--data",), {"default": str(ROOT / "data" / "synthetic.yaml"), "help": "dataset YAML"}),
    "img_size": (("--img-size", "--imgsz", "--img"), {"dest": "img_size", "nargs": "+", "type": int,
                                                      "default": [640], "help": "image size in pixels: one value "
                                                      "(square), or h w where the script allows; detect.py, test.py "
                                                      "and export.py: default the size the weights were trained at "
                                                      "(else 640)"}),
    "batch_size": (("--batch-size", "--batch"), {"type": int, "default": 32,
                                       "help": "batch size (train.py, test.py: the total over all ranks)"}),
    "device": (("--device",), {"default": "", "help": "'cpu', 'mps' (an Apple GPU), or a GPU '0'; train.py and "
                               "test.py also take GPUs '0,1': one process per GPU, started by torch's elastic "
                               "launcher (under torchrun or srun: one per local rank); '' = GPU 0 when CUDA is "
                               "available, else the CPU"}),
    "nproc_per_node": (("--nproc-per-node", "--nproc_per_node"), {
        "dest": "nproc_per_node", "type": int, "default": None,
        "help": "start this many processes on this machine with torch's elastic launcher, as torchrun "
        "--nproc_per_node does (--device cpu: gloo on the CPU); default: one per GPU of --device, else 1; "
        "ignored under torchrun and srun, which started the processes"}),
    "workers": (("--workers",), {"type": int, "default": 8, "help": "max dataloader workers per rank"}),
    "single_cls": (("--single-cls",), {"action": "store_true", "help": "treat every class as one"}),
    "conf_thres": (("--conf-thres", "--conf"), {"type": float, "default": 0.001, "help": "confidence threshold"}),
    "iou_thres": (("--iou-thres", "--iou"), {"type": float, "default": 0.6, "help": "NMS IoU threshold"}),
    "max_det": (("--max-det",), {"type": int, "default": 300, "help": "maximum detections per image"}),
    "agnostic_nms": (("--agnostic-nms",), {"action": "store_true", "help": "class-agnostic NMS"}),
    "half": (("--half",), {"action": "store_true", "help": "FP16 inference (CUDA only)"}),
    "save_txt": (("--save-txt",), {"action": "store_true", "help": "save results to labels/*.txt"}),
    "save_conf": (("--save-conf",), {"action": "store_true", "help": "save confidences in --save-txt labels"}),
    "project": (("--project",), {"default": None, "help": "save to project/name (default: runs/<script's task>)"}),
    "name": (("--name",), {"default": "exp", "help": "save to project/name"}),
    "exist_ok": (("--exist-ok",), {"action": "store_true",
                                   "help": "write into an existing project/name instead of a new numbered folder, "
                                   "only if a run of this project made it (a .yolo-run marker in it)"}),
    "backend": (("--backend",), {"default": "auto", "choices": ["auto", "nccl", "gloo"],
                                 "help": "torch.distributed backend (auto: nccl on CUDA, else gloo)"}),
    "ddp_timeout": (("--ddp-timeout",), {"type": float, "default": 600.0,
                                         "help": "seconds before a collective fails"}),
    "ddp_long_timeout": (("--ddp-long-timeout",), {"type": float, "default": 1800.0,
                                                   "help": "seconds for waits on work one rank does for all (label "
                                                   "cache, downloads, synthetic data) and for the gathering of "
                                                   "validation results"}),
    "local_rank": (("--local_rank", "--local-rank"), {"dest": "local_rank", "type": int, "default": -1,
                                                      "help": argparse.SUPPRESS}),  # torch.distributed.launch's
    "augment": (("--augment",), {"action": "store_true", "help": "test-time augmentation: scales 1, 0.83 "
                                 "(flipped left-right), 0.67, merged before NMS"}),
}
DISTRIBUTED = ("backend", "ddp_timeout", "ddp_long_timeout", "local_rank", "nproc_per_node")

# Flags of YOLOv5 v7.0's detect.py, val.py and export.py that do not apply here. The parser accepts them (hidden
# from --help) so that a reference command line gets one line saying what to use instead, not an argparse error.
_TF_ONLY = "applies to YOLOv5's TensorFlow/CoreML exports, which this export.py does not write (formats: " \
           "torchscript, onnx, openvino); drop it"
REFUSED: dict[str, tuple[tuple[str, ...], dict[str, Any], str]] = {
    "dnn": (("--dnn",), {"action": "store_true"}, "OpenCV DNN is not used here: .onnx weights run with onnxruntime "
            "(and OpenVINO folders with OpenVINO); drop --dnn"),
    "update": (("--update",), {"action": "store_true"}, "not needed: release files are converted when they are "
               "read, and checkpoints of this project load as they are; drop --update"),
    "data": (("--data",), {"default": None}, "class names come from the weights (every format carries them); "
             "drop --data"),
    "inplace": (("--inplace",), {"action": "store_true"}, "not needed: the Detect head decodes boxes the same way "
                "in every export; drop --inplace"),
    "optimize": (("--optimize",), {"action": "store_true"}, "TorchScript for PyTorch Mobile is not written here; "
                 "for CPU deployment use --include onnx or openvino"),
    "keras": (("--keras",), {"action": "store_true"}, _TF_ONLY),
    "int8": (("--int8",), {"action": "store_true"}, _TF_ONLY),
    "workspace": (("--workspace",), {"default": None}, "applies to TensorRT engines, which this export.py does not "
                  "write; export --include onnx and build the engine with trtexec"),
    "nms": (("--nms",), {"action": "store_true"}, _TF_ONLY + " (exports return the decoded boxes; NMS runs after)"),
    "agnostic_nms": (("--agnostic-nms",), {"action": "store_true"}, _TF_ONLY),
    "topk_per_class": (("--topk-per-class",), {"default": None}, _TF_ONLY),
    "topk_all": (("--topk-all",), {"default": None}, _TF_ONLY),
    "iou_thres": (("--iou-thres", "--iou"), {"default": None}, _TF_ONLY),
    "conf_thres": (("--conf-thres", "--conf"), {"default": None}, _TF_ONLY),
}
REFUSED_PREFIX = "refused_"  # their dest: print_options leaves them out


class CliError(UserError, ValueError):
    """A flag value that cannot work here; the message names the flag and what to use instead."""


class Parser(argparse.ArgumentParser):
    """The scripts' parser: argparse without abbreviations (aliases are explicit), ultralytics' ``key=value`` words
    read through utils/compat/ultralytics.py, and every error as one line (``train.py: error: ...``, exit code 2) that
    names the nearest valid flags, never the usage text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        words = sys.argv[1:] if args is None else list(args)
        try:
            words = translate(words, self)
        except SpellingError as e:
            self.error(str(e))
        return super().parse_known_args(words, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}{self._hint(message)}\n")

    def _hint(self, message: str) -> str:
        """'; did you mean --epochs?' for each unknown flag of an 'unrecognized arguments' message."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        unknown = [w.split("=")[0] for w in message.split(":", 1)[1].split() if w.startswith("-")]
        hints = [f"{w} -> {', '.join(close)}" for w in unknown if (close := nearest(w, flags_of(self)))]
        if hints:
            return f"; did you mean {'; '.join(hints)}?" if len(hints) > 1 else \
                f"; did you mean {hints[0].split(' -> ')[1]}?"
        return f"; see {self.prog} --help"


def add_flags(parser: argparse.ArgumentParser, *names: str, nargs: dict[str, str] | None = None,
              **defaults: Any) -> None:
    """Add the shared flags ``names`` to ``parser``, with ``defaults`` replacing their common defaults and
    ``nargs`` their number of values (``nargs={"weights": "+"}`` accepts YOLOv5's several weights)."""
    for name in names:
        strings, kwargs = FLAGS[name]
        kwargs = {**kwargs, **({"default": defaults[name]} if name in defaults else {}),
                  **({"nargs": nargs[name]} if nargs and name in nargs else {})}
        parser.add_argument(*strings, **kwargs)


def add_refused_flags(parser: argparse.ArgumentParser, *names: str) -> None:
    """Accept the reference-only flags ``names`` (hidden from --help); :func:`check_refused_flags` refuses them."""
    for name in names:
        strings, kwargs, _ = REFUSED[name]
        parser.add_argument(*strings, dest=REFUSED_PREFIX + name, help=argparse.SUPPRESS, **kwargs)


def check_refused_flags(opt: argparse.Namespace) -> None:
    """CliError naming the first reference-only flag that was given, and what to use instead."""
    for name, (strings, _, message) in REFUSED.items():
        if getattr(opt, REFUSED_PREFIX + name, None) not in (None, False):
            raise CliError(f"{strings[0]}: {message}")


def visible_options(opt: argparse.Namespace) -> dict[str, Any]:
    """The options to print: the hidden reference-only flags left out."""
    return {k: v for k, v in vars(opt).items() if not k.startswith(REFUSED_PREFIX)}


def collapse_weights(weights: str | list[str]) -> str | list[str]:
    """``--weights a.pt`` (nargs '+') as the plain string; several values stay a list, for the script to judge."""
    return weights[0] if isinstance(weights, list) and len(weights) == 1 else weights


def one_weights(weights: str | list[str]) -> str:
    """The one --weights value detect.py and test.py run; several (a YOLOv5 model ensemble) are refused."""
    if isinstance(weights, list):
        raise CliError(f"--weights {' '.join(weights)}: model ensembles are not supported here; "
                       "pass one weights file (run once per model)")
    return weights


def project_dir(opt: argparse.Namespace, task: str) -> str:
    """``--project``, else runs/<task> in the project folder."""
    return opt.project or str(paths.ROOT / "runs" / task)


def square_size(parser: argparse.ArgumentParser, opt: argparse.Namespace) -> argparse.Namespace:
    """For scripts that work on square images (train.py, test.py): one --img-size value, as an int (None stays
    None: the size the weights were trained at)."""
    if opt.img_size is None:
        return opt
    if len(opt.img_size) != 1:
        parser.error(f"--img-size takes one value here (square images), got {' '.join(map(str, opt.img_size))}")
    opt.img_size = int(opt.img_size[0])
    return opt


def run_main(main: Callable[[Any], Any], opt: Any, script: str) -> int:
    """Call ``main(opt)``; a UserError prints ``script: error: message`` on stderr and returns 2; a signal that
    stopped training prints its one line and returns its exit code.

    Under torchrun every rank usually meets the same bad input, so only rank 0 prints it; the other ranks exit
    with the same code. A user error's line is also this process's error record for torchrun (record_error_line),
    so torchrun's failure summary, which it prints after the processes end, names it as the root cause.
    """
    rank0 = dist.launch_env().rank == 0
    try:
        main(opt)
    except UserError as e:
        return _said(f"{script}: error: {e}", rank0, EXIT_USER_ERROR, record=True)
    except StopRequested as e:
        return _said(f"{script}: {e.message}", rank0, e.exit_code)
    except KeyboardInterrupt:
        return _said(f"{script}: interrupted", True, EXIT_INTERRUPTED)
    except PeerLost as e:  # a collective failed because a peer is gone: one line from one rank, not tracebacks
        return _said(f"{script}: error: {e.line}", bool(e.line), EXIT_PEER_LOST)
    return 0


def run_script(main: Callable[[Any], Any], opt: Any, script: str) -> int:
    """run_main in a script's own process (its ``__main__``), which ends after it: what its imports made, and at the
    end every object, are left out of the garbage collector's passes (utils.device.freeze_long_lived). A process
    that goes on afterwards (tests, the Python API) calls run_main."""
    freeze_long_lived()
    try:
        return run_main(main, opt, script)
    finally:
        freeze_long_lived()


def _said(line: str, speak: bool, code: int, record: bool = False) -> int:
    """Print ``line`` on stderr when ``speak``, and with ``record`` make it this rank's error record for torchrun,
    whichever rank torchrun names as the root cause (a user error, the same on every rank; a lost peer's line must
    not hide the failure of the rank that left); return ``code``."""
    if speak:
        print(line, file=sys.stderr, flush=True)
    if record:
        record_error_line(line)
    return code


class PeerLost(Exception):
    """A collective failed because another rank is gone; ``line`` says which (empty on the ranks that stay
    quiet, so the job prints it once)."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


@contextlib.contextmanager
def distributed_session(opt: argparse.Namespace, script: str = "train") -> Iterator[torch.device]:
    """Join the process group (a no-op for one process), set up rank-0 logging and per-rank threads, and
    always tear the group down on leaving, outside the work itself, so every exit path ends every rank.

    Yields this process's device. All ranks must enter it.
    """
    device = dist.init_distributed(opt.device, opt.backend, opt.ddp_timeout, opt.ddp_long_timeout, opt.local_rank,
                                   script=script)
    setup_logging(dist.get_rank())
    env = dist.launch_env()
    if (idle := idle_gpus_warning(opt.device, env.local_world_size, env.local_rank)) is not None:
        LOGGER.warning(idle)  # never one GPU in silence
    dist.configure_threads()
    clean_exit = False
    try:
        yield device
        clean_exit = True
    except UserError:  # rank 0 says it after the teardown: a launcher's SIGTERM (another rank left first) must wait
        if dist.get_rank() == 0 and dist.get_world_size() > 1:
            ignore_launcher_stop()
        raise
    except RuntimeError as e:
        if (lost := peer_lost(e)) is None:
            raise
        raise lost from None
    finally:
        dist.cleanup(clean_exit=clean_exit)


def peer_lost(error: BaseException) -> PeerLost | None:
    """PeerLost for a collective that failed because a peer is gone (None for any other error), its line read
    while the watch still has the other ranks' marks. From then on this rank ignores the launcher's SIGTERM, so
    its teardown ends with that line rather than with the signal (ignore_launcher_stop). Call it where the error
    is first caught, before any teardown."""
    if not dist.lost_a_peer(error):
        return None
    ignore_launcher_stop()  # first: the launcher's SIGTERM may come while the line reads the other ranks' marks
    return PeerLost(dist.peer_failure_line(error) or "")


def flag_table(parser: argparse.ArgumentParser) -> str:
    """A markdown table of a parser's flags (flag, default, meaning), as docs/flags.md shows them."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        if isinstance(action, argparse._StoreTrueAction) or action.default is False:
            default = "off"
        elif action.default is None or action.default == []:
            default = "none"
        elif isinstance(action.default, list):
            default = " ".join(map(str, action.default))
        else:
            default = str(action.default).replace(str(ROOT) + "/", "") or "''"
        meaning = (action.help or "").replace("%%", "%").replace("|", "\\|")
        if action.choices:
            meaning += "; one of " + ", ".join(f"`{c}`" if c else "`''`" for c in action.choices)
        names = ", ".join(f"`{s}`" for s in action.option_strings)
        rows.append(f"| {names} | `{default}` | {meaning} |")
    return "\n".join(rows)
