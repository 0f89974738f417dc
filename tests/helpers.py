"""Helpers the tests share: launching real processes (python or torchrun) bounded in time, reading their
output, small data sets written into a tmp folder."""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib.util
import io
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 180  # bound for one launched job on a loaded 2-core machine; a hang fails the test
GOOD_LABEL = "0 0.5 0.5 0.25 0.25\n"


@contextlib.contextmanager
def one_thread_and_logger_kept() -> Iterator[None]:
    """One torch thread inside, and the thread count and the logger's handlers and level (which train.main()
    replaces) restored on leaving."""
    from utils.log import LOGGER

    threads, handlers, level = torch.get_num_threads(), list(LOGGER.handlers), LOGGER.level
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        LOGGER.handlers[:], LOGGER.level = handlers, level


def load_script(name: str):
    """A script of the project (train, test, ...) loaded by its path, never by ``import test`` (which may find
    Python's own test package). test.py is registered under the name val.py uses, so both share one module."""
    module_name = "yolo_test_script" if name == "test" else name
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ network
class QuietHandler(SimpleHTTPRequestHandler):
    """Serves a folder without logging each request."""

    def log_message(self, *args: object) -> None:
        pass


class RangeHandler(QuietHandler):
    """Also answers ``Range: bytes=a-b`` requests (206 with that part), as object stores and web servers do."""

    def send_head(self):  # noqa: ANN201 (the base class's contract: a file object or None)
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if wanted is None or not path.is_file():
            return super().send_head()
        data = path.read_bytes()
        start, end = int(wanted[1]), min(int(wanted[2] or len(data) - 1), len(data) - 1)
        self.send_response(206)
        for name, value in (("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes"),
                            ("Content-Range", f"bytes {start}-{end}/{len(data)}"),
                            ("Content-Length", str(end - start + 1))):
            self.send_header(name, value)
        self.end_headers()
        return io.BytesIO(data[start:end + 1])


@contextlib.contextmanager
def serve_folder(folder: Path, handler: type[SimpleHTTPRequestHandler] = QuietHandler) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 (a free port) serving ``folder`` from a thread; yields its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """moto's S3-compatible server on 127.0.0.1 (a free port) from a thread; yields the environment a client needs
    to reach it (endpoint and test credentials, as the usual AWS variables)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    finally:
        server.stop()


@contextlib.contextmanager
def gcs_server() -> Iterator[dict[str, str]]:
    """gcp-storage-emulator's GCS-compatible server on 127.0.0.1 (a free port, in memory) from a thread; yields the
    environment a client needs to reach it: ``STORAGE_EMULATOR_HOST`` (gcsfs sends every request there, the gRPC
    bucket-layout probe included) and ``NO_GCE_CHECK`` (no probe of the cloud metadata address while gcsfs looks for
    credentials; it falls back to anonymous ones, which the emulator accepts)."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "NO_GCE_CHECK": "true"}
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------ processes
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses right now, taken below the kernel's ephemeral range: a port from
    that range can become the source port of any outgoing connection (gloo's own, a test's HTTP client) between
    this check and the bind of the process that listens on it (EADDRINUSE in a full parallel run)."""
    low, draw = ephemeral_ports()[0], random.SystemRandom()  # not the seeded generator training code resets
    for _ in range(200):
        port = draw.randrange(max(low - 16384, 1024), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below the range taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's ip_local_port_range; its default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


@contextlib.contextmanager
def gloo_rank(rank: int, port: int, world: int = 2) -> Iterator[None]:
    """In a process a test spawned: rank ``rank`` of ``world`` on one machine (the launcher's variables, loopback),
    one torch thread, the gloo group joined through utils.distributed.comm inside and torn down on leaving."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from utils.distributed import comm

    comm.init_distributed("cpu", "gloo", 120, 120)
    try:
        yield
    finally:
        comm.cleanup(clean_exit=True)


def job_env(**extra: str) -> dict[str, str]:
    """The environment of a launched job: unbuffered, no colour, one thread, no inherited launcher variables."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "OMP_NUM_THREADS": "1", **extra}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name not in extra:
            env.pop(name, None)
    return env


def torchrun_cmd(nproc: int, *args: str, restarts: int = 0, port: int | None = None) -> list[str]:
    """``python -m torch.distributed.run`` with ``nproc`` local processes on 127.0.0.1 and a free port."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--max-restarts",
            str(restarts), "--master-addr", "127.0.0.1", "--master-port", str(port or free_port()), *args]


