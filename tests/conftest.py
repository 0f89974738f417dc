"""Shared fixtures. Tests run on CPU with tiny models at 64 px."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.checkout_guard import added_files, loose_files

ROOT = Path(__file__).resolve().parents[1]
CHECKOUT_BEFORE = pytest.StashKey[set]()

os.environ.setdefault("NO_COLOR", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    session.stash[CHECKOUT_BEFORE] = loose_files(ROOT)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Whole multi-process modules (module-level ``ddp`` mark) run first, everything else in its own order: an xdist
    worker that starts a 30-120 s torchrun test near the end leaves the other idle (worksteal moves queued tests,
    not running ones). Modules stay whole, so their module-scoped fixtures are set up once."""
    def multi_process(item: pytest.Item) -> bool:
        marks = getattr(getattr(item, "module", None), "pytestmark", [])
        return any(mark.name == "ddp" for mark in (marks if isinstance(marks, list) else [marks]))

    items.sort(key=lambda item: not multi_process(item))  # stable


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when its tests left files in the checkout (they must write under their tmp folders)."""
    added = added_files(session.stash.get(CHECKOUT_BEFORE, None), loose_files(ROOT))
    if added:
        shown = ", ".join(added[:10]) + (f" and {len(added) - 10} more" if len(added) > 10 else "")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"\nERROR: the tests added {len(added)} files to the checkout: {shown}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _tiny_cfg() -> dict:
    """yolov5n's layout at 1/8 width: the same rows, strides and head, a few thousand parameters."""
    cfg = yaml.safe_load((ROOT / "models" / "yolov5n.yaml").read_text())
    cfg["width_multiple"] = 0.125
    cfg["nc"] = 3
    return cfg


@pytest.fixture
def tiny_cfg() -> dict:
    return copy.deepcopy(_tiny_cfg())


@pytest.fixture(scope="session")
def tiny_cfg_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model config written as a YAML file (for --cfg)."""
    path = tmp_path_factory.mktemp("cfg") / "yolov5-tiny.yaml"
    path.write_text(yaml.safe_dump(_tiny_cfg(), sort_keys=False))
    return path


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data YAML for a tiny synthetic set (24 train + 12 val images of 64-96 px, 3 classes), made once."""
    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    folder = tmp_path_factory.mktemp("tiny_dataset")
    root = ensure_synthetic(folder / "synthetic", n_train=24, n_val=12, img_size=(64, 96), seed=0)
    data = {"path": str(root), "train": "images/train", "val": "images/val", "nc": len(SYNTHETIC_NAMES),
            "names": list(SYNTHETIC_NAMES)}
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def yolo_log() -> Iterator[list[str]]:
    """Messages the 'yolo' logger emits at INFO and above during the test, whatever handlers exist."""
    import logging

    from utils.log import LOGGER

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    old_level = LOGGER.level
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    yield lines
    LOGGER.removeHandler(handler)
    LOGGER.setLevel(old_level)


@pytest.fixture(autouse=True)
def _fresh_yolo_logger() -> Iterator[None]:
    """Each test starts with the 'yolo' logger as imported (propagating, no handlers), so a script's
    setup_logging() in one test cannot hide log records from caplog in the next."""
    import logging

    from utils.log import LOGGER

    LOGGER.handlers.clear()
    LOGGER.propagate = True
    LOGGER.setLevel(logging.NOTSET)
    yield


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Pin torch to one intra-op thread for a module of tiny-tensor tests: faster and steadier on 2 shared cores.

    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_thread_and_clean_logger() -> Iterator[None]:
    """One torch thread (the 2-core CI machine is shared by parallel jobs; 2 threads then thrash), and the
    logger's handlers restored after train.main() replaced them. Modules that train in this process use it with
    ``pytestmark = pytest.mark.usefixtures("one_thread_and_clean_logger")``."""
    from tests.helpers import one_thread_and_logger_kept

    with one_thread_and_logger_kept():
        yield


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, one_thread_and_clean_logger: None) -> Iterator[Callable[..., int]]:
    """``run(args, *hooks)``: train.py's main in this process (one torch thread, the logger restored).

    OMP_NUM_THREADS=1 as a user would set it: without it each run measures its thread count, and sums over 1 or 2
    threads differ in their last bits, so a resumed run could not equal the whole one bit for bit."""
    import train
    from utils.cli import run_main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def run(args: list[str], *hooks: object) -> int:
        return run_main(lambda opt: train.main(opt, hooks), train.parse_opt(args[1:]), "train")

    return run


