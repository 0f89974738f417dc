"""Release-name resolution and downloads: from a loopback HTTP server, atomic under kills, one-line errors offline."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from tests.helpers import free_port
from utils.distributed import comm as dist
from utils.weights.downloads import (
    DEFAULT_URL,
    DownloadError,
    attempt_download,
    attempt_download_once_per_node,
    is_release_name,
    release_url,
    resolve_weights,
    weights_dir,
)

ROOT = Path(__file__).resolve().parents[3]


def zip_payload(n: int = 200_000) -> bytes:
    """A real torch zip file of about 4n/5 bytes (the downloader checks the zip structure)."""
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(n // 5, dtype=torch.float32)}, buffer)
    return buffer.getvalue()


class Routes:
    """What the loopback server sends for each file name: a queue of modes (default "ok"), and the hits."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.plan: dict[str, list[str]] = {}
        self.hits: Counter[str] = Counter()
        self.stalled = threading.Event()  # set when a "stall" response has sent its first bytes
        self.release = threading.Event()  # ends "stall" responses


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        routes: Routes = self.server.routes  # type: ignore[attr-defined]
        name = self.path.rsplit("/", 1)[-1]
        routes.hits[name] += 1
        body = routes.files.get(name)
        mode = routes.plan[name].pop(0) if routes.plan.get(name) else "ok"
        if body is None or mode == "404":
            self.send_error(404, "Not Found")
            return
        if mode == "html":
            body = b"<html>rate limited</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "truncate":  # promise everything, send a third, hang up
            self.wfile.write(body[: len(body) // 3])
            self.close_connection = True
        elif mode == "stall":  # send a little, then wait (a download in progress, to be killed)
            self.wfile.write(body[:1000])
            self.wfile.flush()
            routes.stalled.set()
            routes.release.wait(60)
            self.close_connection = True
        else:
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[str, Routes]]:
    """A loopback server at YOLO_WEIGHTS_URL, with YOLO_WEIGHTS_DIR in tmp_path/cache."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.routes = Routes()  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/releases/v7.0"
    monkeypatch.setenv("YOLO_WEIGHTS_URL", base)
    monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
    yield base, httpd.routes  # type: ignore[attr-defined]
    httpd.routes.release.set()  # type: ignore[attr-defined]
    httpd.shutdown()
    httpd.server_close()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*part*")) if folder.exists() else []


# ------------------------------------------------------------------------------------------ settings
def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("YOLO_WEIGHTS_DIR", raising=False)
    monkeypatch.delenv("YOLO_WEIGHTS_URL", raising=False)
    assert weights_dir() == Path.home() / ".cache" / "yolo-ddp" / "weights"
    assert release_url("yolov5s.pt") == "https://github.com/ultralytics/yolov5/releases/download/v7.0/yolov5s.pt"
    assert DEFAULT_URL.endswith("/v7.0")
    monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path))
    monkeypatch.setenv("YOLO_WEIGHTS_URL", "http://mirror.local/weights/")
    assert weights_dir() == tmp_path
    assert release_url("yolov5x6.pt") == "http://mirror.local/weights/yolov5x6.pt"


def test_resolution_without_download(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
    mine = tmp_path / "mine.pt"
    mine.write_bytes(b"x")
    assert attempt_download(mine) == mine and attempt_download(str(mine)) == mine  # existing: unchanged
    assert resolve_weights("yolov5n6.pt") == tmp_path / "cache" / "yolov5n6.pt"
    assert resolve_weights(tmp_path / "sub" / "yolov5l.pt") == tmp_path / "sub" / "yolov5l.pt"
    with pytest.raises(DownloadError) as info:
        attempt_download(tmp_path / "best.pt")
    message = str(info.value)
    assert "\n" not in message and "best.pt not found" in message and "yolov5s.pt" in message


# ------------------------------------------------------------------------------------------ downloads
def test_download_by_name_with_progress_bar(server: tuple[str, Routes], tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    base, routes = server
    routes.files["yolov5s.pt"] = payload = zip_payload()
    path = attempt_download("yolov5s.pt")
    assert path == tmp_path / "cache" / "yolov5s.pt" and path.read_bytes() == payload
    err = capsys.readouterr().err
    assert "yolov5s.pt" in err and "100%" in err  # tqdm's bar on stderr
    assert attempt_download("yolov5s.pt") == path and routes.hits["yolov5s.pt"] == 1  # cached: no second request
    assert leftovers(path.parent) == []


def test_download_into_a_given_folder(server: tuple[str, Routes], tmp_path: Path) -> None:
    routes = server[1]
    routes.files["yolov5n.pt"] = payload = zip_payload(5000)
    path = attempt_download(tmp_path / "weights" / "yolov5n.pt", progress=False)
    assert path == tmp_path / "weights" / "yolov5n.pt" and path.read_bytes() == payload


def test_truncated_download_leaves_no_file_and_a_retry_succeeds(server: tuple[str, Routes], tmp_path: Path) -> None:
    base, routes = server
    routes.files["yolov5m.pt"] = payload = zip_payload()
    routes.plan["yolov5m.pt"] = ["truncate"]
    final = tmp_path / "cache" / "yolov5m.pt"
    with pytest.raises(DownloadError) as info:
        attempt_download("yolov5m.pt", attempts=1, progress=False)
    message = str(info.value)
    assert "\n" not in message and f"from {base}/yolov5m.pt" in message and f"put the file at {final}" in message
    assert f"closed after {len(payload) // 3} of {len(payload)} bytes" in message
    assert not final.exists() and leftovers(final.parent) == []
    assert attempt_download("yolov5m.pt", progress=False).read_bytes() == payload  # the retry
    assert routes.hits["yolov5m.pt"] == 2


def test_retries_within_one_call(server: tuple[str, Routes], yolo_log: list[str]) -> None:
    routes = server[1]
    routes.files["yolov5l.pt"] = payload = zip_payload(5000)
    routes.plan["yolov5l.pt"] = ["truncate", "ok"]
    assert attempt_download("yolov5l.pt", attempts=2, progress=False).read_bytes() == payload
    assert routes.hits["yolov5l.pt"] == 2
    assert any("retrying" in line and "yolov5l.pt" in line for line in yolo_log)


@pytest.mark.parametrize("mode, reason", [("404", "HTTP 404"), ("html", "not a PyTorch zip file")])
def test_bad_answers_give_one_line(server: tuple[str, Routes], tmp_path: Path, mode: str, reason: str) -> None:
    routes = server[1]
    routes.files["yolov5x.pt"] = zip_payload(5000)
    routes.plan["yolov5x.pt"] = [mode]
    with pytest.raises(DownloadError) as info:
        attempt_download("yolov5x.pt", attempts=1, progress=False)
    assert "\n" not in str(info.value) and reason in str(info.value)
    assert not (tmp_path / "cache" / "yolov5x.pt").exists() and leftovers(tmp_path / "cache") == []


def test_offline_error_names_the_url_and_where_to_put_the_file(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v7.0"  # nothing listens there
    monkeypatch.setenv("YOLO_WEIGHTS_URL", url)
    monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path))
    with pytest.raises(DownloadError) as info:
        attempt_download("yolov5s.pt", attempts=1, progress=False)
    message = str(info.value)
    assert message.startswith(f"could not download yolov5s.pt from {url}/yolov5s.pt: ")
    assert "refused" in message.lower() and message.endswith(f"; put the file at {tmp_path / 'yolov5s.pt'}")
    assert "\n" not in message and not (tmp_path / "yolov5s.pt").exists()


def test_download_killed_midway_leaves_no_file_and_the_next_call_succeeds(server: tuple[str, Routes],
                                                                          tmp_path: Path) -> None:
    routes = server[1]
    routes.files["yolov5s6.pt"] = payload = zip_payload()
    routes.plan["yolov5s6.pt"] = ["stall"]
    cache = tmp_path / "cache"
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from utils.weights.downloads import attempt_download; "
            "attempt_download('yolov5s6.pt', attempts=1)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (routes.stalled.is_set() and list(cache.glob(".yolov5s6.pt.part*"))):  # mid-transfer
            assert child.poll() is None and time.monotonic() < deadline, "the child never started downloading"
            time.sleep(0.05)
        time.sleep(0.2)  # let it take in the first bytes
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert not (cache / "yolov5s6.pt").exists()
    assert leftovers(cache) == [f".yolov5s6.pt.part{child.pid}"]  # the killed writer's temp, never loaded
    routes.release.set()
    assert attempt_download("yolov5s6.pt", progress=False).read_bytes() == payload
    assert leftovers(cache) == []  # the stale temp of the dead process is cleaned up


def test_once_per_node_outside_torchrun(server: tuple[str, Routes], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    routes = server[1]
    routes.files["yolov5n.pt"] = payload = zip_payload(5000)
    monkeypatch.setattr(dist, "is_local_main_process", lambda: False)  # as a non-zero local rank
    with pytest.raises(DownloadError, match="local rank 0 could not download it"):
        attempt_download_once_per_node("yolov5n.pt")
    assert routes.hits["yolov5n.pt"] == 0  # the other ranks never download
    monkeypatch.undo()
    monkeypatch.setenv("YOLO_WEIGHTS_URL", server[0])
    monkeypatch.setenv("YOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
    assert attempt_download_once_per_node("yolov5n.pt", progress=False).read_bytes() == payload


class TwoRanksOneNode:
    """Stands in for comm in two threads: zero_first(local=True) lets local rank 0 run its block first."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.barrier = threading.Barrier(2, timeout=30)

    def is_local_main_process(self) -> bool:
        return self.local.rank == 0

    @contextlib.contextmanager
    def zero_first(self, local: bool = True) -> Iterator[None]:
        assert local, "release weights live on each machine's disk: one download per node"
        if self.local.rank != 0:
            self.barrier.wait()
        try:
            yield
        finally:
            if self.local.rank == 0:
                self.barrier.wait()


@pytest.mark.parametrize("served", [True, False])
def test_two_ranks_of_a_node_download_once(server: tuple[str, Routes], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, served: bool) -> None:
    routes = server[1]
    if served:
        routes.files["yolov5m6.pt"] = payload = zip_payload()
    fake = TwoRanksOneNode()
    monkeypatch.setattr(dist, "zero_first", fake.zero_first)
    monkeypatch.setattr(dist, "is_local_main_process", fake.is_local_main_process)
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        fake.local.rank = r
        try:
            results[r] = attempt_download_once_per_node("yolov5m6.pt", attempts=1, progress=False)
        except DownloadError as e:
            results[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]  # rank 1 asks first, and waits
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert routes.hits["yolov5m6.pt"] == 1  # one request for the node, by local rank 0
    if served:
        assert results[0] == results[1] == tmp_path / "cache" / "yolov5m6.pt"
        assert results[0].read_bytes() == payload
    else:  # every rank fails with one line; only rank 0 asked the server
        assert "HTTP 404" in str(results[0]) and "local rank 0 could not download it" in str(results[1])


def test_ultralytics_names_are_release_names_with_their_own_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("YOLO_WEIGHTS_URL", raising=False)
    assert release_url("yolo11n.pt") == "https://github.com/ultralytics/assets/releases/download/v8.3.0/yolo11n.pt"
    assert release_url("yolov8x.pt") == "https://github.com/ultralytics/assets/releases/download/v8.3.0/yolov8x.pt"
    assert release_url("yolo26s.pt") == "https://github.com/ultralytics/assets/releases/download/v8.4.0/yolo26s.pt"
    assert all(is_release_name(f"{f}{s}.pt") for f in ("yolov8", "yolo11", "yolo26") for s in "nsmlx")
    assert release_url("yolo11n-seg.pt").endswith("/download/v8.3.0/yolo11n-seg.pt")
    assert release_url("yolov5s-seg.pt") == "https://github.com/ultralytics/yolov5/releases/download/v7.0/yolov5s-seg.pt"
    assert release_url("yolo26n-seg.pt").endswith("/download/v8.4.0/yolo26n-seg.pt")
    assert release_url("yolov8m-pose.pt").endswith("/download/v8.3.0/yolov8m-pose.pt")
    assert release_url("yolo26x-pose.pt").endswith("/download/v8.4.0/yolo26x-pose.pt")
    assert not is_release_name("yolo11q.pt") and not is_release_name("yolov5n-pose.pt")
    monkeypatch.setenv("YOLO_WEIGHTS_URL", "http://mirror.local/w/")
    assert release_url("yolo26n.pt") == "http://mirror.local/w/yolo26n.pt"
    with pytest.raises(DownloadError, match=r"not an official release name \(yolov5n.pt, .*yolo26x-pose.pt\)"):
        resolve_weights("yolo12n.pt")


def test_an_ultralytics_release_downloaded_by_name_loads_safely(server: tuple[str, Routes], tmp_path: Path) -> None:
    """``--weights yolo26n.pt``: fetched by name (from the loopback mirror), then read by the restricted reader."""
    from utils.weights.checkpoint import load_checkpoint

    routes = server[1]
    routes.files["yolo26n.pt"] = (ROOT / "tests" / "fixtures" / "ultralytics" / "yolo26n.pt").read_bytes()
    path = attempt_download("yolo26n.pt", progress=False)
    assert path == tmp_path / "cache" / "yolo26n.pt" and routes.hits["yolo26n.pt"] == 1
    ckpt = load_checkpoint(path)
    assert ckpt["source"] == "ultralytics-release" and ckpt["model_yaml"]["yaml_file"] == "yolo26n.yaml"