def start(cmd: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session (so a hang can be killed with all its children); output merged."""
    return subprocess.Popen(cmd, cwd=cwd, env=env or job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout_s: float = JOB_TIMEOUT_S) -> tuple[int, str]:
    """(exit code, output); kills the whole session and fails the test when it runs past ``timeout_s``."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(map(str, proc.args[:6]))} ... still running after {timeout_s} s:\n{out[-3000:]}")
    return proc.returncode, out


def run_job(cmd: list[str], timeout_s: float = JOB_TIMEOUT_S, cwd: Path = ROOT,
            env: dict[str, str] | None = None) -> tuple[int, str]:
    """Start ``cmd`` and wait for it (bounded): (exit code, merged output)."""
    return finish(start(cmd, cwd, env), timeout_s)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, timeout_s: float = JOB_TIMEOUT_S) -> None:
    """Poll ``condition()`` until true; fail (killing ``proc``) if the process ends or time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"condition not reached (exit {proc.returncode}):\n{out[-3000:]}")
        time.sleep(0.05)


class OutputPump:
    """Reads a started process's output on a thread, timestamping every line (``lines``: (time, text))."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def text(self) -> str:
        return "\n".join(text for _, text in self.lines)

    def wait(self, timeout_s: float = JOB_TIMEOUT_S) -> tuple[int, float]:
        """(exit code, time it ended); kills the session and fails the test on a hang."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.thread.join(timeout=10)
            pytest.fail(f"job did not end within {timeout_s} s:\n{self.text[-3000:]}")
        ended = time.monotonic()
        self.thread.join(timeout=10)
        return code, ended


def events_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def csv_epochs(run_dir: Path) -> list[str]:
    """The epoch column of a run's results.csv."""
    return [line.split(",")[0] for line in (run_dir / "results.csv").read_text().strip().splitlines()[1:]]


def results_rows(run_dir: Path) -> list[dict[str, str]]:
    """A run's results.csv, one dict per epoch."""
    with open(run_dir / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def weights_diff(a: Path, b: Path) -> float:
    """The largest difference between two checkpoints' EMA and raw weights."""
    from utils.weights.checkpoint import load_checkpoint

    first, second = load_checkpoint(a), load_checkpoint(b)
    pairs = [(first["model"], second["model"]),
             (first["train_state"]["states"]["model"], second["train_state"]["states"]["model"])]
    return max((x[k].float() - y[k].float()).abs().max().item() for x, y in pairs for k in x)


def built_on_meta(name: str, nc: int | None = None) -> nn.Sequential:
    """The layers ``name``.yaml builds (``nc`` classes where given), on the meta device: shapes and parameter
    counts without memory or time."""
    from models.yolo import load_model_config, parse_model

    cfg, source = load_model_config(f"{name}.yaml")
    if nc is not None:
        cfg["nc"] = nc
    with torch.device("meta"):
        layers, _, _ = parse_model(cfg, 3, source)
    return layers


def assert_stepped_as_one(models: Iterable[str], step: Callable[[str, None], tuple], ranks: dict) -> None:
    """For each model, the gradients and logged loss terms the ranks gave (``ranks[name]``) are those one
    process's ``step(name, None)`` gives on the whole batch, within float summation order."""
    for name in models:
        grads, items = step(name, None)
        ddp_grads, ddp_items = ranks[name]
        scale = max(g.abs().max().item() for g in grads)
        worst = max((a - b).abs().max().item() for a, b in zip(grads, ddp_grads, strict=True))
        assert scale > 0 and worst <= 2e-5 * scale, f"{name}: gradients differ by {worst:.3g} (largest {scale:.3g})"
        torch.testing.assert_close(ddp_items, items, rtol=1e-5, atol=1e-6, msg=f"{name}: logged loss terms")


def train_args(data: Path, cfg: Path, project: Path, *extra: str, epochs: int = 3, plots: bool = False) -> list[str]:
    """train.py (path first) with the tiny model at 64 px, batch 8, CPU, no workers, no autoanchor, and no plots
    unless ``plots`` (they cost a process about 2 s; tests/test_train.py and test_ddp.py cover them)."""
    return [str(ROOT / "train.py"), "--data", str(data), "--cfg", str(cfg), "--weights", "", "--img-size", "64",
            "--batch-size", "8", "--epochs", str(epochs), "--workers", "0", "--device", "cpu", "--seed", "0",
            "--project", str(project), "--noautoanchor", *([] if plots else ["--noplots"]), *extra]


# --------------------------------------------------------------------------------------------- small data
def write_jpg(path: Path, h: int = 40, w: int = 48) -> None:
    cv2.imwrite(str(path), np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8))