@pytest.fixture(scope="session")
def tiny_weights(tiny_cfg_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of the tiny model with seed-0 random weights and the synthetic class names."""
    import torch

    from models.yolo import Model
    from utils.data.synthetic import SYNTHETIC_NAMES
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = Model(tiny_cfg_file)
    model.names = list(SYNTHETIC_NAMES)
    return save_checkpoint(new_checkpoint(model), tmp_path_factory.mktemp("weights") / "best.pt")


@pytest.fixture
def release_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A loopback server offering the v7.0 release fixture (yolov5n, 80 classes, random weights) as ``yolov5n.pt``
    and ``yolov5s.pt``; YOLO_WEIGHTS_URL points at it and YOLO_WEIGHTS_DIR (yielded) into tmp_path."""
    from tests.helpers import serve_folder

    served = tmp_path / "served"
    served.mkdir()
    for name in ("yolov5n.pt", "yolov5s.pt"):
        shutil.copyfile(ROOT / "tests" / "fixtures" / "yolov5n-v7.0.pt", served / name)
    with serve_folder(served) as url:
        monkeypatch.setenv("YOLO_WEIGHTS_URL", url)
        monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
        yield tmp_path / "cache"


@pytest.fixture(scope="session")
def tiny_exports(tiny_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``tiny_weights`` exported by export.py (verified there against PyTorch): a static 64 px ONNX file, and a
    dynamic ONNX file and OpenVINO folder (when openvino is installed). Keys: pt, static_onnx, onnx[, openvino]."""
    import torch

    import export

    folder = tmp_path_factory.mktemp("exports")
    static, dynamic = folder / "static.pt", folder / "dynamic.pt"
    for path in (static, dynamic):
        shutil.copyfile(tiny_weights, path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster on the 2 shared cores
    try:
        export.main(export.parse_opt(["--weights", str(static), "--img-size", "64", "--include", "onnx"]))
        openvino = ["openvino"] if importlib.util.find_spec("openvino") else []  # requirements-dev.txt has it
        export.main(export.parse_opt(["--weights", str(dynamic), "--img-size", "64", "--include", "onnx", *openvino,
                                      "--dynamic"]))
    finally:
        torch.set_num_threads(threads)
    exports = {"pt": tiny_weights, "static_onnx": static.with_suffix(".onnx"), "onnx": dynamic.with_suffix(".onnx")}
    return {**exports, "openvino": folder / "dynamic_openvino_model"} if openvino else exports


def tiny_segmenter_cfg() -> dict:
    """yolov5n-seg's layout at 1/8 width (prototype width 32), 3 classes: the tiny model of the segmentation tests."""
    cfg = yaml.safe_load((ROOT / "models" / "yolov5n-seg.yaml").read_text())
    cfg["width_multiple"] = 0.125
    cfg["nc"] = 3
    return cfg


@pytest.fixture(scope="session")
def tiny_seg_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of the tiny segmenter with seed-0 random weights and the synthetic class names."""
    import torch

    from models.yolo import Model
    from utils.data.synthetic import SYNTHETIC_NAMES
    from utils.weights.checkpoint import new_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = Model(tiny_segmenter_cfg())
    model.names = list(SYNTHETIC_NAMES)
    return save_checkpoint(new_checkpoint(model), tmp_path_factory.mktemp("seg-weights") / "best.pt")