def write_video(path: Path, frames: list[np.ndarray], fps: float = 10.0) -> Path:
    """An mp4 (mp4v) of BGR ``frames``, as cv2.VideoWriter writes it."""
    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    for frame in frames:
        writer.write(frame)
    writer.release()
    return path


def write_truncated_jpg(path: Path) -> None:
    write_jpg(path)
    path.write_bytes(path.read_bytes()[:-300])


def png_writer(channels: int, dtype: type = np.uint8) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        shape = (30, 36) if channels == 1 else (30, 36, channels)
        cv2.imwrite(str(path), (np.random.default_rng(1).random(shape) * np.iinfo(dtype).max).astype(dtype))
    return write


def victim_folder(parent: Path) -> tuple[Path, dict[str, bytes]]:
    """``parent/victim``: a user's folder holding what a run writes (results.csv, opt.yaml, weights/last.pt and
    best.pt), and its files' bytes by relative name."""
    victim = parent / "victim"
    (victim / "weights").mkdir(parents=True)
    files = {"results.csv": b"my results", "opt.yaml": b"mine: 1\n", "weights/last.pt": b"my weights",
             "weights/best.pt": b"my best"}
    for name, content in files.items():
        (victim / name).write_bytes(content)
    return victim, files


def make_set(root: Path, files: dict[str, tuple[Callable[[Path], None], str | None]]) -> Path:
    """images/train/<name> written by its writer, labels/train/<stem>.txt with the text (None: no file)."""
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for name, (writer, label) in files.items():
        writer(root / "images" / "train" / name)
        if label is not None:
            (root / "labels" / "train" / f"{Path(name).stem}.txt").write_text(label)
    return root / "images" / "train"


def make_shard_set(folder: Path, n_images: int = 16, per_shard: int = 4, val: str | None = None) -> Path:
    """The synthetic set's ``n_images`` training images (64-96 px) written as tar shards by ``python -m
    utils.data.convert --to shards`` into ``folder/data/shards``, and a data YAML naming them for train and for val
    (unless ``val`` names other shards)."""
    import yaml

    from utils.data.convert import main as convert_main
    from utils.data.synthetic import SYNTHETIC_NAMES, ensure_synthetic

    root = ensure_synthetic(folder / "synthetic", n_train=n_images, n_val=4, img_size=(64, 96), seed=0)
    assert convert_main(["--from", "yolo", "--to", "shards", "--images", str(root / "images" / "train"), "--names",
                         *SYNTHETIC_NAMES, "--out", str(folder / "data" / "shards"),
                         "--shard-samples", str(per_shard)]) == 0
    pattern = f"shards/train-{{000000..{-(-n_images // per_shard) - 1:06d}}}.tar"
    data = folder / "data" / "shards.yaml"
    data.write_text(yaml.safe_dump({"train": pattern, "val": val or pattern, "names": list(SYNTHETIC_NAMES)}))
    return data


# ------------------------------------------------------------------------------------------ oracle detector
ORACLE_CLASSES = 3  # the synthetic set's classes


def oracle_batch(imgs: torch.Tensor, targets: torch.Tensor, paths: tuple, nc: int = ORACLE_CLASSES) -> torch.Tensor:
    """Decoded outputs (b, n, 5 + nc) for one batch, random per image (seeded by its file name), not per order."""
    b, _, h, w = imgs.shape
    outputs = []
    for i in range(b):
        g = torch.Generator().manual_seed(zlib.crc32(Path(paths[i]).name.encode()))
        t = targets[targets[:, 0] == i]
        boxes = t[:, 2:6] * torch.tensor([w, h, w, h])  # (k, 4) cx, cy, w, h in batch pixels
        boxes = boxes + torch.randn(len(t), 4, generator=g) * boxes[:, 2:4].repeat(1, 2) * 0.08
        cls = t[:, 1].long()
        flip = torch.rand(len(t), generator=g) < 0.15
        cls = torch.where(flip, (cls + 1) % nc, cls)
        junk_xy = torch.rand(3, 2, generator=g) * torch.tensor([w, h])
        junk = torch.cat((junk_xy, torch.rand(3, 2, generator=g) * torch.tensor([w, h]) / 3 + 4), 1)
        boxes = torch.cat((boxes, junk))
        cls = torch.cat((cls, torch.randint(0, nc, (3,), generator=g)))
        obj = torch.rand(len(boxes), 1, generator=g) * 0.9 + 0.05
        scores = torch.full((len(boxes), nc), 1e-4).scatter_(1, cls[:, None], 1.0)
        outputs.append(torch.cat((boxes, obj, scores), 1))
    n = max(len(o) for o in outputs)
    padded = torch.zeros(b, n, 5 + nc)
    for i, o in enumerate(outputs):
        padded[i, :len(o)] = o
    return padded


class OracleModel(nn.Module):
    """Replays precomputed decoded outputs (YOLOv5's row layout, its ``contract``), one batch per call, in the
    loader's order."""

    def __init__(self, loader, nc: int = ORACLE_CLASSES) -> None:
        from utils.tasks.contract import OutputContract

        super().__init__()
        self.contract = OutputContract("xywh_obj_cls", nc)
        self.outputs = [oracle_batch(imgs, targets, paths) for imgs, targets, paths, _ in loader]
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.outputs[self.calls]
        assert out.shape[0] == x.shape[0]
        self.calls += 1
        return out


def bright_box_predict(images: torch.Tensor, strides: tuple[int, ...] = (8, 16, 32), num_anchors: int = 3,
                       nc: int = ORACLE_CLASSES) -> torch.Tensor:
    """A stand-in detector with the Detect head's output layout (b, sum(na * h/s * w/s), 5 + nc): at each level, the
    cell holding the centre of the bright region (mean > 0.6) predicts that region's box as class 0, with a
    confidence that peaks where the box is 8 strides wide, as a trained detector's levels prefer their sizes."""
    b, _, h, w = images.shape
    blocks = []
    for stride in strides:
        ny, nx = -(-h // stride), -(-w // stride)
        block = torch.zeros(b, num_anchors, ny, nx, 5 + nc)
        for i in range(b):
            ys, xs = torch.nonzero(images[i].float().mean(0) > 0.6, as_tuple=True)
            if not len(xs):
                continue
            x1, y1, x2, y2 = xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1
            cx, cy, bw, bh = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
            conf = 0.9 * float(np.exp(-abs(np.log2(max(bw, bh) / (8 * stride)))))
            cell = block[i, :, min(int(cy // stride), ny - 1), min(int(cx // stride), nx - 1)]
            cell[:, :5] = torch.tensor([cx, cy, bw, bh, conf])
            cell[:, 5] = 1.0
        blocks.append(block.view(b, -1, 5 + nc))
    return torch.cat(blocks, 1).to(images.device)


def box_masks_segmenter(weights: Path, folder: Path) -> Path:
    """``weights`` (the tiny segmenter) changed so that every detection's mask is its whole box: one prototype
    constant (SiLU(1)), every other 0, and each anchor's first coefficient 20, the rest 0; boxes made smaller
    (width and height biases -1), so that few of them reach the image's edges."""
    from utils.weights.checkpoint import load_checkpoint, model_from_checkpoint, new_checkpoint, save_checkpoint

    model = model_from_checkpoint(load_checkpoint(weights))
    head = model.head
    with torch.no_grad():
        head.proto.cv3.conv.weight.zero_()
        head.proto.cv3.bn.weight.zero_()
        head.proto.cv3.bn.bias.zero_()
        head.proto.cv3.bn.bias[0] = 1.0
        for conv in head.m:
            conv.weight.view(head.na, head.no, -1)[:, 5 + head.nc:] = 0
            bias = conv.bias.view(head.na, head.no)
            bias[:, 5 + head.nc:] = 0
            bias[:, 5 + head.nc] = 20.0
            bias[:, 2:4] -= 1.0
    folder.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(new_checkpoint(model), folder / "box-masks.pt")


def tracebacks(output: str) -> list[str]:
    """Every Python traceback in ``output`` (from 'Traceback' to the exception line)."""
    found, lines = [], output.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("Traceback (most recent call last)"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j] and not lines[j].startswith(" ")), i)
            found.append("\n".join(lines[i:end + 1]))
    return found


def our_tracebacks(output: str) -> list[str]:
    """Tracebacks that went through this project's code: torchrun's own (SignalException when it is signalled,
    ChildFailedError when a worker exits non-zero) pass only through torch."""
    return [tb for tb in tracebacks(output) if in_our_code(tb) or "[rank" in tb]


def in_our_code(text: str) -> bool:
    """Whether ``text`` holds a traceback frame in a file of this checkout (not merely a path that starts like it,
    such as a virtual environment beside the checkout)."""
    return f'File "{ROOT}{os.sep}' in text


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (children, their children, ...), read from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += parents.get(current, [])
    return tree


def alive(pids: list[int]) -> list[int]:
    """The processes of ``pids`` that still exist (zombies count as gone)."""
    living = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            living.append(pid)
    return living
